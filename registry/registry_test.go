package registry

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
)

// env holds one test's state dir, config file and the drivers its registries made.
type env struct {
	t        *testing.T
	stateDir string
	config   string
	mu       sync.Mutex
	drivers  []*hostDriver
}

func newEnv(t *testing.T, config string) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, stateDir: filepath.Join(dir, "state"), config: filepath.Join(dir, "config.hcl")}
	e.writeConfig(config)
	return e
}

func (e *env) writeConfig(src string) {
	e.t.Helper()
	if err := os.WriteFile(e.config, []byte(src), 0o600); err != nil {
		e.t.Fatal(err)
	}
}

// load loads the env's config file, checked against the known drivers; none means
// only "local", the fixture driver (the built-in list, catalog.Builtins, grows).
func (e *env) load(known ...string) (*config.Config, error) {
	if len(known) == 0 {
		known = []string{"local"}
	}
	return config.Load(e.config, config.WithKnownDrivers(known...))
}

// options are the env's registry options: its state dir, the fixture driver as
// "local" in this process and the fixture agent files; extra follow them, so a
// later WithDriver of the same name wins.
func (e *env) options(extra ...Option) []Option {
	return append([]Option{
		WithStateDir(e.stateDir),
		WithDriver("local", func() backend.TerminalBackend {
			d := &hostDriver{}
			e.mu.Lock()
			e.drivers = append(e.drivers, d)
			e.mu.Unlock()
			return d
		}),
		WithAgentPreparer(prepareFixture),
	}, extra...)
}

// openWith opens a registry on the env's config loaded with known (see load) and
// e.options(extra...).
func (e *env) openWith(known []string, extra ...Option) (*Registry, error) {
	cfg, err := e.load(known...)
	if err != nil {
		return nil, err
	}
	return Open(context.Background(), cfg, e.options(extra...)...)
}

func (e *env) open() *Registry {
	e.t.Helper()
	r, err := e.openWith(nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { r.Close() })
	return r
}

// creates counts fresh sandbox creations (across processes) from the driver's log.
func (e *env) creates() []string {
	b, err := os.ReadFile(filepath.Join(e.stateDir, "drivers", "local", "creates.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		e.t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// sandboxes lists the driver's sandbox dirs.
func (e *env) sandboxes() []string {
	ents, _ := os.ReadDir(filepath.Join(e.stateDir, "drivers", "local", "sb"))
	var out []string
	for _, x := range ents {
		out = append(out, x.Name())
	}
	return out
}

func (e *env) storeHash() string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.stateDir, StoreFile))
	if err != nil {
		e.t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}

// tree lists every path under the state dir except the driver's log.
func (e *env) tree() []string {
	var out []string
	filepath.WalkDir(e.stateDir, func(p string, d os.DirEntry, err error) error {
		out = append(out, strings.TrimPrefix(p, e.stateDir))
		return nil
	})
	return out
}

func records(t *testing.T, r *Registry) map[string]record {
	t.Helper()
	recs, err := r.store.all()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]record{}
	for _, rec := range recs {
		m[rec.Session] = rec
	}
	return m
}

const twoRules = `
scope "pool:*" {
  isolation = "shared"
  name      = "pool"
}
scope "keep:*" {
}
scope "stop:*" {
  retention {
    on_close = "stop"
  }
}
scope "rm:*" {
  env = { RULE = "rm" }
  retention {
    on_close = "remove"
  }
}
scope "bad:*" {
  image = "fail-create"
}
scope "*" {
  env = { RULE = "star" }
}
`

func run(t *testing.T, r *Registry, session string, argv ...string) (string, *Lease) {
	t.Helper()
	var out bytes.Buffer
	p, lease, err := r.Exec(context.Background(), session, backend.ExecRequest{Argv: argv, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatalf("Exec(%s, %v): %v", session, argv, err)
	}
	res, err := p.Wait()
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec(%s, %v) = %+v, %v; output %q", session, argv, res, err, out.String())
	}
	return out.String(), lease
}

