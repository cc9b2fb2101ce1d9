package conformance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// needStopStart is Case.Needs for cases that stop a sandbox and start it again.
func needStopStart(c backend.Capabilities) (bool, string) {
	if !c.StopStart {
		return false, "driver does not claim Capabilities.StopStart (a stopped sandbox keeps its filesystem and starts again on Create)"
	}
	return true, ""
}

func lifecycleCases() []Case {
	g := "lifecycle"
	return []Case{
		{Group: g, Name: "info-valid", Run: caseInfoValid},
		{Group: g, Name: "create-running-labels", Run: caseCreateRunningLabels},
		{Group: g, Name: "list-by-owner", Run: caseListByOwner},
		{Group: g, Name: "list-filter-excludes", Run: caseListFilterExcludes},
		{Group: g, Name: "list-long-odd-labels", Run: caseListLongOddLabels},
		{Group: g, Name: "stop-inspect-stopped", Requires: "Capabilities.StopStart", Needs: needStopStart, Run: caseStopInspectStopped},
		{Group: g, Name: "stop-create-adopts", Requires: "Capabilities.StopStart", Needs: needStopStart, Run: caseStopCreateAdopts},
		{Group: g, Name: "stop-ends-processes", Run: caseStopEndsProcesses},
		{Group: g, Name: "remove-not-found", Run: caseRemoveNotFound},
		{Group: g, Name: "stop-missing-ok", Run: caseStopMissing},
		{Group: g, Name: "remove-missing-ok", Run: caseRemoveMissing},
		{Group: g, Name: "inspect-missing-not-found", Run: caseInspectMissing},
		{Group: g, Name: "exec-missing-not-found", Run: caseExecMissing},
		{Group: g, Name: "create-other-owner-conflict", Run: caseOtherOwnerConflict},
		{Group: g, Name: "create-invalid-name", Run: caseCreateInvalidName},
		{Group: g, Name: "long-state-dir", Run: caseLongStateDir},
	}
}

func (h *Harness) ctx(t T) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), callTimeout)
}

// inspect calls Inspect and fails the case on error.
func (h *Harness) inspect(t T, name string) backend.Sandbox {
	t.Helper()
	ctx, cancel := h.ctx(t)
	defer cancel()
	sb, err := h.Backend.Inspect(ctx, name)
	if err != nil {
		t.Fatalf("Inspect(%s): %v", name, err)
	}
	return sb
}

// list calls List and fails the case on error.
func (h *Harness) list(t T, filter map[string]string) []backend.Sandbox {
	t.Helper()
	ctx, cancel := h.ctx(t)
	defer cancel()
	sbs, err := h.Backend.List(ctx, filter)
	if err != nil {
		t.Fatalf("List(%v): %v", filter, err)
	}
	return sbs
}

// stop calls Stop with the default grace and fails the case on error.
func (h *Harness) stop(t T, name string) {
	t.Helper()
	ctx, cancel := h.ctx(t)
	defer cancel()
	if err := h.Backend.Stop(ctx, name, 0); err != nil {
		t.Fatalf("Stop(%s): %v", name, err)
	}
}

// remove calls Remove and fails the case on error.
func (h *Harness) remove(t T, name string) {
	t.Helper()
	ctx, cancel := h.ctx(t)
	defer cancel()
	if err := h.Backend.Remove(ctx, name); err != nil {
		t.Fatalf("Remove(%s): %v", name, err)
	}
}

func names(sbs []backend.Sandbox) []string {
	var out []string
	for _, s := range sbs {
		out = append(out, s.Name)
	}
	return out
}

func findSandbox(sbs []backend.Sandbox, name string) (backend.Sandbox, bool) {
	for _, s := range sbs {
		if s.Name == name {
			return s, true
		}
	}
	return backend.Sandbox{}, false
}

