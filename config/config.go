package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/catalog"
)

// Isolation says whether sessions that a rule matches get a sandbox each or share one.
type Isolation string

// The isolation modes.
const (
	// IsolationSession gives every session name its own sandbox.
	IsolationSession Isolation = "session"
	// IsolationShared gives every session the rule matches one sandbox, named by the
	// rule's Name.
	IsolationShared Isolation = "shared"
)

// OnClose is what closing a session does to its sandbox (session-isolated rules only).
type OnClose string

// The on_close policies.
const (
	// OnCloseKeep leaves the sandbox running.
	OnCloseKeep OnClose = "keep"
	// OnCloseStop stops the sandbox; the next exec in the session starts it again.
	OnCloseStop OnClose = "stop"
	// OnCloseRemove removes the sandbox and forgets the session.
	OnCloseRemove OnClose = "remove"
)

// IdleAction is what happens to a sandbox that has been idle for longer than its
// rule's idle_ttl.
type IdleAction string

// The idle_action policies.
const (
	// IdleStop stops the sandbox (its files stay; the next exec starts it again).
	IdleStop IdleAction = "stop"
	// IdleRemove removes the sandbox with its files; the next exec gets a fresh one
	// and reports registry.Lease.Recreated.
	IdleRemove IdleAction = "remove"
)

// Retention is a rule's retention block. IdleTTL and MaxAge are zero when unset
// (never). The registry enforces it: CloseSession applies OnClose; every Exec and
// Acquire applies IdleTTL and MaxAge to the session it touches; Prune applies them
// to every sandbox of every configured driver (see docs/retention.md).
type Retention struct {
	// OnClose is applied by registry.Registry.CloseSession; default OnCloseKeep.
	OnClose OnClose
	// IdleTTL is how long a sandbox may stay idle (no exec running through the
	// registry, none started) before IdleAction is applied; 0 means never.
	IdleTTL time.Duration
	// IdleAction is applied to a sandbox idle for longer than IdleTTL; default
	// IdleStop.
	IdleAction IdleAction
	// MaxAge is how old a sandbox may get (from its creation) before it is removed,
	// whatever its use, execs in flight included; 0 means never.
	MaxAge time.Duration
}

// Rule is one scope "GLOB" {} block: which sessions it matches and what their sandbox
// looks like.
type Rule struct {
	// Glob is the block's label in Unicode NFC (see NormalizeGlob and GlobMatch).
	Glob string
	// Index is the rule's position among the config's rules, from 0.
	Index int
	// Driver names the driver that runs the rule's sandboxes.
	Driver string
	// Name is the shared sandbox's name (isolation = "shared" only), a session-style name.
	Name string
	// Image, Workdir, User, Network, Mounts, Resources and AllowHostPaths go into the
	// sandbox spec unchanged (see backend.SandboxSpec).
	Image string
	// Pull says when Image is pulled before a sandbox is created: backend.PullMissing
	// (the default when the rule sets an image), PullAlways or PullNever. It applies
	// only to drivers that pull images (Capabilities.ImagePull).
	Pull    backend.PullPolicy
	Workdir string
	User    string
	Network string
	// Runtime is the OCI runtime of the rule's container sandboxes (runtime =
	// "runsc" for gVisor), one the rule's driver lists in Capabilities.Runtimes;
	// "" for the engine's default. It goes into the spec (backend.SandboxSpec.Runtime)
	// and its hash, so changing it is drift.
	Runtime        string
	Mounts         []backend.Mount
	Resources      backend.Resources
	AllowHostPaths bool
	// Env is set for every exec in the sandbox.
	Env map[string]string
	// EnvPassthrough names host variables that execs get in drivers without their own
	// filesystem (backend.SandboxSpec.EnvAllowlist), in addition to the driver's
	// allowlist (default backend.DefaultEnvAllowlist).
	EnvPassthrough []string
	// MaxOutput caps each output stream of a shell-mode call (registry.Registry.Shell),
	// in bytes; 0 means registry.DefaultShellMaxOutput.
	MaxOutput int64
	// Isolation is IsolationSession (default) or IsolationShared.
	Isolation Isolation
	// Retention is the retention block.
	Retention Retention
	// Pool is the rule's pool block (isolation "session" only), or nil: how many
	// sandboxes of the rule's spec a long-lived registry (berth serve,
	// registry.Registry.RunPools) keeps created and started for the rule's new
	// sessions to claim (see docs/pools.md).
	Pool *Pool
	// Range is where the block is defined (its "scope "GLOB"" header); zero for
	// Default's rule.
	Range hcl.Range
}

// Pool is a scope rule's pool block: `pool { size = N  max_idle = "30m" }`.
type Pool struct {
	// Size is how many unclaimed members the pool keeps created and started, 1 to
	// MaxPoolSize.
	Size int
	// MaxIdle is how long a member may wait unclaimed before it is replaced by a
	// new one (a duration as ParseDuration reads it); 0 means never.
	MaxIdle time.Duration
}

// Pos returns "file:line:col" of the rule's definition, or "(built-in default)".
func (r *Rule) Pos() string {
	if r.Range.Filename == "" {
		return "(built-in default)"
	}
	return posString(r.Range)
}

// ExampleSession returns a session name that the rule's glob matches: the glob with
// every * and ? replaced by "x" ("chat:*" → "chat:x"). A rule's sandbox spec differs
// between its sessions only in the sandbox's name and labels, so Spec(owner,
// r.ExampleSession()) stands for them all where that is all one needs (`berth config
// check` validates it).
func (r *Rule) ExampleSession() string {
	return strings.NewReplacer("*", "x", "?", "x").Replace(r.Glob)
}

// Key returns what the rule's sandbox for session is named after: the session itself
// for IsolationSession, the rule's Name for IsolationShared. It is also the value of
// the sandbox's backend.LabelSession.
func (r *Rule) Key(session string) string {
	if r.Isolation == IsolationShared {
		return r.Name
	}
	return session
}

// SandboxName returns the name of session's sandbox under r for the installation
// owner (its 32-hex-digit owner id): SharedSandboxName(owner, r.Name) for shared
// rules, SandboxName(owner, session) otherwise. It equals r.Spec(owner,
// session).Name without building the spec.
func (r *Rule) SandboxName(owner, session string) string {
	if r.Isolation == IsolationShared {
		return SharedSandboxName(owner, r.Name)
	}
	return SandboxName(owner, session)
}