func TestAcquireAndExec(t *testing.T) {
	e := newEnv(t, twoRules)
	r := e.open()
	ctx := context.Background()
	beforeCreate := time.Now().Truncate(time.Second) // the label has whole seconds
	l1, err := r.Acquire(ctx, "main")
	afterCreate := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	owner, _ := r.Owner()
	if l1.Sandbox != config.SandboxName(owner, "main") || l1.Driver != "local" || !l1.Created || l1.Drift || l1.Rule.Glob != "*" {
		t.Errorf("lease %+v", l1)
	}
	l2, err := r.Acquire(ctx, "main")
	if err != nil || l2.Sandbox != l1.Sandbox || l2.Created {
		t.Errorf("second Acquire: %+v %v", l2, err)
	}
	out, lease := run(t, r, "main", "sh", "-c", "echo $RULE; pwd")
	if out != "star\n"+e.driverDir(l1.Sandbox)+"\n" || lease.Sandbox != l1.Sandbox {
		t.Errorf("exec output %q lease %+v", out, lease)
	}
	// Agent files were prepared in STATE/sandboxes/DRIVER/SANDBOX.
	if _, err := os.Stat(filepath.Join(e.stateDir, "sandboxes", "local", l1.Sandbox, "agent", backend.AgentBinaryName)); err != nil {
		t.Error(err)
	}
	// The driver was configured once with its state dir, owner and config.
	if len(e.drivers) != 1 || e.drivers[0].setup.Owner != owner || e.drivers[0].setup.StateDir != filepath.Join(e.stateDir, "drivers", "local") ||
		string(e.drivers[0].setup.Config) != "{}" {
		t.Errorf("drivers %d, setup %+v", len(e.drivers), e.drivers[0].setup)
	}
	// Labels.
	sb, _ := e.drivers[0].Inspect(ctx, l1.Sandbox)
	if sb.Labels[backend.LabelOwner] != owner || sb.Labels[backend.LabelSession] != "main" || sb.Labels[backend.LabelScope] != "*" {
		t.Errorf("labels %v", sb.Labels)
	}
	if ts, err := time.Parse(time.RFC3339, sb.Labels[backend.LabelCreated]); err != nil || ts.Before(beforeCreate) || ts.After(afterCreate) {
		t.Errorf("created label %q", sb.Labels[backend.LabelCreated])
	}
	// Two sessions under a session-isolated rule get different sandboxes; two under a
	// shared rule the same one, labelled with the shared name.
	a, _ := r.Acquire(ctx, "keep:1")
	b, _ := r.Acquire(ctx, "keep:2")
	p1, _ := r.Acquire(ctx, "pool:1")
	p2, _ := r.Acquire(ctx, "pool:2/x")
	if a.Sandbox == b.Sandbox || p1.Sandbox != p2.Sandbox || p1.Sandbox != config.SharedSandboxName(owner, "pool") || p2.Created {
		t.Errorf("isolation: %s %s %s %s", a.Sandbox, b.Sandbox, p1.Sandbox, p2.Sandbox)
	}
	if sb, _ := e.drivers[0].Inspect(ctx, p1.Sandbox); sb.Labels[backend.LabelSession] != "pool" || sb.Labels[backend.LabelScope] != "pool:*" {
		t.Errorf("shared labels %v", sb.Labels)
	}
	recs := records(t, r)
	if len(recs) != 5 || recs["pool:2/x"].Sandbox != p1.Sandbox || recs["main"].Scope != "*" || recs["main"].SpecHash == "" {
		t.Errorf("records %+v", recs)
	}
}

// TestUnicodeSessionNames: a session name of printable Unicode works, and its NFC and
// NFD spellings are one session: one record (under the NFC name), one sandbox, one
// label value; a rule whose glob is written in NFD matches both. Nothing in the state
// dir is named after the raw name.
func TestUnicodeSessionNames(t *testing.T) {
	const nfc, nfd = "chat:g\u00e9n\u00e9ral", "chat:ge\u0301ne\u0301ral"
	e := newEnv(t, "scope \"chat:ge\u0301n*\" {\n  env = { RULE = \"accent\" }\n}\nscope \"*\" {\n}\n")
	r := e.open()
	ctx := context.Background()
	out, l1 := run(t, r, nfc, "sh", "-c", "echo $RULE")
	if out != "accent\n" || !l1.Created || l1.Session != nfc {
		t.Fatalf("exec in %q: output %q, lease %+v; want the rule with the NFD glob", nfc, out, l1)
	}
	out, l2 := run(t, r, nfd, "sh", "-c", "echo $RULE")
	if out != "accent\n" || l2.Sandbox != l1.Sandbox || l2.Created || l2.Session != nfc {
		t.Errorf("exec in the NFD spelling: output %q, lease %+v; want the NFC session's sandbox %s", out, l2, l1.Sandbox)
	}
	owner, _ := r.Owner()
	if l1.Sandbox != config.SandboxName(owner, nfc) {
		t.Errorf("sandbox %s, want the hash of the NFC name", l1.Sandbox)
	}
	if recs := records(t, r); len(recs) != 1 || recs[nfc].Sandbox != l1.Sandbox {
		t.Errorf("records %v, want one, under the NFC name", recs)
	}
	if sb, _ := e.drivers[0].Inspect(ctx, l1.Sandbox); sb.Labels[backend.LabelSession] != nfc || sb.Labels[backend.LabelScope] != "chat:g\u00e9n*" {
		t.Errorf("labels %v, want the NFC session and glob", sb.Labels)
	}
	if infos, err := r.Sessions(ctx); err != nil || len(infos) != 1 || infos[0].Session != nfc {
		t.Errorf("Sessions = %+v, %v", infos, err)
	}
	if x, err := r.Explain(nfd); err != nil || x.Session != nfc || x.Sandbox != l1.Sandbox {
		t.Errorf("Explain(NFD) = %+v, %v", x, err)
	}
	for _, p := range e.tree() {
		if strings.Contains(p, "chat") || strings.ContainsFunc(p, func(r rune) bool { return r > 0x7f }) {
			t.Errorf("state dir path %q holds session text", p)
		}
	}
	if _, err := r.Acquire(ctx, "chat:a\u200bb"); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "U+200B") {
		t.Errorf("a zero-width space: %v, want ErrInvalid naming U+200B", err)
	}
	if err := r.RemoveSession(ctx, nfd); err != nil {
		t.Fatal(err)
	}
	if recs := records(t, r); len(recs) != 0 || len(e.sandboxes()) != 0 {
		t.Errorf("after RemoveSession(NFD): records %v, sandboxes %v", recs, e.sandboxes())
	}
}