// Info names the driver and its version, speaks this contract's protocol, and
// declares a known FS isolation.
func caseInfoValid(t T, h *Harness) {
	ctx, cancel := h.ctx(t)
	defer cancel()
	info, err := backend.InfoOf(ctx, h.Backend)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	if info.Name == "" || info.Version == "" {
		t.Errorf("Info: name %q version %q, want both set", info.Name, info.Version)
	}
	if !slices.Contains(info.ProtocolVersions, backend.ProtocolVersion) {
		t.Errorf("Info: protocol versions %v lack %d", info.ProtocolVersions, backend.ProtocolVersion)
	}
	switch info.Capabilities.FSIsolation {
	case backend.FSIsolationNone, backend.FSIsolationImage, backend.FSIsolationPrivate:
	default:
		t.Errorf("Info: FSIsolation %q, want %q, %q or %q", info.Capabilities.FSIsolation, backend.FSIsolationNone, backend.FSIsolationImage, backend.FSIsolationPrivate)
	}
	if info.Name != h.Info.Name || info.Capabilities.TTY != h.Info.Capabilities.TTY || info.Capabilities.StopStart != h.Info.Capabilities.StopStart {
		t.Errorf("Info changed during the run: %+v, then %+v", h.Info, info)
	}
}

// Create returns running, Inspect says running and shows every label as given, label
// values in UTF-8 (a session name may be printable Unicode) included, and List finds
// the sandbox by such a value.
func caseCreateRunningLabels(t T, h *Harness) {
	spec := h.Spec(t, SandboxName())
	spec.Labels["conformance.user"] = "value with spaces"
	session := spec.Labels[backend.LabelSession] + "/chat:général/チャット/🎉"
	spec.Labels[backend.LabelSession] = session
	created, err := h.Create(t, spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", spec.Name, err)
	}
	if created.Name != spec.Name || created.State != backend.StateRunning || created.Adopted {
		t.Errorf("Create returned name %q state %q adopted %v, want %q %q false", created.Name, created.State, created.Adopted, spec.Name, backend.StateRunning)
	}
	if created.ID == "" {
		t.Errorf("Create returned an empty ID")
	}
	got := h.inspect(t, spec.Name)
	if got.Name != spec.Name || got.State != backend.StateRunning {
		t.Errorf("Inspect: name %q state %q, want %q %q", got.Name, got.State, spec.Name, backend.StateRunning)
	}
	if got.ID != created.ID {
		t.Errorf("Inspect: ID %q, Create said %q", got.ID, created.ID)
	}
	if got.CreatedAt.IsZero() {
		t.Errorf("Inspect: CreatedAt is zero")
	}
	for k, v := range spec.Labels {
		if got.Labels[k] != v {
			t.Errorf("Inspect: label %s = %q, want %q", k, got.Labels[k], v)
		}
	}
	for _, k := range []string{backend.LabelOwner, backend.LabelSession, backend.LabelScope, backend.LabelCreated, backend.LabelSpecHash} {
		if _, ok := got.Labels[k]; !ok {
			t.Errorf("Inspect: berth label %s missing", k)
		}
	}
	if sbs := h.list(t, map[string]string{backend.LabelOwner: h.Owner, backend.LabelSession: session}); len(sbs) != 1 || sbs[0].Name != spec.Name {
		t.Errorf("List by the UTF-8 session label %q: %v, want only %s", session, sbs, spec.Name)
	}
	if out := h.run(t, spec.Name, "true"); out.ExitCode != 0 {
		t.Errorf("exec true: %s", out.describe())
	}
}

