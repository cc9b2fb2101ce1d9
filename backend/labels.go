package backend

// Label keys that every sandbox carries. Drivers store them where their runtime keeps
// labels (Docker and containerd container labels; a metadata file for local) and List
// filters on them. Nothing is ever stopped, adopted or removed unless its LabelOwner
// equals the caller's owner id.
const (
	// LabelOwner is the id of the berth installation (its state dir) that created the sandbox.
	LabelOwner = "berth.owner"
	// LabelSession is the session name for session-isolated sandboxes, or the rule's
	// shared name for shared ones.
	LabelSession = "berth.session"
	// LabelScope is the glob of the scope rule that decided the sandbox.
	LabelScope = "berth.scope"
	// LabelCreated is the creation time, RFC 3339 in UTC.
	LabelCreated = "berth.created"
	// LabelSpecHash is a hex sha256 of the sandbox spec, used to report drift.
	LabelSpecHash = "berth.spec-hash"
	// LabelPool marks a warm pool's member: its value is the member's id (16 hex
	// digits). A member carries no LabelSession: it is made before any session
	// claims it, and runtimes such as Docker cannot change a label later; the state
	// store records which session claimed it.
	LabelPool = "berth.pool"
	// LabelPrefix starts every berth label; user labels may not use it.
	LabelPrefix = "berth."
)

// MatchLabels reports whether have holds every key of want with the same value.
// An empty want matches everything.
func MatchLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}