func (e *env) driverDir(sandbox string) string {
	return filepath.Join(e.stateDir, "drivers", "local", "sb", sandbox)
}

// TestLastUse: on the registry's clock (Options.Now), not the wall clock, whose
// steps a fast or a loaded machine may not see.
func TestLastUse(t *testing.T) {
	e := newEnv(t, twoRules)
	clk := newClock()
	r := e.openClock(clk)
	ctx := context.Background()
	if _, err := r.Acquire(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	before := records(t, r)["main"].LastUsed
	if !before.Equal(clk.Now()) {
		t.Errorf("last use at acquire %v, want the clock's %v", before, clk.Now())
	}
	// Exec touches last use at start ...
	clk.Advance(time.Minute)
	pr, pw, _ := os.Pipe()
	defer pr.Close()
	p, _, err := r.Exec(ctx, "main", backend.ExecRequest{Argv: []string{"cat"}, Stdin: true, Stdout: pw})
	if err != nil {
		t.Fatal(err)
	}
	started := records(t, r)["main"].LastUsed
	if !started.Equal(before.Add(time.Minute)) {
		t.Errorf("last use not touched at start: %v then %v", before, started)
	}
	// ... and at the end.
	p.Write([]byte("x\n"))
	bufio.NewReader(pr).ReadString('\n')
	clk.Advance(time.Minute)
	p.CloseStdin()
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	ended := records(t, r)["main"].LastUsed
	if !ended.Equal(started.Add(time.Minute)) {
		t.Errorf("last use not touched at end: %v then %v", started, ended)
	}
	infos, err := r.Sessions(ctx)
	if err != nil || len(infos) != 1 || !infos[0].LastUsed.Equal(ended) {
		t.Errorf("Sessions %+v %v", infos, err)
	}
}

func TestConcurrentAcquire(t *testing.T) {
	e := newEnv(t, twoRules)
	r := e.open()
	sessions := []string{"s1", "s2", "s3", "chat:4", "sub/5"}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	got := make([]string, 20)
	start := make(chan struct{})
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			l, err := r.Acquire(context.Background(), sessions[i%5])
			if err != nil {
				errs <- err
				return
			}
			got[i] = l.Sandbox
		}(i)
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if c := e.creates(); len(c) != 5 {
		t.Errorf("%d creates, want 5: %v", len(c), c)
	}
	if len(e.sandboxes()) != 5 || len(records(t, r)) != 5 {
		t.Errorf("%d sandboxes, %d records", len(e.sandboxes()), len(records(t, r)))
	}
	for i := range got {
		if got[i] != got[i%5] {
			t.Errorf("goroutine %d got %s, goroutine %d got %s", i, got[i], i%5, got[i%5])
		}
	}
}

// TestHelperProcess is not a test: TestConcurrentProcesses runs the test binary with
// BERTH_REGISTRY_HELPER set, and this opens a registry on the given state dir and
// acquires every session, concurrently, once stdin closes.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("BERTH_REGISTRY_HELPER") == "" {
		t.Skip("helper process for TestConcurrentProcesses")
	}
	e := &env{t: t, stateDir: os.Getenv("BERTH_REGISTRY_STATE"), config: os.Getenv("BERTH_REGISTRY_CONFIG")}
	r, err := e.openWith(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	var wg sync.WaitGroup
	for _, s := range strings.Fields(os.Getenv("BERTH_REGISTRY_SESSIONS")) {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := r.Acquire(context.Background(), s)
				if err != nil {
					t.Error(err)
					return
				}
				fmt.Println("acquired", s, l.Sandbox)
			}()
		}
	}
	wg.Wait()
}