// List filtered by the owner label finds the sandbox, running, with its labels.
func caseListByOwner(t T, h *Harness) {
	name := h.NewSandbox(t)
	sbs := h.list(t, map[string]string{backend.LabelOwner: h.Owner})
	sb, ok := findSandbox(sbs, name)
	if !ok {
		t.Fatalf("List(owner=%s) = %v, lacks %s", h.Owner, names(sbs), name)
	}
	if sb.State != backend.StateRunning || sb.Labels[backend.LabelOwner] != h.Owner || sb.Labels[RunLabel] != h.RunID {
		t.Errorf("List entry: state %q labels %v", sb.State, sb.Labels)
	}
	for _, s := range sbs {
		if s.Labels[backend.LabelOwner] != h.Owner {
			t.Errorf("List(owner=%s) returned %s with owner %q", h.Owner, s.Name, s.Labels[backend.LabelOwner])
		}
	}
	all := h.list(t, nil)
	if _, ok := findSandbox(all, name); !ok {
		t.Errorf("List(no filter) = %v, lacks %s", names(all), name)
	}
}

// Label values longer than a runtime's own limit (Kubernetes: 63 characters of
// [A-Za-z0-9_.-]) and of any printable text are kept exactly and filter exactly:
// List by a 300-character value with spaces, colons, slashes and Unicode finds the
// sandbox, and List by the same value cut to its first 63 characters, or differing
// in its last character only, finds nothing (a driver that truncates or
// normalises values would).
func caseListLongOddLabels(t T, h *Harness) {
	long := strings.Repeat("séance:x/y z_", 23) + randHex(4) // 300+ bytes, odd characters throughout
	a := h.NewSandboxWith(t, func(s *backend.SandboxSpec) { s.Labels["conformance.long"] = long + "a" })
	b := h.NewSandboxWith(t, func(s *backend.SandboxSpec) { s.Labels["conformance.long"] = long + "b" })
	if got := h.inspect(t, a); got.Labels["conformance.long"] != long+"a" {
		t.Errorf("Inspect(%s): label conformance.long = %q, want the %d-byte value as given", a, got.Labels["conformance.long"], len(long)+1)
	}
	got := h.list(t, map[string]string{RunLabel: h.RunID, "conformance.long": long + "a"})
	if len(got) != 1 || got[0].Name != a || got[0].Labels["conformance.long"] != long+"a" {
		t.Errorf("List by the long label of %s = %v, want exactly [%s] with its label as given", a, names(got), a)
	}
	got = h.list(t, map[string]string{"conformance.long": long + "b"})
	if len(got) != 1 || got[0].Name != b {
		t.Errorf("List by the long label of %s = %v, want exactly [%s]", b, names(got), b)
	}
	for _, v := range []string{string([]rune(long)[:63]), long, long + "c"} {
		if got := h.list(t, map[string]string{"conformance.long": v}); len(got) != 0 {
			t.Errorf("List by conformance.long = %q (%d bytes) = %v, want none", v, len(v), names(got))
		}
	}
}

// A label filter returns the sandboxes that match every pair and no other.
func caseListFilterExcludes(t T, h *Harness) {
	tag := randHex(4)
	a := h.NewSandboxWith(t, func(s *backend.SandboxSpec) { s.Labels["conformance.tag"] = tag + "-a" })
	b := h.NewSandboxWith(t, func(s *backend.SandboxSpec) { s.Labels["conformance.tag"] = tag + "-b" })

	got := h.list(t, map[string]string{"conformance.tag": tag + "-a"})
	if len(got) != 1 || got[0].Name != a {
		t.Errorf("List(tag=%s-a) = %v, want exactly [%s]", tag, names(got), a)
	}
	got = h.list(t, map[string]string{RunLabel: h.RunID, "conformance.tag": tag + "-b"})
	if len(got) != 1 || got[0].Name != b {
		t.Errorf("List(run, tag=%s-b) = %v, want exactly [%s]", tag, names(got), b)
	}
	got = h.list(t, map[string]string{"conformance.tag": tag + "-a", backend.LabelOwner: "someone-else"})
	if len(got) != 0 {
		t.Errorf("List(tag=%s-a, owner=someone-else) = %v, want none", tag, names(got))
	}
	got = h.list(t, map[string]string{"conformance.tag": tag + "-none"})
	if len(got) != 0 {
		t.Errorf("List(tag=%s-none) = %v, want none", tag, names(got))
	}
}