// Spec returns the sandbox spec for session under owner: the rule's fields, the
// sandbox name (SandboxName or SharedSandboxName), and the labels LabelOwner,
// LabelSession, LabelScope and LabelSpecHash. LabelCreated is added at create time.
func (r *Rule) Spec(owner, session string) backend.SandboxSpec {
	key := r.Key(session)
	spec := backend.SandboxSpec{
		Name:           r.SandboxName(owner, session),
		Image:          r.Image,
		Workdir:        r.Workdir,
		User:           r.User,
		Network:        r.Network,
		Resources:      r.Resources,
		AllowHostPaths: r.AllowHostPaths,
		Runtime:        r.Runtime,
		Pull:           r.Pull,
		EnvAllowlist:   slices.Clone(r.EnvPassthrough),
		Mounts:         slices.Clone(r.Mounts),
	}
	keys := make([]string, 0, len(r.Env))
	for k := range r.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		spec.Env = append(spec.Env, k+"="+r.Env[k])
	}
	spec.Labels = map[string]string{
		backend.LabelOwner:    owner,
		backend.LabelSession:  key,
		backend.LabelScope:    r.Glob,
		backend.LabelSpecHash: SpecHash(spec),
	}
	return spec
}

// PoolMemberName returns the sandbox name of the pool member whose id is id (16
// random hex digits, never reused): SandboxName(owner, "\x00pool\x00"+id). A NUL
// cannot occur in a session name, so it never equals a session's sandbox name.
func PoolMemberName(owner, id string) string {
	return SandboxName(owner, "\x00pool\x00"+id)
}

// PoolHash returns the spec hash that every member of r's pool carries (its
// LabelSpecHash): SpecHash of r's spec with no name, since members are named by
// their id, not by a session. A claimed member's drift is judged against it.
func (r *Rule) PoolHash(owner string) string {
	spec := r.Spec(owner, r.ExampleSession())
	spec.Name = ""
	return SpecHash(spec)
}

// MemberSpec returns the spec of r's pool member id under owner: r's fields, the
// name PoolMemberName(owner, id), and the labels LabelOwner, LabelScope, LabelPool
// (id) and LabelSpecHash (PoolHash); no LabelSession. LabelCreated is added at
// create time.
func (r *Rule) MemberSpec(owner, id string) backend.SandboxSpec {
	spec := r.Spec(owner, r.ExampleSession())
	spec.Name = PoolMemberName(owner, id)
	spec.Labels = map[string]string{
		backend.LabelOwner:    owner,
		backend.LabelScope:    r.Glob,
		backend.LabelPool:     id,
		backend.LabelSpecHash: r.PoolHash(owner),
	}
	return spec
}

// DriverBlock is one driver "NAME" {} block. The host's own keys (plugin,
// sha256, start_timeout) are decoded at load; the rest of the body is kept
// undecoded until the driver's schema is known (Config.DriverConfig).
type DriverBlock struct {
	// Name is the block's label.
	Name string
	// Body is the block's body without the host keys.
	Body hcl.Body
	// Range is where the block is defined.
	Range hcl.Range
	// Plugin is the plugin key of a third-party driver: an absolute path (a
	// relative one in the file is made absolute against the config file's
	// directory) or an executable name searched in the plugin search path;
	// "" when unset (berth-driver-NAME is searched).
	Plugin string
	// SHA256 is the sha256 pin of the plugin executable, lowercase hex, or "".
	SHA256 string
	// StartTimeout is start_timeout, the bound on the plugin's start and
	// handshake; 0 when unset (the default of package backends, 10s).
	StartTimeout time.Duration
}

// Pos returns "file:line:col" of the block's definition.
func (b *DriverBlock) Pos() string { return posString(b.Range) }

// Config is a loaded config file (Load, Parse) or the built-in one (Default). Empty
// strings and nil slices mean "not set". It holds no precedence of its own: the
// caller (berth's CLI: flags > BERTH_* environment > this file > defaults) decides
// what overrides it before it passes the Config to registry.Open. A Config is not
// changed by the registry; do not change one that a registry holds.
type Config struct {
	// Path is the file the config came from, as given to Load or Parse; empty for
	// Default.
	Path string
	// SHA256 is the SHA-256 of the source that Load or Parse read, 64 hex digits;
	// empty for Default. berth serve's status says it, so that a client that finds
	// the config file unchanged since the daemon read it knows the file is valid
	// without parsing it (the thin berth front, cli/front).
	SHA256 string
	// StateDir is state_dir, an absolute path ("~/" expanded), or empty.
	StateDir string
	// AgentPath is agent_path, an absolute path, or empty (the berth binary).
	AgentPath string
	// OutputMaxTotal is output_max_total, in bytes: how much one session's full-output
	// files (registry.ShellResult.StdoutFile) may hold in all; a shell call that
	// leaves more deletes the session's oldest ones. Zero means
	// DefaultOutputMaxTotal; negative means no bound.
	OutputMaxTotal int64
	// OutputMaxAge is output_max_age: prune deletes full-output files older than
	// this. Zero means DefaultOutputMaxAge.
	OutputMaxAge time.Duration
	// AgentTimeout is agent_timeout: how long connecting to a sandbox's agent (the
	// dial, berth's handshake and Hello) may take before the call fails with
	// ErrTimeout, naming the sandbox (a paused container, something squatting on the
	// agent's socket). Zero means DefaultAgentTimeout.
	AgentTimeout time.Duration
	// PluginDirs is plugin_dirs, absolute paths.
	PluginDirs []string
	// LogLevel is log_level: trace, debug, info, warn, error, off, or empty.
	LogLevel string
	// Drivers holds the driver "NAME" {} blocks by name.
	Drivers map[string]*DriverBlock
	// Rules are the scope rules in file order; Match tries them in this order.
	Rules []Rule
	// KnownDrivers is the set of driver names the config was checked against, sorted:
	// the known drivers (WithKnownDrivers), the third-party drivers the plugin finder
	// found and those whose driver block has a plugin key. A registry opened on the
	// Config knows these drivers (and those it is given itself).
	KnownDrivers []string
}