func TestConcurrentProcesses(t *testing.T) {
	e := newEnv(t, twoRules)
	sessions := "p1 p2 p3 chat:4 sub/5"
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Reader
	}
	var children []child
	for i := 0; i < 4; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
		cmd.Env = append(os.Environ(), "BERTH_REGISTRY_HELPER=1", "BERTH_REGISTRY_STATE="+e.stateDir,
			"BERTH_REGISTRY_CONFIG="+e.config, "BERTH_REGISTRY_SESSIONS="+sessions)
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := child{cmd, stdin, bufio.NewReader(stdout)}
		if line, err := c.out.ReadString('\n'); err != nil || line != "ready\n" {
			t.Fatalf("child said %q, %v", line, err)
		}
		children = append(children, c)
	}
	for _, c := range children {
		c.stdin.Close() // all children go at once
	}
	acquired := map[string]map[string]bool{}
	for _, c := range children {
		rest, _ := io.ReadAll(c.out)
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("child: %v\n%s", err, rest)
		}
		for _, line := range strings.Split(string(rest), "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[0] == "acquired" {
				if acquired[f[1]] == nil {
					acquired[f[1]] = map[string]bool{}
				}
				acquired[f[1]][f[2]] = true
			}
		}
	}
	if len(acquired) != 5 {
		t.Errorf("acquired %v", acquired)
	}
	for s, sbs := range acquired {
		if len(sbs) != 1 {
			t.Errorf("session %s got sandboxes %v", s, sbs)
		}
	}
	if c := e.creates(); len(c) != 5 {
		t.Errorf("%d creates across 4 processes, want 5: %v", len(c), c)
	}
	r := e.open()
	if n := len(records(t, r)); n != 5 {
		t.Errorf("%d records, want 5", n)
	}
}

func TestStoreSchemaAndOwner(t *testing.T) {
	e := newEnv(t, twoRules)
	r := e.open()
	if _, err := os.Stat(e.stateDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open created the state dir: %v", err)
	}
	owner, err := r.Owner()
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(owner) {
		t.Errorf("owner %q", owner)
	}
	r.Close()
	db, err := bolt.Open(filepath.Join(e.stateDir, StoreFile), 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket([]byte("meta"))
		if m == nil || string(m.Get([]byte("schema"))) != "1" || string(m.Get([]byte("owner"))) != owner {
			t.Errorf("meta bucket: schema %q owner %q", m.Get([]byte("schema")), m.Get([]byte("owner")))
		}
		return nil
	})
	db.Close()
	// The owner is generated once.
	r2 := e.open()
	if o2, _ := r2.Owner(); o2 != owner {
		t.Errorf("owner changed: %s → %s", owner, o2)
	}
	// A newer schema is refused.
	db, _ = bolt.Open(filepath.Join(e.stateDir, StoreFile), 0o600, nil)
	db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("schema"), []byte("99")) })
	db.Close()
	r3 := e.open()
	if _, err := r3.Acquire(context.Background(), "main"); err == nil || !strings.Contains(err.Error(), "schema version 99, newer than this berth's 2") {
		t.Errorf("newer schema: %v", err)
	}
}