// After Stop, Inspect says stopped, labels are kept, and an exec is refused (wantRefused).
func caseStopInspectStopped(t T, h *Harness) {
	name := h.NewSandbox(t)
	h.stop(t, name)
	got := h.inspect(t, name)
	if got.State != backend.StateStopped {
		t.Errorf("Inspect after Stop: state %q, want %q", got.State, backend.StateStopped)
	}
	if got.Labels[backend.LabelOwner] != h.Owner {
		t.Errorf("Inspect after Stop: owner label %q, want %q", got.Labels[backend.LabelOwner], h.Owner)
	}
	_, err := h.exec(t, name, backend.ExecRequest{Argv: []string{"true"}})
	h.wantRefused(t, "Exec in a stopped sandbox", err, backend.ErrConflict)
	// A second Stop of a stopped sandbox succeeds.
	h.stop(t, name)
}

// Create of a stopped sandbox adopts it: same ID, Adopted, running, files kept
// (with StopKeepsWorkdir: those in the working directory, and none outside it).
func caseStopCreateAdopts(t T, h *Harness) {
	spec := h.Spec(t, SandboxName())
	first, err := h.Create(t, spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", spec.Name, err)
	}
	file := "berth-conf-" + randHex(4)
	h.sh(t, spec.Name, `echo kept > "$1"`, file)
	// A driver that keeps only the working directory (StopKeepsWorkdir) must say
	// so precisely: a file written outside it is gone after the start.
	outside := ""
	if h.Info.Capabilities.Keeps() == backend.StopKeepsWorkdir {
		outside = "/tmp/berth-conf-outside-" + randHex(4)
		h.sh(t, spec.Name, `mkdir -p /tmp && echo gone > "$1"`, outside)
	}
	h.stop(t, spec.Name)

	again, err := h.Create(t, spec)
	if err != nil {
		t.Fatalf("Create(%s) of the stopped sandbox: %v", spec.Name, err)
	}
	if !again.Adopted || again.ID != first.ID || again.State != backend.StateRunning {
		t.Errorf("Create of the stopped sandbox: adopted %v id %q state %q, want true %q %q", again.Adopted, again.ID, again.State, first.ID, backend.StateRunning)
	}
	if got := h.inspect(t, spec.Name); got.State != backend.StateRunning {
		t.Errorf("Inspect after re-Create: state %q, want running", got.State)
	}
	if out := h.run(t, spec.Name, "cat", file); out.ExitCode != 0 || out.Stdout != "kept\n" {
		t.Errorf("file written before Stop, read after re-Create: %s", out.describe())
	}
	if outside != "" {
		if out := h.run(t, spec.Name, "cat", outside); out.ExitCode == 0 {
			t.Errorf("Capabilities.StopKeeps is %q, but %s, written outside the working directory before Stop, is still there after re-Create: the driver keeps more than it says (claim %q)", backend.StopKeepsWorkdir, outside, backend.StopKeepsAll)
		}
	}
}

// Stop ends every process in the sandbox, background ones included.
func caseStopEndsProcesses(t T, h *Harness) {
	name := h.NewSandbox(t)
	mark := newMarker()
	out, err := h.exec(t, name, backend.ExecRequest{Argv: []string{"sh", "-c", "sleep 300 & echo started"}, Env: []string{mark}})
	if err != nil || out.ExitCode != 0 || out.Stdout != "started\n" {
		t.Fatalf("starting a background sleep: %v %s", err, out.describe())
	}
	// Looked for until it is seen: one scan of /proc can miss a process for a moment
	// (in execve its environment can read empty until the new image's is set up; a
	// loaded machine stretches that, and one CI run saw no sleep on local in a single
	// scan).
	if len(h.markedAlive(t, name, mark)) == 0 {
		t.Fatalf("the background sleep is not running in the sandbox after its exec returned (looked for %v)", testwait.Limit)
	}
	onHost := len(hostMarked(mark)) > 0
	h.stop(t, name)
	switch {
	case onHost:
		if pids := hostMarked(mark); len(pids) > 0 {
			t.Errorf("after Stop, processes of the sandbox still run on the host: pids %v", pids)
		}
	case h.Info.Capabilities.StopStart:
		spec := h.Spec(t, name)
		if _, err := h.Create(t, spec); err != nil {
			t.Fatalf("Create(%s) after Stop: %v", name, err)
		}
		if ps := liveOnly(h.marked(t, name, mark)); len(ps) > 0 {
			t.Errorf("after Stop and Create, the background sleep from before Stop still runs: %v", ps)
		}
	default:
		t.Logf("sandbox processes are not visible from the host and the driver has no StopStart: only Stop's success is checked")
	}
}