// DefaultKnownDrivers is the set of driver names a config may use when the caller
// names none (Load, Parse or Default without WithKnownDrivers): the built-in drivers
// of package catalog (backends/catalog) (catalog.BuiltinNames), in its order.
var DefaultKnownDrivers = catalog.BuiltinNames()

// Default is the config used when there is no config file: no state_dir, agent_path,
// plugin_dirs or log_level, no driver blocks, and one rule,
// scope "*" { driver = "local", isolation = "session", retention { on_close = "keep" } },
// whose Pos is "(built-in default)". Its KnownDrivers are the known drivers
// (WithKnownDrivers, default DefaultKnownDrivers) plus those the plugin finder
// (WithPluginFinder, default none) finds with no plugin_dirs, sorted: the drivers
// that a registry opened on it lists and may reconcile. It reads nothing but what
// the finder reads.
func Default(opts ...Option) *Config {
	o := newOptions(opts)
	known := slices.Clone(o.known)
	if o.finder != nil {
		for _, n := range o.finder(nil) {
			if !slices.Contains(known, n) {
				known = append(known, n)
			}
		}
	}
	sort.Strings(known)
	return &Config{
		Drivers:      map[string]*DriverBlock{},
		KnownDrivers: known,
		Rules:        defaultRules(),
	}
}

// defaultRules is Default's one rule.
func defaultRules() []Rule {
	return []Rule{{
		Glob:      "*",
		Driver:    "local",
		Isolation: IsolationSession,
		Retention: Retention{OnClose: OnCloseKeep, IdleAction: IdleStop},
	}}
}

// Match returns the first rule whose glob matches the whole session name (in its NFC
// form, see NormalizeSession), and its index. Errors (wrapping backend.ErrInvalid): a
// session name that ValidateSession refuses; no matching rule (the message names the
// session and suggests a catch-all scope "*" rule).
func (c *Config) Match(session string) (*Rule, int, error) {
	session, err := NormalizeSession(session)
	if err != nil {
		return nil, -1, err
	}
	for i := range c.Rules {
		if GlobMatch(c.Rules[i].Glob, session) {
			return &c.Rules[i], i, nil
		}
	}
	where := "the config"
	if c.Path != "" {
		where = c.Path
	}
	globs := make([]string, len(c.Rules))
	for i := range c.Rules {
		globs[i] = fmt.Sprintf("%q", c.Rules[i].Glob)
	}
	return nil, -1, backend.Errorf(backend.ErrInvalid,
		"session %q matches no scope rule in %s (globs tried in order: %s); add a catch-all rule at the end, e.g. scope \"*\" { driver = \"local\" }",
		session, where, strings.Join(globs, ", "))
}

// Error is a config's errors: HCL diagnostics, each with file:line:col. It wraps
// backend.ErrInvalid; Error returns FormatDiagnostics of them. Load, Parse,
// Config.DriverConfig and DecodeDriverConfig return it as a *Error.
type Error struct {
	// Diagnostics are the errors (and warnings) found, in no guaranteed order.
	Diagnostics hcl.Diagnostics
	// Path and SHA256 name the source that failed, as Config.Path and
	// Config.SHA256 would have (Load and Parse); "" for a driver block's errors.
	Path, SHA256 string
}

// Error formats every diagnostic, one per line, sorted by position.
func (e *Error) Error() string { return FormatDiagnostics(e.Diagnostics) }

// Unwrap returns backend.ErrInvalid.
func (e *Error) Unwrap() error { return backend.ErrInvalid }

// FormatDiagnostics renders diagnostics one per line, sorted by file and position, as
// "FILE:LINE:COL: error: SUMMARY: DETAIL" ("warning" for warnings). A diagnostic without
// a subject range starts with "error:".
func FormatDiagnostics(diags hcl.Diagnostics) string {
	ds := slices.Clone(diags)
	sort.SliceStable(ds, func(i, j int) bool {
		a, b := ds[i].Subject, ds[j].Subject
		switch {
		case a == nil || b == nil:
			return a == nil && b != nil
		case a.Filename != b.Filename:
			return a.Filename < b.Filename
		case a.Start.Line != b.Start.Line:
			return a.Start.Line < b.Start.Line
		default:
			return a.Start.Column < b.Start.Column
		}
	})
	var sb strings.Builder
	for i, d := range ds {
		if i > 0 {
			sb.WriteByte('\n')
		}
		if d.Subject != nil {
			sb.WriteString(posString(*d.Subject))
			sb.WriteString(": ")
		}
		if d.Severity == hcl.DiagWarning {
			sb.WriteString("warning: ")
		} else {
			sb.WriteString("error: ")
		}
		sb.WriteString(d.Summary)
		if d.Detail != "" {
			sb.WriteString(": ")
			sb.WriteString(d.Detail)
		}
	}
	return sb.String()
}

func posString(r hcl.Range) string {
	return fmt.Sprintf("%s:%d:%d", r.Filename, r.Start.Line, r.Start.Column)
}

// Option changes how Load, Parse and Default check a config.
type Option func(*options)

type options struct {
	known  []string
	finder PluginFinder
}

func newOptions(opts []Option) options {
	o := options{known: DefaultKnownDrivers}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// PluginFinder lists the third-party drivers that a config may use besides
// the known ones: the berth-driver-NAME executables in the plugin search path
// made of pluginDirs (the config's plugin_dirs, absolute paths; nil for Default)
// and the places the finder adds (DiscoverPlugins: $BERTH_PLUGIN_PATH, the berth
// binary's directory). It returns the driver names, in any order, without the
// built-in ones (DiscoverPlugins leaves them out).
type PluginFinder func(pluginDirs []string) []string

// WithPluginFinder sets how third-party drivers are discovered. The default is
// none (nil): only known drivers and driver blocks with a plugin key are accepted,
// and Load, Parse and Default read nothing but their input. berth's CLI passes
// DiscoverPlugins.
func WithPluginFinder(f PluginFinder) Option {
	return func(o *options) { o.finder = f }
}

// WithKnownDrivers sets the driver names that scope rules and driver blocks may use
// (default DefaultKnownDrivers). Give it every driver the registry will run: the
// built-in ones it serves, its in-process drivers (registry.WithDriver) and its
// plugins (registry.WithPlugin).
func WithKnownDrivers(names ...string) Option {
	return func(o *options) { o.known = slices.Clone(names) }
}

// Load reads and checks the HCL config file at path (used as given in positions and
// as Config.Path; berth's CLI makes it absolute first). Errors: the file does not
// exist or cannot be read (wrapping backend.ErrInvalid, naming the path), or an
// *Error with every problem found, each with file:line:col and what to do:
// syntax errors, unknown keys (with the valid ones), wrong types, bad globs, bad
// durations and sizes, unknown drivers, a shared rule without a name, unreachable
// rules.
func Load(path string, opts ...Option) (*Config, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, backend.Errorf(backend.ErrInvalid, "config file %s does not exist; create it, or point --config / BERTH_CONFIG at an existing file", path)
		}
		return nil, backend.Errorf(backend.ErrInvalid, "reading config file %s: %w; point --config / BERTH_CONFIG at a readable file", path, err)
	}
	return Parse(src, path, opts...)
}