// TestFailedCallsChangeNothing: each failing call leaves the store file byte for
// byte unchanged, creates no sandbox and no sandbox dir.
func TestFailedCallsChangeNothing(t *testing.T) {
	e := newEnv(t, twoRules)
	r := e.open()
	ctx := context.Background()
	if _, err := r.Acquire(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	hash, tree, sbs := e.storeHash(), e.tree(), e.sandboxes()
	var unchanged func(what string)
	check := func(what string, err error, kind error, want string) {
		t.Helper()
		if err == nil || !errors.Is(err, kind) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %v saying %q", what, err, kind, want)
		}
		unchanged(what)
	}
	unchanged = func(what string) {
		t.Helper()
		if h := e.storeHash(); h != hash {
			t.Errorf("%s changed the store", what)
		}
		if got := e.tree(); strings.Join(got, "\n") != strings.Join(tree, "\n") {
			t.Errorf("%s changed the state dir:\nbefore %v\nafter  %v", what, tree, got)
		}
		if got := e.sandboxes(); len(got) != len(sbs) {
			t.Errorf("%s left sandboxes %v", what, got)
		}
	}
	_, err := r.Acquire(ctx, "../etc")
	check("bad session", err, backend.ErrInvalid, `session name "../etc"`)
	_, err = r.Acquire(ctx, "/main")
	check("leading slash", err, backend.ErrInvalid, `session name "/main"`)
	_, err = r.Acquire(ctx, strings.Repeat("s", 300))
	check("long session", err, backend.ErrInvalid, "is 300 characters long")
	_, err = r.Acquire(ctx, "bad:1")
	check("failing create", err, backend.ErrUnavailable, `session "bad:1": creating sandbox`)
	_, _, err = r.Exec(ctx, "rm:new", backend.ExecRequest{Argv: []string{"true"}, Dir: "/nonexistent/dir"})
	check("exec with missing workdir in a new session", err, backend.ErrInvalid, "/nonexistent/dir does not exist")
	_, _, err = r.Exec(ctx, "main", backend.ExecRequest{Argv: []string{"true"}, Dir: "/nonexistent/dir"})
	check("exec with missing workdir in an existing session", err, backend.ErrInvalid, "/nonexistent/dir does not exist")
	_, _, err = r.Exec(ctx, "main", backend.ExecRequest{})
	check("empty argv", err, backend.ErrInvalid, "empty argv")
	// Close and remove of a session with nothing to do succeed (idempotent, as
	// backend Stop and Remove are) and change nothing.
	for _, s := range []string{"keep:never", "stop:never", "rm:never", "pool:never", "never"} {
		if err := r.CloseSession(ctx, s); err != nil {
			t.Errorf("close of the unknown session %s: %v, want nil", s, err)
		}
		unchanged("close of the unknown session " + s)
		if err := r.RemoveSession(ctx, s); err != nil {
			t.Errorf("remove of the unknown session %s: %v, want nil", s, err)
		}
		unchanged("remove of the unknown session " + s)
	}
	err = r.CloseSession(ctx, "a//b")
	check("close of a bad session", err, backend.ErrInvalid, "empty path component")
	err = r.RemoveSession(ctx, "a//b")
	check("remove of a bad session", err, backend.ErrInvalid, "empty path component")

	// An existing sandbox that fails to start is reported as such, not as a create.
	if _, err := r.Acquire(ctx, "keep:s"); err != nil {
		t.Fatal(err)
	}
	if err := r.StopSession(ctx, "keep:s"); err != nil {
		t.Fatal(err)
	}
	owner, _ := r.Owner()
	os.WriteFile(filepath.Join(e.driverDir(config.SandboxName(owner, "keep:s")), "fail-start"), nil, 0o600)
	hash, tree, sbs = e.storeHash(), e.tree(), e.sandboxes()
	_, err = r.Acquire(ctx, "keep:s")
	check("failing start of an existing sandbox", err, backend.ErrUnavailable, `session "keep:s": starting its existing sandbox `+config.SandboxName(owner, "keep:s")+" (stopped) on driver local: runtime cannot start")

	// A name held by another owner: ErrConflict propagates, nothing recorded.
	foreign := config.SandboxName(owner, "keep:theirs")
	os.MkdirAll(e.driverDir(foreign), 0o700)
	os.WriteFile(filepath.Join(e.driverDir(foreign), "meta.json"), []byte(`{"Labels":{"berth.owner":"someone-else"},"State":"running"}`), 0o600)
	tree, sbs = e.tree(), e.sandboxes()
	_, err = r.Acquire(ctx, "keep:theirs")
	check("foreign sandbox", err, backend.ErrConflict, "another owner")
}

// A session's creation time is the same before and after its sandbox is stopped
// and started again (the start adopts it and reads LabelCreated back).
func TestCreatedSurvivesStopStart(t *testing.T) {
	e := newEnv(t, twoRules)
	r := e.open()
	ctx := context.Background()
	created := func() time.Time {
		t.Helper()
		infos, err := r.Sessions(ctx)
		if err != nil || len(infos) != 1 {
			t.Fatalf("sessions: %v, %+v", err, infos)
		}
		return infos[0].Created
	}
	if _, err := r.Acquire(ctx, "keep:s"); err != nil {
		t.Fatal(err)
	}
	before := created()
	if err := r.StopSession(ctx, "keep:s"); err != nil {
		t.Fatal(err)
	}
	if l, err := r.Acquire(ctx, "keep:s"); err != nil || l.Created {
		t.Fatalf("the second Acquire: %v, %+v; want the stopped sandbox started", err, l)
	}
	if after := created(); !after.Equal(before) {
		t.Errorf("created %v before the stop, %v after the start", before, after)
	}
}

func TestNoRuleMatches(t *testing.T) {
	e := newEnv(t, "scope \"chat:*\" {\n}\n")
	r := e.open()
	_, err := r.Acquire(context.Background(), "main")
	if err == nil || !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), `session "main" matches no scope rule in `+e.config) ||
		!strings.Contains(err.Error(), `scope "*"`) {
		t.Errorf("error %v", err)
	}
	if _, err := os.Stat(e.stateDir); !errors.Is(err, os.ErrNotExist) {
		t.Error("a failed call created the state dir")
	}
}

func TestLongStateDir(t *testing.T) {
	e := newEnv(t, twoRules)
	base := filepath.Dir(e.stateDir)
	long := base + "/"
	for len(long) < 150 {
		long += "d"
	}
	long = long[:149] + "s"
	if len(long) != 150 {
		t.Fatal(len(long))
	}
	e.stateDir = long
	r := e.open()
	out, lease := run(t, r, "chat:1", "sh", "-c", "echo ok")
	if out != "ok\n" {
		t.Errorf("output %q", out)
	}
	if err := r.RemoveSession(context.Background(), "chat:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(long, "sandboxes", "local", lease.Sandbox)); !errors.Is(err, os.ErrNotExist) {
		t.Error("sandbox dir left behind")
	}
}