// Remove deletes the sandbox: Inspect says ErrNotFound, an exec is refused
// (wantRefused), List lacks it.
func caseRemoveNotFound(t T, h *Harness) {
	name := h.NewSandbox(t)
	h.remove(t, name)
	ctx, cancel := h.ctx(t)
	defer cancel()
	_, err := h.Backend.Inspect(ctx, name)
	wantKind(t, "Inspect after Remove", err, backend.ErrNotFound)
	_, err = h.exec(t, name, backend.ExecRequest{Argv: []string{"true"}})
	h.wantRefused(t, "Exec after Remove", err, backend.ErrNotFound)
	if sbs := h.list(t, map[string]string{RunLabel: h.RunID}); len(sbs) > 0 {
		if _, ok := findSandbox(sbs, name); ok {
			t.Errorf("List after Remove still has %s", name)
		}
	}
	// A second Remove of the removed sandbox succeeds.
	h.remove(t, name)
}

func caseStopMissing(t T, h *Harness) {
	ctx, cancel := h.ctx(t)
	defer cancel()
	if err := h.Backend.Stop(ctx, SandboxName(), 0); err != nil {
		t.Errorf("Stop of a missing sandbox: %v, want success", err)
	}
}

func caseRemoveMissing(t T, h *Harness) {
	ctx, cancel := h.ctx(t)
	defer cancel()
	if err := h.Backend.Remove(ctx, SandboxName()); err != nil {
		t.Errorf("Remove of a missing sandbox: %v, want success", err)
	}
}

func caseInspectMissing(t T, h *Harness) {
	ctx, cancel := h.ctx(t)
	defer cancel()
	_, err := h.Backend.Inspect(ctx, SandboxName())
	wantKind(t, "Inspect of a missing sandbox", err, backend.ErrNotFound)
}

func caseExecMissing(t T, h *Harness) {
	_, err := h.exec(t, SandboxName(), backend.ExecRequest{Argv: []string{"true"}})
	h.wantRefused(t, "Exec in a missing sandbox", err, backend.ErrNotFound)
}

// A Create whose owner label differs from the existing sandbox's is ErrConflict, and
// the existing sandbox is left alone.
func caseOtherOwnerConflict(t T, h *Harness) {
	spec := h.Spec(t, SandboxName())
	first, err := h.Create(t, spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", spec.Name, err)
	}
	mark := newMarker()
	if out, err := h.exec(t, spec.Name, backend.ExecRequest{Argv: []string{"sh", "-c", "sleep 300 & echo started"}, Env: []string{mark}}); err != nil || out.ExitCode != 0 {
		t.Fatalf("starting a background sleep: %v %s", err, out.describe())
	}

	other := h.Spec(t, spec.Name)
	other.Labels[backend.LabelOwner] = "conformance-other-" + randHex(4)
	got, err := h.Create(t, other)
	wantKind(t, "Create of a name held by another owner", err, backend.ErrConflict)
	if err == nil && got.Adopted {
		t.Errorf("Create with another owner adopted the sandbox")
	}

	after := h.inspect(t, spec.Name)
	if after.ID != first.ID || after.State != backend.StateRunning || after.Labels[backend.LabelOwner] != h.Owner {
		t.Errorf("after the conflicting Create: id %q state %q owner %q, want %q running %q", after.ID, after.State, after.Labels[backend.LabelOwner], first.ID, h.Owner)
	}
	if len(h.markedAlive(t, spec.Name, mark)) == 0 {
		t.Errorf("the conflicting Create ended the sandbox's background process")
	}
}