// Parse checks config source src (HCL native syntax, UTF-8) as Load does; filename
// is used in positions, as Config.Path, and its directory resolves a relative
// plugin key. It reads no file and no environment variable (only the plugin finder
// may, and "~/" in state_dir and agent_path expands with os.UserHomeDir). Errors:
// an *Error, as Load's.
func Parse(src []byte, filename string, opts ...Option) (*Config, error) {
	o := newOptions(opts)
	sum := sha256.Sum256(src)
	hash := hex.EncodeToString(sum[:])
	file, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, &Error{Diagnostics: diags, Path: filename, SHA256: hash}
	}
	d := &decoder{known: slices.Clone(o.known), finder: o.finder, dir: filepath.Dir(filename)}
	cfg := d.config(file.Body)
	if d.diags.HasErrors() {
		return nil, &Error{Diagnostics: d.diags, Path: filename, SHA256: hash}
	}
	cfg.Path = filename
	cfg.SHA256 = hash
	cfg.KnownDrivers = slices.Sorted(slices.Values(d.known))
	return cfg, nil
}

// decoder accumulates diagnostics while decoding a config.
type decoder struct {
	known []string
	diags hcl.Diagnostics
	// finder and dir (the config file's directory) serve third-party drivers.
	finder PluginFinder
	dir    string
}

func (d *decoder) errf(rng hcl.Range, summary, format string, args ...any) {
	r := rng
	d.diags = append(d.diags, &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Summary:  summary,
		Detail:   fmt.Sprintf(format, args...),
		Subject:  &r,
	})
}

// content decodes body against schema and adds the valid names to HCL's
// "unsupported argument/block" diagnostics.
func (d *decoder) content(body hcl.Body, schema *hcl.BodySchema, where string) *hcl.BodyContent {
	c, diags := body.Content(schema)
	for _, diag := range diags {
		switch diag.Summary {
		case "Unsupported argument", "Unsupported block type":
			diag.Detail += " " + validNames(schema, where)
		}
	}
	d.diags = append(d.diags, diags...)
	return c
}

func validNames(schema *hcl.BodySchema, where string) string {
	var attrs, blocks []string
	for _, a := range schema.Attributes {
		attrs = append(attrs, a.Name)
	}
	for _, b := range schema.Blocks {
		blocks = append(blocks, b.Type)
	}
	s := "Valid arguments in " + where + ": " + strings.Join(attrs, ", ")
	if len(attrs) == 0 {
		s = "No arguments are valid in " + where
	}
	if len(blocks) > 0 {
		s += "; valid blocks: " + strings.Join(blocks, ", ")
	}
	return s + "."
}

// value evaluates an attribute without variables or functions; ok is false for null
// or on error.
func (d *decoder) value(attr *hcl.Attribute, ty cty.Type, want string) (cty.Value, bool) {
	v, diags := attr.Expr.Value(nil)
	if trav, ok := attr.Expr.(*hclsyntax.ScopeTraversalExpr); ok && diags.HasErrors() && ty == cty.String && len(trav.Traversal) == 1 {
		// A bare word where a string goes (driver = local): HCL reads it as a
		// variable and says only "Variables not allowed".
		word := trav.Traversal.RootName()
		d.errf(attr.Expr.Range(), "Unquoted string", "%q must be %s, and a bare word is read as a variable; write %s = %q.", attr.Name, want, attr.Name, word)
		return cty.NilVal, false
	}
	d.diags = append(d.diags, diags...)
	if diags.HasErrors() || v.IsNull() {
		return cty.NilVal, false
	}
	if ty == cty.NilType {
		return v, true
	}
	cv, err := convert.Convert(v, ty)
	if err != nil || !cv.IsWhollyKnown() {
		d.errf(attr.Expr.Range(), "Incorrect attribute value type", "%q must be %s.", attr.Name, want)
		return cty.NilVal, false
	}
	if cv.IsNull() {
		return cty.NilVal, false
	}
	return cv, true
}

func (d *decoder) str(attr *hcl.Attribute) (string, bool) {
	v, ok := d.value(attr, cty.String, "a string")
	if !ok {
		return "", false
	}
	return v.AsString(), true
}

func (d *decoder) boolean(attr *hcl.Attribute) (bool, bool) {
	v, ok := d.value(attr, cty.Bool, "true or false")
	if !ok {
		return false, false
	}
	return v.True(), true
}

func (d *decoder) number(attr *hcl.Attribute) (*big.Float, bool) {
	v, ok := d.value(attr, cty.Number, "a number")
	if !ok {
		return nil, false
	}
	return v.AsBigFloat(), true
}

func (d *decoder) strList(attr *hcl.Attribute) ([]string, bool) {
	v, ok := d.value(attr, cty.List(cty.String), "a list of strings, e.g. [\"a\", \"b\"]")
	if !ok {
		return nil, false
	}
	var out []string
	for _, e := range v.AsValueSlice() {
		if e.IsNull() {
			d.errf(attr.Expr.Range(), "Invalid value", "%q must not contain null.", attr.Name)
			return nil, false
		}
		out = append(out, e.AsString())
	}
	return out, true
}

func (d *decoder) strMap(attr *hcl.Attribute) (map[string]string, bool) {
	v, ok := d.value(attr, cty.Map(cty.String), "a map of strings, e.g. { KEY = \"value\" }")
	if !ok {
		return nil, false
	}
	out := map[string]string{}
	for k, e := range v.AsValueMap() {
		if e.IsNull() {
			d.errf(attr.Expr.Range(), "Invalid value", "%q: the value of %q must not be null.", attr.Name, k)
			return nil, false
		}
		out[k] = e.AsString()
	}
	return out, true
}