func TestCloseSession(t *testing.T) {
	e := newEnv(t, twoRules)
	r := e.open()
	ctx := context.Background()
	state := func(session string) string {
		infos, err := r.Sessions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			if in.Session == session {
				return in.State
			}
		}
		return "no record"
	}
	for _, s := range []string{"keep:1", "stop:1", "rm:1", "pool:1", "pool:2"} {
		if _, err := r.Acquire(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{"keep:1", "stop:1", "rm:1", "pool:1"} {
		if err := r.CloseSession(ctx, s); err != nil {
			t.Errorf("CloseSession(%s): %v", s, err)
		}
	}
	if st := state("keep:1"); st != "running" {
		t.Errorf("keep: %s", st)
	}
	if st := state("stop:1"); st != "stopped" {
		t.Errorf("stop: %s", st)
	}
	if st := state("rm:1"); st != "no record" {
		t.Errorf("remove: %s", st)
	}
	if st := state("pool:1"); st != "running" {
		t.Errorf("shared: %s (a single session's close must be ignored)", st)
	}
	owner, _ := r.Owner()
	rmSandbox := config.SandboxName(owner, "rm:1")
	if _, err := os.Stat(e.driverDir(rmSandbox)); !errors.Is(err, os.ErrNotExist) {
		t.Error("on_close remove left the sandbox")
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, "sandboxes", "local", rmSandbox)); !errors.Is(err, os.ErrNotExist) {
		t.Error("on_close remove left STATE/sandboxes/local/SANDBOX")
	}
	// A stopped sandbox starts again on the next exec.
	if out, _ := run(t, r, "stop:1", "echo", "again"); out != "again\n" || state("stop:1") != "running" {
		t.Errorf("exec after stop: %q, %s", out, state("stop:1"))
	}
	// The removed session comes back fresh.
	if l, err := r.Acquire(ctx, "rm:1"); err != nil || !l.Created {
		t.Errorf("re-acquire after remove: %+v %v", l, err)
	}
}