// A name the contract rejects is ErrInvalid, and nothing is created.
func caseCreateInvalidName(t T, h *Harness) {
	bad := []string{"Bconf-" + randHex(4), "-bconf-" + randHex(4), "bconf/" + randHex(4), "bconf-" + strings.Repeat("b", 58)}
	for _, name := range bad {
		spec := h.Spec(t, name)
		files, err := h.AgentFiles(h.Options.StateDir, "bconf-invalid-"+randHex(4))
		if err != nil {
			t.Fatalf("preparing agent files: %v", err)
		}
		ctx, cancel := h.ctx(t)
		_, err = h.Backend.Create(ctx, backend.CreateRequest{Spec: spec, Agent: files})
		cancel()
		wantKind(t, fmt.Sprintf("Create(%q)", name), err, backend.ErrInvalid)
		if err == nil {
			h.removeOnCleanup(t, name) // best effort: do not leave it behind
		}
	}
	for _, s := range h.list(t, map[string]string{RunLabel: h.RunID}) {
		if slices.Contains(bad, s.Name) {
			t.Errorf("List shows %q after its Create was refused", s.Name)
		}
	}
}

// longDirLen is the length of the long state dir path.
const longDirLen = 150

// Everything works with agent files under a state dir whose path is 150 bytes long
// (longer than a unix socket path may be).
func caseLongStateDir(t T, h *Harness) {
	base, err := os.MkdirTemp("", "bconf-long-")
	if err != nil {
		t.Fatalf("MkdirTemp: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	base, err = filepath.EvalSymlinks(base)
	if err != nil {
		t.Fatalf("EvalSymlinks: %v", err)
	}
	dir := base
	for need := longDirLen - len(dir); need > 0; need = longDirLen - len(dir) {
		n := need - 1 // a separator and n bytes of name
		if n > 60 {
			n = 60
			if need-1-n == 1 {
				n-- // never leave exactly one byte, which no component fits
			}
		}
		if n < 1 {
			t.Fatalf("the temporary directory %s is too long to build a %d-byte path under it", base, longDirLen)
		}
		dir = filepath.Join(dir, strings.Repeat("d", n))
	}
	if len(dir) != longDirLen {
		t.Fatalf("built a state dir path of %d bytes, want %d: %s", len(dir), longDirLen, dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("MkdirAll: %v", err)
	}
	t.Logf("state dir (%d bytes): %s", len(dir), dir)

	spec := h.Spec(t, SandboxName())
	sb, err := h.CreateIn(t, dir, spec)
	if err != nil {
		t.Fatalf("Create(%s) with agent files under the long state dir: %v", spec.Name, err)
	}
	if sb.State != backend.StateRunning {
		t.Errorf("Create: state %q, want running", sb.State)
	}
	if out := h.run(t, spec.Name, "sh", "-c", "echo hello; exit 3"); out.ExitCode != 3 || out.Stdout != "hello\n" {
		t.Errorf("exec in the sandbox: %s, want exit 3 and hello", out.describe())
	}
	if h.Info.Capabilities.StopStart {
		h.stop(t, spec.Name)
		if _, err := h.CreateIn(t, dir, spec); err != nil {
			t.Fatalf("Create after Stop: %v", err)
		}
		if out := h.run(t, spec.Name, "true"); out.ExitCode != 0 {
			t.Errorf("exec after Stop and Create: %s", out.describe())
		}
	}
	h.remove(t, spec.Name)
	ctx, cancel := h.ctx(t)
	defer cancel()
	_, err = h.Backend.Inspect(ctx, spec.Name)
	wantKind(t, "Inspect after Remove", err, backend.ErrNotFound)
}