// absPath decodes a string attribute that must be an absolute path ("~/" allowed when
// home is true).
func (d *decoder) absPath(attr *hcl.Attribute, home bool) (string, bool) {
	s, ok := d.str(attr)
	if !ok {
		return "", false
	}
	if home && (s == "~" || strings.HasPrefix(s, "~/")) {
		h, err := os.UserHomeDir()
		if err != nil {
			d.errf(attr.Expr.Range(), "Invalid path", "%q: cannot expand \"~\": %v; write an absolute path.", attr.Name, err)
			return "", false
		}
		s = filepath.Join(h, strings.TrimPrefix(s, "~"))
	}
	if !filepath.IsAbs(s) {
		hint := ""
		if home {
			hint = " or start with \"~/\""
		}
		d.errf(attr.Expr.Range(), "Invalid path", "%q must be an absolute path%s; got %q.", attr.Name, hint, s)
		return "", false
	}
	return filepath.Clean(s), true
}

func (d *decoder) duration(attr *hcl.Attribute) (time.Duration, bool) {
	s, ok := d.str(attr)
	if !ok {
		return 0, false
	}
	v, err := ParseDuration(s)
	if err != nil {
		d.errf(attr.Expr.Range(), "Invalid duration", "%q: %v.", attr.Name, err)
		return 0, false
	}
	return v, true
}

func (d *decoder) driverName(rng hcl.Range, name string) bool {
	if slices.Contains(d.known, name) {
		return true
	}
	d.errf(rng, "Unknown driver", "driver %q is not known; known drivers: %s. Use one of them, or install the third-party driver as an executable berth-driver-%s in $BERTH_PLUGIN_PATH, plugin_dirs or beside berth, or name it in driver %q { plugin = \"/path/to/berth-driver-%s\" }.",
		name, strings.Join(d.known, ", "), name, name, name)
	return false
}

var driverHostSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "plugin"}, {Name: "sha256"}, {Name: "start_timeout"}},
}

// driverBlock decodes a driver block's host keys and keeps the rest of it.
func (d *decoder) driverBlock(b *hcl.Block) *DriverBlock {
	name := b.Labels[0]
	blk := &DriverBlock{Name: name, Body: b.Body, Range: b.DefRange}
	c, remain, diags := b.Body.PartialContent(driverHostSchema)
	d.diags = append(d.diags, diags...)
	if c == nil {
		return blk
	}
	blk.Body = remain
	_, builtin := catalog.LookupBuiltin(name)
	if a := c.Attributes["plugin"]; a != nil {
		if s, ok := d.str(a); ok {
			switch {
			case builtin:
				d.errf(a.NameRange, "Plugin for a built-in driver", "driver %q ships with berth (served by berth or by its own executable beside berth); plugin applies only to third-party drivers. Remove it.", name)
			case s == "":
				d.errf(a.Expr.Range(), "Invalid plugin", "plugin must be a path or an executable name, e.g. \"berth-driver-%s\".", name)
			case strings.Contains(s, "/") && !filepath.IsAbs(s):
				blk.Plugin = filepath.Join(d.dir, s)
			default:
				blk.Plugin = s
			}
		}
	}
	if a := c.Attributes["sha256"]; a != nil {
		if s, ok := d.str(a); ok {
			switch {
			case builtin:
				d.errf(a.NameRange, "Checksum for a built-in driver", "driver %q ships with berth (served by berth or by its own executable beside berth, of the same build); sha256 applies only to third-party drivers. Remove it.", name)
			case len(s) != 64 || strings.Trim(strings.ToLower(s), "0123456789abcdef") != "":
				d.errf(a.Expr.Range(), "Invalid sha256", "sha256 must be 64 hex digits (the output of sha256sum on the plugin executable); got %q.", s)
			default:
				blk.SHA256 = strings.ToLower(s)
			}
		}
	}
	if a := c.Attributes["start_timeout"]; a != nil {
		if v, ok := d.duration(a); ok {
			if v <= 0 {
				d.errf(a.Expr.Range(), "Invalid start_timeout", "start_timeout must be positive, e.g. \"10s\".")
			} else {
				blk.StartTimeout = v
			}
		}
	}
	return blk
}

var rootSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "state_dir"}, {Name: "agent_path"}, {Name: "plugin_dirs"}, {Name: "log_level"}, {Name: "agent_timeout"},
		{Name: "output_max_total"}, {Name: "output_max_age"},
	},
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "driver", LabelNames: []string{"name"}},
		{Type: "scope", LabelNames: []string{"glob"}},
	},
}

var scopeSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "driver"}, {Name: "name"}, {Name: "image"}, {Name: "pull"}, {Name: "env"}, {Name: "env_passthrough"},
		{Name: "workdir"}, {Name: "user"}, {Name: "network"}, {Name: "allow_host_paths"},
		{Name: "isolation"}, {Name: "max_output"}, {Name: "runtime"},
	},
	Blocks: []hcl.BlockHeaderSchema{{Type: "mount"}, {Type: "resources"}, {Type: "retention"}, {Type: "pool"}},
}

var poolSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "size", Required: true}, {Name: "max_idle"}},
}

var mountSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "source", Required: true}, {Name: "target", Required: true}, {Name: "read_only"},
	},
}

var resourcesSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "cpus"}, {Name: "memory"}, {Name: "pids"}, {Name: "cpu_shares"}},
}

var retentionSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "on_close"}, {Name: "idle_ttl"}, {Name: "idle_action"}, {Name: "max_age"}},
}

// DefaultOutputMaxTotal is output_max_total's default, 256 MiB per session.
const DefaultOutputMaxTotal = 256 << 20

// DefaultOutputMaxAge is output_max_age's default, 7 days.
const DefaultOutputMaxAge = 7 * 24 * time.Hour

// DefaultAgentTimeout is agent_timeout's default, 10 seconds.
const DefaultAgentTimeout = 10 * time.Second

// LogLevels lists the accepted log levels of log_level (and of berth's --log-level
// and BERTH_LOG), as go-hclog names them (hclog.LevelFromString).
var LogLevels = []string{"trace", "debug", "info", "warn", "error", "off"}