func TestRemoveSession(t *testing.T) {
	e := newEnv(t, twoRules)
	r := e.open()
	ctx := context.Background()
	for _, s := range []string{"keep:1", "pool:1", "pool:2", "main"} {
		if _, err := r.Acquire(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.RemoveSession(ctx, "keep:1"); err != nil {
		t.Fatal(err)
	}
	// Removing a shared session removes the shared sandbox and forgets every
	// session on it.
	if err := r.RemoveSession(ctx, "pool:2"); err != nil {
		t.Fatal(err)
	}
	recs := records(t, r)
	if len(recs) != 1 || recs["main"].Session == "" {
		t.Errorf("records after remove: %v", recs)
	}
	if sbs := e.sandboxes(); len(sbs) != 1 {
		t.Errorf("sandboxes after remove: %v", sbs)
	}
	// Lock files of removed sandboxes are gone too; main's lock and busy marker stay.
	locks, _ := os.ReadDir(filepath.Join(e.stateDir, "locks"))
	main := recs["main"].Sandbox
	for _, l := range locks {
		if !strings.HasPrefix(l.Name(), main+".") {
			t.Errorf("lock file %s of a removed sandbox left", l.Name())
		}
	}
	if err := r.RemoveSession(ctx, "keep:1"); err != nil {
		t.Errorf("second remove: %v, want nil (nothing to do)", err)
	}
	if err := r.CloseSession(ctx, "keep:1"); err != nil {
		t.Errorf("close after remove: %v, want nil (nothing to do)", err)
	}
}

func TestDriftAndSessions(t *testing.T) {
	e := newEnv(t, twoRules)
	r := e.open()
	ctx := context.Background()
	for _, s := range []string{"main", "keep:1", "gone:1"} {
		if _, err := r.Acquire(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	r.Close()
	// Change the "*" rule's env; keep:* is unchanged.
	e.writeConfig(strings.Replace(twoRules, `RULE = "star"`, `RULE = "star2"`, 1))
	r = e.open()
	l, err := r.Acquire(ctx, "main")
	if err != nil || !l.Drift || l.Created {
		t.Errorf("changed rule: %+v %v", l, err)
	}
	l, err = r.Acquire(ctx, "keep:1")
	if err != nil || l.Drift {
		t.Errorf("unchanged rule: %+v %v", l, err)
	}
	// The sandbox of gone:1 disappears behind our back.
	owner, _ := r.Owner()
	os.RemoveAll(e.driverDir(config.SandboxName(owner, "gone:1")))
	infos, err := r.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, in := range infos {
		names = append(names, in.Session)
	}
	if !sort.StringsAreSorted(names) || len(infos) != 3 {
		t.Fatalf("sessions %v", names)
	}
	byName := map[string]SessionInfo{}
	for _, in := range infos {
		byName[in.Session] = in
	}
	if in := byName["main"]; !in.Drift || !strings.Contains(in.DriftReason, "spec differs") || in.State != "running" || in.Driver != "local" {
		t.Errorf("main: %+v", in)
	}
	if in := byName["keep:1"]; in.Drift || in.State != "running" || in.Scope != "keep:*" {
		t.Errorf("keep:1: %+v", in)
	}
	if in := byName["gone:1"]; in.State != StateMissing {
		t.Errorf("gone:1: %+v", in)
	}
	// A sandbox whose rule became shared is reported as drift too.
	r.Close()
	e.writeConfig("scope \"*\" {\n  isolation = \"shared\"\n  name = \"all\"\n}\n")
	r = e.open()
	infos, _ = r.Sessions(ctx)
	for _, in := range infos {
		if !in.Drift || !strings.Contains(in.DriftReason, "now maps it to sandbox") {
			t.Errorf("%s: %+v", in.Session, in)
		}
	}
}

func TestSessionsWithoutStoreCreatesNothing(t *testing.T) {
	e := newEnv(t, twoRules)
	r := e.open()
	infos, err := r.Sessions(context.Background())
	if err != nil || len(infos) != 0 {
		t.Errorf("%v %v", infos, err)
	}
	if _, err := os.Stat(e.stateDir); !errors.Is(err, os.ErrNotExist) {
		t.Error("Sessions created the state dir")
	}
	// Nor do close and remove, which have nothing to do.
	for _, s := range []string{"rm:1", "stop:1", "keep:1"} {
		if err := r.CloseSession(context.Background(), s); err != nil {
			t.Errorf("CloseSession(%s) without a store: %v", s, err)
		}
		if err := r.RemoveSession(context.Background(), s); err != nil {
			t.Errorf("RemoveSession(%s) without a store: %v", s, err)
		}
	}
	if _, err := os.Stat(e.stateDir); !errors.Is(err, os.ErrNotExist) {
		t.Error("CloseSession or RemoveSession created the state dir")
	}
}

func TestDriversAndBackend(t *testing.T) {
	e := newEnv(t, "driver \"local\" {\n  note = \"hi\"\n  grace = \"1d\"\n}\n")
	r := e.open()
	ctx := context.Background()
	ds, err := r.Drivers(ctx)
	if err != nil || len(ds) != 1 || ds[0].Name != "local" || ds[0].Err != nil || ds[0].Info.Version != "test" {
		t.Fatalf("Drivers = %+v, %v", ds, err)
	}
	b, err := r.Backend(ctx, "local")
	if err != nil || b != backend.TerminalBackend(e.drivers[0]) {
		t.Errorf("Backend: %v", err)
	}
	if len(e.drivers) != 1 || string(e.drivers[0].setup.Config) != `{"grace":"24h0m0s","note":"hi"}` {
		t.Errorf("config JSON %s (drivers %d)", e.drivers[0].setup.Config, len(e.drivers))
	}
	if _, err := r.Backend(ctx, "docker"); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("unknown driver: %v", err)
	}
	r.Close()
	if _, err := r.Backend(ctx, "local"); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("after Close: %v", err)
	}

	// A driver block the driver's schema rejects: file:line:col, valid settings.
	e.writeConfig("driver \"local\" {\n  nope = 1\n}\n")
	r = e.open()
	_, err = r.Acquire(ctx, "main")
	if err == nil || !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), e.config+":2:3: error: Unsupported argument") ||
		!strings.Contains(err.Error(), "Valid settings: grace (duration), note (string).") {
		t.Errorf("bad driver config: %v", err)
	}
	ds, _ = r.Drivers(ctx)
	if ds[0].Err == nil {
		t.Error("Drivers did not report the config error")
	}
}

func TestExplain(t *testing.T) {
	e := newEnv(t, twoRules)
	r := e.open()
	ex, err := r.Explain("rm:7")
	if err != nil {
		t.Fatal(err)
	}
	owner, _ := r.Owner()
	if ex.Rule.Glob != "rm:*" || ex.RuleIndex != 3 || ex.Position != e.config+":13:1" || ex.Driver != "local" ||
		ex.Sandbox != config.SandboxName(owner, "rm:7") || ex.Spec.Env[0] != "RULE=rm" || ex.SpecHash != config.SpecHash(ex.Spec) ||
		ex.Isolation != config.IsolationSession {
		t.Errorf("%+v", ex)
	}
	if len(e.drivers) != 0 {
		t.Error("Explain started a driver")
	}
	if _, err := r.Explain(".."); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("bad session: %v", err)
	}
}