func (d *decoder) config(body hcl.Body) *Config {
	cfg := &Config{Drivers: map[string]*DriverBlock{}}
	c := d.content(body, rootSchema, "the config file")
	if c == nil {
		return cfg
	}
	if a := c.Attributes["state_dir"]; a != nil {
		cfg.StateDir, _ = d.absPath(a, true)
	}
	if a := c.Attributes["agent_path"]; a != nil {
		cfg.AgentPath, _ = d.absPath(a, true)
	}
	if a := c.Attributes["agent_timeout"]; a != nil {
		if v, ok := d.duration(a); ok {
			if v <= 0 {
				d.errf(a.Expr.Range(), "Invalid duration", "agent_timeout must be positive, such as \"10s\".")
			} else {
				cfg.AgentTimeout = v
			}
		}
	}
	if a := c.Attributes["output_max_total"]; a != nil {
		if n, ok := d.sizeOrUnlimited(a, "output_max_total"); ok {
			cfg.OutputMaxTotal = n
		}
	}
	if a := c.Attributes["output_max_age"]; a != nil {
		if v, ok := d.duration(a); ok {
			if v <= 0 {
				d.errf(a.Expr.Range(), "Invalid duration", "output_max_age must be positive, such as \"7d\".")
			} else {
				cfg.OutputMaxAge = v
			}
		}
	}
	if a := c.Attributes["plugin_dirs"]; a != nil {
		if dirs, ok := d.strList(a); ok {
			for _, dir := range dirs {
				if !filepath.IsAbs(dir) {
					d.errf(a.Expr.Range(), "Invalid path", "plugin_dirs: %q is not an absolute path; write absolute paths.", dir)
					continue
				}
				cfg.PluginDirs = append(cfg.PluginDirs, filepath.Clean(dir))
			}
		}
	}
	if a := c.Attributes["log_level"]; a != nil {
		if s, ok := d.str(a); ok {
			if !slices.Contains(LogLevels, s) {
				d.errf(a.Expr.Range(), "Invalid log level", "log_level %q is not one of %s.", s, strings.Join(LogLevels, ", "))
			} else {
				cfg.LogLevel = s
			}
		}
	}
	// Third-party drivers: those in the plugin search path, and those whose
	// block names their plugin, become known before any name is checked.
	if d.finder != nil {
		for _, name := range d.finder(cfg.PluginDirs) {
			if !slices.Contains(d.known, name) {
				d.known = append(d.known, name)
			}
		}
	}
	for _, b := range c.Blocks {
		if b.Type != "driver" {
			continue
		}
		name := b.Labels[0]
		if prev, dup := cfg.Drivers[name]; dup {
			d.errf(b.LabelRanges[0], "Duplicate driver block", "driver %q is already configured at %s; merge the two blocks.", name, posString(prev.Range))
			continue
		}
		blk := d.driverBlock(b)
		if blk.Plugin != "" && !slices.Contains(d.known, name) {
			d.known = append(d.known, name)
		}
		if !d.driverName(b.LabelRanges[0], name) {
			continue
		}
		cfg.Drivers[name] = blk
	}
	firstShared := map[string]*Rule{}
	globAt := map[string]hcl.Range{}
	var catchAll *hcl.Range
	for _, b := range c.Blocks {
		switch b.Type {
		case "scope":
			glob, err := NormalizeGlob(b.Labels[0])
			if err != nil {
				d.errf(b.LabelRanges[0], "Invalid scope glob", "%v.", err)
				continue
			}
			if catchAll != nil {
				d.errf(b.LabelRanges[0], "Unreachable scope rule", "scope %q can never match: the rule at %s matches every session first. Move the catch-all rule to the end.", glob, posString(*catchAll))
			} else if prev, dup := globAt[glob]; dup {
				d.errf(b.LabelRanges[0], "Unreachable scope rule", "scope %q can never match: the rule at %s has the same glob. Remove one of them.", glob, posString(prev))
			}
			globAt[glob] = b.LabelRanges[0]
			if strings.Trim(glob, "*") == "" && catchAll == nil {
				r := b.LabelRanges[0]
				catchAll = &r
			}
			rule, ok := d.scope(b, glob)
			if !ok {
				continue
			}
			rule.Index = len(cfg.Rules)
			if rule.Isolation == IsolationShared {
				if prev := firstShared[rule.Name]; prev != nil {
					a, p := rule.Spec("", ""), prev.Spec("", "")
					if prev.Driver != rule.Driver || SpecHash(a) != SpecHash(p) {
						d.errf(b.LabelRanges[0], "Conflicting shared sandbox",
							"scope %q shares sandbox %q with the rule at %s but asks for a different driver or spec; give it its own name, or make the two rules identical.",
							glob, rule.Name, prev.Pos())
					}
				} else {
					r := rule
					firstShared[rule.Name] = &r
				}
			}
			cfg.Rules = append(cfg.Rules, rule)
		}
	}
	if len(cfg.Rules) == 0 && !d.diags.HasErrors() {
		// A config without scope rules runs everything on local, as no config does.
		cfg.Rules = defaultRules()
	}
	return cfg
}

// scope decodes one scope block into a Rule; false when it had errors (reported in
// d.diags).
func (d *decoder) scope(b *hcl.Block, glob string) (Rule, bool) {
	errs := len(d.diags)
	where := fmt.Sprintf("scope %q", glob)
	r := Rule{Glob: glob, Driver: "local", Isolation: IsolationSession, Retention: Retention{OnClose: OnCloseKeep, IdleAction: IdleStop}, Range: b.DefRange}
	c := d.content(b.Body, scopeSchema, where)
	if c == nil {
		return r, false
	}
	at := c.Attributes
	d.scopeDriver(at, b, where, &r)
	d.scopeIsolation(at, b, where, &r)
	d.scopeImage(at, where, &r)
	if a := at["user"]; a != nil {
		r.User, _ = d.str(a)
	}
	if a := at["max_output"]; a != nil {
		r.MaxOutput, _ = d.size(a, "max_output")
	}
	if a := at["network"]; a != nil {
		r.Network, _ = d.str(a)
	}
	if a := at["runtime"]; a != nil {
		if s, ok := d.str(a); ok {
			if err := ValidateRuntimeName(s); err != nil {
				d.errf(a.Expr.Range(), "Invalid runtime", "%v.", err)
			} else {
				r.Runtime = s
			}
		}
	}
	if a := at["workdir"]; a != nil {
		r.Workdir, _ = d.absPath(a, false)
	}
	if a := at["allow_host_paths"]; a != nil {
		r.AllowHostPaths, _ = d.boolean(a)
	}
	d.scopeEnv(at, &r)
	seen := map[string]hcl.Range{}
	for _, blk := range c.Blocks {
		if blk.Type != "mount" {
			if prev, dup := seen[blk.Type]; dup {
				d.errf(blk.TypeRange, "Duplicate block", "%s already has a %s block at %s; merge them.", where, blk.Type, posString(prev))
				continue
			}
			seen[blk.Type] = blk.TypeRange
		}
		switch blk.Type {
		case "mount":
			if m, ok := d.mount(blk, where); ok {
				r.Mounts = append(r.Mounts, m)
			}
		case "resources":
			d.resources(blk, where, &r.Resources)
		case "retention":
			d.retention(blk, where, &r.Retention)
		case "pool":
			r.Pool = d.pool(blk, where, r.Isolation)
		}
	}
	return r, len(d.diags) == errs
}

// MaxPoolSize is the largest pool size a rule may ask for.
const MaxPoolSize = 256

// pool decodes a scope's pool block (isolation "session" only; size 1 to
// MaxPoolSize; max_idle a duration, 0 or absent for never).
func (d *decoder) pool(blk *hcl.Block, where string, iso Isolation) *Pool {
	pc := d.content(blk.Body, poolSchema, where+" pool")
	if pc == nil {
		return nil
	}
	if iso == IsolationShared {
		d.errf(blk.TypeRange, "Pool with shared isolation", "%s has isolation = \"shared\": its sessions share one sandbox, so there is nothing to keep ready; remove the pool block, or use isolation = \"session\".", where)
		return nil
	}
	p := &Pool{}
	ok := true
	if a := pc.Attributes["size"]; a != nil {
		n, good := d.number(a)
		if good {
			v, acc := n.Int64()
			if acc != big.Exact || v < 1 || v > MaxPoolSize {
				d.errf(a.Expr.Range(), "Invalid pool size", "size must be a whole number from 1 to %d (sandboxes kept created and started); got %s.", MaxPoolSize, n.String())
				good = false
			}
			p.Size = int(v)
		}
		ok = ok && good
	}
	if a := pc.Attributes["max_idle"]; a != nil {
		var good bool
		p.MaxIdle, good = d.duration(a)
		ok = ok && good
	}
	if !ok {
		return nil
	}
	return p
}

// ValidateRuntimeName checks a scope's runtime: 1–64 characters of A–Z a–z 0–9 . _ -
// starting with a letter or digit, as Docker Engine's runtime names are written
// (dockerd --add-runtime NAME=PATH). Whether the driver offers it is checked against
// the driver (`berth config check`, and before every create). Error: which rule
// broke and how to fix it.
func ValidateRuntimeName(s string) error {
	ok := s != "" && len(s) <= 64
	for i, c := range s {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || !strings.ContainsRune("._-", c)) {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("runtime %q is not a runtime name (1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit, e.g. \"runsc\"); remove runtime for the engine's default", s)
	}
	return nil
}

// scopeDriver decodes a scope's driver (default local, which must then be known).
func (d *decoder) scopeDriver(at hcl.Attributes, b *hcl.Block, where string, r *Rule) {
	if a := at["driver"]; a != nil {
		if s, ok := d.str(a); ok && d.driverName(a.Expr.Range(), s) {
			r.Driver = s
		}
	} else if !slices.Contains(d.known, "local") {
		d.errf(b.DefRange, "Missing driver", "%s has no driver and \"local\" is not known; add driver = \"NAME\" (known: %s).", where, strings.Join(d.known, ", "))
	}
}

// scopeIsolation decodes isolation and the shared sandbox's name, which go together.
func (d *decoder) scopeIsolation(at hcl.Attributes, b *hcl.Block, where string, r *Rule) {
	if a := at["isolation"]; a != nil {
		if s, ok := d.str(a); ok {
			switch Isolation(s) {
			case IsolationSession, IsolationShared:
				r.Isolation = Isolation(s)
			default:
				d.errf(a.Expr.Range(), "Invalid isolation", "isolation %q is not \"session\" or \"shared\".", s)
			}
		}
	}
	a := at["name"]
	if a == nil {
		if r.Isolation == IsolationShared {
			d.errf(b.DefRange, "Missing shared name", "%s has isolation = \"shared\" but no name; add name = \"SANDBOX-NAME\" (the shared sandbox is named after it, so editing the glob orphans nothing).", where)
		}
		return
	}
	if s, ok := d.str(a); ok {
		if n, err := NormalizeSession(s); err != nil {
			d.errf(a.Expr.Range(), "Invalid shared name", "%v.", err)
		} else if r.Isolation != IsolationShared {
			d.errf(a.NameRange, "Name without shared isolation", "name only applies with isolation = \"shared\"; remove it or add isolation = \"shared\" to %s.", where)
		} else {
			r.Name = n
		}
	}
}

// scopeImage decodes image and its pull policy (default missing when an image is
// set; pull without an image is an error).
func (d *decoder) scopeImage(at hcl.Attributes, where string, r *Rule) {
	if a := at["image"]; a != nil {
		r.Image, _ = d.str(a)
	}
	a := at["pull"]
	if a == nil {
		if r.Image != "" {
			r.Pull = backend.PullMissing
		}
		return
	}
	if s, ok := d.str(a); ok {
		switch p := backend.PullPolicy(s); p {
		case backend.PullMissing, backend.PullAlways, backend.PullNever:
			r.Pull = p
		default:
			d.errf(a.Expr.Range(), "Invalid pull", "pull %q is not \"missing\", \"always\" or \"never\".", s)
		}
	}
	if r.Image == "" {
		d.errf(a.NameRange, "Pull without image", "pull only applies to a rule with an image; remove it or set image in %s.", where)
	}
}