// Open reads no environment and no file: the state dir comes from WithStateDir, else
// the config's state_dir, else Open fails naming the option; a relative one is made
// absolute; a nil config is config.Default(); bad options are refused, named.
func TestOpenSettings(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(config.EnvStateDir, dir+"/from-env")
	t.Setenv(config.EnvConfig, dir+"/missing.hcl")
	t.Setenv(config.EnvLog, "loud")
	t.Setenv("XDG_STATE_HOME", dir+"/xdg")
	open := func(cfg *config.Config, opts ...Option) *Registry {
		t.Helper()
		r, err := Open(context.Background(), cfg, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	r := open(nil, WithStateDir(dir+"/opt"))
	if r.StateDir() != dir+"/opt" || r.Config().Path != "" || len(r.Config().Rules) != 1 || r.Config().Rules[0].Pos() != "(built-in default)" {
		t.Errorf("nil config: %s %+v", r.StateDir(), r.Config())
	}
	cfg, err := config.Parse([]byte("state_dir = \""+dir+"/from-file\"\n"), "c.hcl", config.WithKnownDrivers("local"))
	if err != nil {
		t.Fatal(err)
	}
	if r := open(cfg); r.StateDir() != dir+"/from-file" {
		t.Errorf("the config's state_dir: %s", r.StateDir())
	}
	if r := open(cfg, WithStateDir(dir+"/opt")); r.StateDir() != dir+"/opt" {
		t.Errorf("WithStateDir over state_dir: %s", r.StateDir())
	}
	t.Chdir(dir)
	if r := open(nil, WithStateDir("rel")); r.StateDir() != filepath.Join(dir, "rel") {
		t.Errorf("relative state dir: %s", r.StateDir())
	}
	for _, c := range []struct {
		name string
		opts []Option
		want string
	}{
		{"no state dir", nil, "no state dir; pass registry.WithStateDir(DIR) or set state_dir in the config"},
		{"empty state dir", []Option{WithStateDir("")}, "registry.WithStateDir: the state dir is empty"},
		{"empty berth binary", []Option{WithStateDir(dir), WithBerthBinary("")}, "registry.WithBerthBinary"},
		{"nameless driver", []Option{WithStateDir(dir), WithDriver("", func() backend.TerminalBackend { return &hostDriver{} })}, `registry.WithDriver("")`},
		{"driver without constructor", []Option{WithStateDir(dir), WithDriver("x", nil)}, `registry.WithDriver("x")`},
		{"plugin without path", []Option{WithStateDir(dir), WithPlugin("x", "")}, `registry.WithPlugin("x", "")`},
		{"zero store timeout", []Option{WithStateDir(dir), WithStoreTimeout(0)}, "registry.WithStoreTimeout(0s)"},
		{"negative grace", []Option{WithStateDir(dir), WithOrphanGrace(-time.Second)}, "registry.WithOrphanGrace(-1s)"},
	} {
		if _, err := Open(context.Background(), nil, c.opts...); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid containing %q", c.name, err, c.want)
		}
	}
	// The drivers of WithDriver and WithPlugin are known besides the config's.
	r = open(nil, WithStateDir(dir), WithDriver("mock", func() backend.TerminalBackend { return &hostDriver{} }), WithPlugin("ext", "/bin/false"))
	if _, err := r.Backend(context.Background(), "nope"); err == nil || !strings.Contains(err.Error(), "known drivers: [containerd docker ext kubernetes local mock]") {
		t.Errorf("known drivers: %v", err)
	}
}

func TestUnwritableStateDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	bad := filepath.Join(file, "state")
	before, _ := os.ReadDir(dir)
	e := &env{t: t, stateDir: bad}
	_, err := Open(context.Background(), nil, e.options()...)
	if err == nil || !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "state dir "+bad+" cannot be written: "+file+" is not a directory") ||
		!strings.Contains(err.Error(), "--state-dir or BERTH_STATE_DIR") {
		t.Errorf("state dir under a file: %v", err)
	}
	if after, _ := os.ReadDir(dir); len(after) != len(before) {
		t.Error("something was created")
	}
	if os.Geteuid() != 0 {
		ro := filepath.Join(dir, "ro")
		os.Mkdir(ro, 0o500)
		_, err := Open(context.Background(), nil, e.options(WithStateDir(filepath.Join(ro, "a", "b")))...)
		if err == nil || !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), ro) {
			t.Errorf("read-only parent: %v", err)
		}
		if ents, _ := os.ReadDir(ro); len(ents) != 0 {
			t.Error("something was created in the read-only dir")
		}
	}
	// A path under /proc or /sys, or /sys itself, cannot hold the state dir, though
	// access(2) allows it to root: Open refuses it, naming the path and the option
	// (and, for root, the filesystem, unless it is mounted read-only; others meet
	// access(2)'s refusal first).
	for _, bad := range []string{"/proc/berth-test-state/x", "/sys/berth-test-state", "/sys"} {
		_, err := Open(context.Background(), nil, e.options(WithStateDir(bad))...)
		if err == nil || !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "registry.WithStateDir") ||
			(os.Geteuid() == 0 && !strings.Contains(err.Error(), "filesystem, a kernel interface where berth cannot keep its files") && !strings.Contains(err.Error(), "read-only file system")) {
			t.Errorf("state dir %s: %v", bad, err)
		}
	}
}