// scopeEnv decodes env and env_passthrough: names non-empty without "=" or NUL,
// values without NUL.
func (d *decoder) scopeEnv(at hcl.Attributes, r *Rule) {
	if a := at["env"]; a != nil {
		if m, ok := d.strMap(a); ok {
			for _, k := range slices.Sorted(maps.Keys(m)) {
				switch {
				case k == "" || strings.ContainsAny(k, "=\x00"):
					d.errf(a.Expr.Range(), "Invalid environment variable", "env: %q is not a valid variable name (names are non-empty, without \"=\" or NUL).", k)
				case strings.ContainsRune(m[k], 0):
					d.errf(a.Expr.Range(), "Invalid environment variable", "env: the value of %s holds a NUL byte (at byte %d), which no environment variable can carry; remove it.", k, strings.IndexByte(m[k], 0)+1)
				}
			}
			r.Env = m
		}
	}
	if a := at["env_passthrough"]; a != nil {
		if l, ok := d.strList(a); ok {
			for _, k := range l {
				if k == "" || strings.ContainsAny(k, "=\x00") {
					d.errf(a.Expr.Range(), "Invalid environment variable", "env_passthrough: %q is not a valid variable name.", k)
				}
			}
			r.EnvPassthrough = l
		}
	}
}

// mount decodes a mount block; false when its body did not decode.
func (d *decoder) mount(blk *hcl.Block, where string) (backend.Mount, bool) {
	var m backend.Mount
	mc := d.content(blk.Body, mountSchema, where+" mount")
	if mc == nil {
		return m, false
	}
	if a := mc.Attributes["source"]; a != nil {
		m.Source, _ = d.absPath(a, false)
	}
	if a := mc.Attributes["target"]; a != nil {
		m.Target, _ = d.absPath(a, false)
	}
	if a := mc.Attributes["read_only"]; a != nil {
		m.ReadOnly, _ = d.boolean(a)
	}
	return m, true
}

// retention decodes a retention block into ret (whose defaults are already set).
func (d *decoder) retention(blk *hcl.Block, where string, ret *Retention) {
	rc := d.content(blk.Body, retentionSchema, where+" retention")
	if rc == nil {
		return
	}
	if a := rc.Attributes["on_close"]; a != nil {
		if s, ok := d.str(a); ok {
			switch OnClose(s) {
			case OnCloseKeep, OnCloseStop, OnCloseRemove:
				ret.OnClose = OnClose(s)
			default:
				d.errf(a.Expr.Range(), "Invalid on_close", "on_close %q is not \"keep\", \"stop\" or \"remove\".", s)
			}
		}
	}
	if a := rc.Attributes["idle_ttl"]; a != nil {
		ret.IdleTTL, _ = d.duration(a)
	}
	if a := rc.Attributes["idle_action"]; a != nil {
		if s, ok := d.str(a); ok {
			switch IdleAction(s) {
			case IdleStop, IdleRemove:
				ret.IdleAction = IdleAction(s)
			default:
				d.errf(a.Expr.Range(), "Invalid idle_action", "idle_action %q is not \"stop\" or \"remove\".", s)
			}
		}
	}
	if a := rc.Attributes["max_age"]; a != nil {
		ret.MaxAge, _ = d.duration(a)
	}
}

func (d *decoder) resources(blk *hcl.Block, where string, res *backend.Resources) {
	c := d.content(blk.Body, resourcesSchema, where+" resources")
	if c == nil {
		return
	}
	if a := c.Attributes["cpus"]; a != nil {
		if f, ok := d.number(a); ok {
			v, _ := f.Float64()
			if v <= 0 || v > 1e6 {
				d.errf(a.Expr.Range(), "Invalid cpus", "cpus must be a positive number, e.g. 1.5.")
			} else {
				res.CPUs = v
			}
		}
	}
	if a := c.Attributes["pids"]; a != nil {
		if f, ok := d.number(a); ok {
			v, acc := f.Int64()
			if !f.IsInt() || acc != big.Exact || v <= 0 {
				d.errf(a.Expr.Range(), "Invalid pids", "pids must be a positive whole number, e.g. 512.")
			} else {
				res.Pids = v
			}
		}
	}
	if a := c.Attributes["memory"]; a != nil {
		if n, ok := d.sizeOrUnlimited(a, "memory"); ok {
			res.MemoryBytes = n
		}
	}
	if a := c.Attributes["cpu_shares"]; a != nil {
		if f, ok := d.number(a); ok {
			v, acc := f.Int64()
			if !f.IsInt() || acc != big.Exact || v < 2 || v > 262144 {
				d.errf(a.Expr.Range(), "Invalid cpu_shares", "cpu_shares must be a whole number from 2 to 262144 (1024 is an ordinary container's weight, the default is 512).")
			} else {
				res.CPUShares = v
			}
		}
	}
}

// sizeOrUnlimited decodes a size attribute (see size) that may also be "unlimited",
// returned as -1.
func (d *decoder) sizeOrUnlimited(a *hcl.Attribute, what string) (int64, bool) {
	v, ok := d.value(a, cty.NilType, "")
	if !ok {
		return 0, false
	}
	if v.Type() == cty.String && v.AsString() == "unlimited" {
		return -1, true
	}
	return d.size(a, what)
}

// size decodes a positive size attribute: a whole number of bytes, or a string that
// ParseBytes accepts ("512m", "2g", "50KiB").
func (d *decoder) size(a *hcl.Attribute, what string) (int64, bool) {
	v, ok := d.value(a, cty.NilType, "")
	if !ok {
		return 0, false
	}
	title := "Invalid " + what
	switch v.Type() {
	case cty.Number:
		f := v.AsBigFloat()
		n, acc := f.Int64()
		if f.IsInt() && f.Sign() > 0 && (acc != big.Exact || n > MaxBytes) {
			d.errf(a.Expr.Range(), title, "%s: %s bytes is too large; the largest is %d bytes (4 EiB less one byte).", what, f.Text('f', 0), int64(MaxBytes))
			return 0, false
		}
		if !f.IsInt() || acc != big.Exact || n <= 0 {
			d.errf(a.Expr.Range(), title, "%s must be a positive whole number of bytes or a size such as \"512m\" or \"2g\".", what)
			return 0, false
		}
		return n, true
	case cty.String:
		n, err := ParseBytes(v.AsString())
		if err != nil {
			d.errf(a.Expr.Range(), title, "%s: %v.", what, err)
			return 0, false
		}
		return n, true
	}
	d.errf(a.Expr.Range(), title, "%s must be a number of bytes or a string such as \"512m\" or \"2g\".", what)
	return 0, false
}
