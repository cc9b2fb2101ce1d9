package cli

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-sh/berth/cli/front"
	"github.com/berth-sh/berth/cli/internal/execrun"
)

// TestFrontParsesAsCobra: every command line that the berth front takes itself
// (front.Takes) gives the flags and the command that berth-cli's exec command
// (cobra and pflag) gives for it; and the front takes the forms it is meant to, and
// hands the others over.
func TestFrontParsesAsCobra(t *testing.T) {
	t.Setenv("BERTH_SESSION", "")
	for _, c := range []struct {
		args  string // split on |
		takes bool
	}{
		{"exec|--|true", true},
		{"exec|true", true},
		{"exec|-s|chat:1|--|sh|-c|echo hi", true},
		{"exec|-schat:1|--|true", true},
		{"exec|-s=chat:1|--|true", true},
		{"exec|-s=|--|true", true},
		{"exec|--session|chat:1|true|-x", true},
		{"exec|--session=chat:1|--|true", true},
		{"exec|--session=|--|true", true},
		{"exec|-e|A=1|-eB=2|--env|C=3|--env=D=4|-e=E=5|--|env", true},
		{"exec|-w|/tmp|--workdir=/src|--|pwd", true},
		{"exec|--timeout|30s|--|true", true},
		{"exec|--timeout=1d|--|true", true},
		{"exec|-s|a|-s|b|--|true", true},
		{"exec|-s|--|true", false}, // -s took "--" (pflag): berth-cli's -s refuses it, naming the missing name
		{"exec|--session|--|true", false},
		{"exec|--|--|true", true},
		{"exec|-|x", true},
		{"exec|--|-s|x", true},
		{"exec|--timeout|bogus|--|true", false},
		{"exec|--timeout|-1s|--|true", false},
		{"exec|-i|--|cat", false},
		{"exec|-t|--|sh", false},
		{"exec|-it|--|sh", false},
		{"exec|-si|--|true", true}, // -s with value "i"
		{"exec|--json|--|true", false},
		{"exec|--shell|pwd", false},
		{"exec|--recreate|--|true", false},
		{"exec|--max-output|10|--|true", false},
		{"exec|-h", false},
		{"exec|--help", false},
		{"exec|--sess|x|--|true", false},
		{"exec|--", false},
		{"exec|-s|x", false},
		{"exec|-s", false},
		{"exec", false},
		{"--no-daemon|exec|--|true", false},
		{"--state-dir|/x|exec|--|true", false},
		{"exec|--state-dir|/x|--|true", false},
		{"exec|--no-daemon|--|true", false},
		{"sessions", false},
		{"version", false},
	} {
		args := strings.Split(c.args, "|")
		f, argv, ok := front.Takes(args)
		if ok != c.takes {
			t.Errorf("front.Takes(%q) = %v, want %v", args, ok, c.takes)
			continue
		}
		if !ok {
			continue
		}
		want := &execrun.Flags{}
		cmd := execCmd(&globals{}, want)
		if err := cmd.ParseFlags(args[1:]); err != nil {
			t.Errorf("%q: the front takes it, cobra refuses it: %v", args, err)
			continue
		}
		wantArgv := cmd.Flags().Args()
		if !reflect.DeepEqual(f, want) || !slices.Equal(argv, wantArgv) {
			t.Errorf("%q: front %+v %q, cobra %+v %q", args, *f, argv, *want, wantArgv)
		}
	}
}

// frontAlone copies the berth front into a directory of its own: without berth-cli
// beside it, any command line that it hands over fails (exit 125, naming berth-cli
// and the build), so a success proves that the front ran the call itself.
func frontAlone(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "berth")
	copyFile(t, berthBin, p)
	return p
}

// runFront runs the front at path with e's environment.
func (e *env) runFront(path string, args ...string) result {
	e.t.Helper()
	cmd := e.command(args...)
	cmd.Path, cmd.Args[0] = path, path
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil && !isExitError(err) {
		e.t.Fatal(err)
	}
	return result{stdout: out.String(), stderr: errb.String(), code: cmd.ProcessState.ExitCode()}
}

// TestFrontParity: through a berth serve, the front runs the exec itself (shown by a
// front without berth-cli beside it), and its output, messages and exit code are
// berth-cli's (BERTH_NO_FRONT=1) for the same command line: success, the command's
// code, stderr, -e/-w, a timeout, not found, not executable, a bad -e, a session
// name the daemon refuses, an empty program name (which embedded says alike).
func TestFrontParity(t *testing.T) {
	e := newEnv(t)
	e.serve()
	alone := frontAlone(t)
	full := e.with(t)
	full.extra = append(slices.Clip(e.extra), front.EnvNoFront+"=1")
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"exec", "--", "sh", "-c", "echo out; echo err >&2; exit 3"}, 3},
		{[]string{"exec", "-s", "other", "-e", "A=1", "-eB=2", "-w", "/tmp", "--", "sh", "-c", "echo $A$B; pwd"}, 0},
		{[]string{"exec", "--timeout", "1s", "--", "sleep", "60"}, 124},
		{[]string{"exec", "--", "no-such-command-here"}, 127},
		{[]string{"exec", "--", "/etc/hostname"}, 126},
		{[]string{"exec", "-e", "NOEQUALS", "--", "true"}, 125},
		{[]string{"exec", "-s", "bad\x01name", "--", "true"}, 125},
		{[]string{"exec", "-s", "", "--", "true"}, 125},
		{[]string{"exec", "--", "printf", "\xff"}, 125}, // not UTF-8: refused, as embedded, not sent as U+FFFD
		{[]string{"exec", "--", ""}, 125},               // an empty program name: one message both ways
	} {
		viaFront := e.runFront(alone, c.args...)
		viaCLI := full.run(c.args...)
		if viaFront.code != c.code || viaFront.code != viaCLI.code || viaFront.stdout != viaCLI.stdout || viaFront.stderr != viaCLI.stderr {
			t.Errorf("%q: want exit %d, the same from both:\nfront:     %v\nberth-cli: %v", c.args, c.code, viaFront, viaCLI)
		}
	}
	// Embedded says the same of an empty program name, before any sandbox is made.
	args := []string{"exec", "-s", "empty:1", "--", ""}
	viaFront, embedded := e.runFront(alone, args...), full.run(append([]string{"--no-daemon"}, args...)...)
	if embedded.code != 125 || embedded.stderr != viaFront.stderr {
		t.Errorf("%q embedded: want exit 125 and the front's message:\nfront:    %v\nembedded: %v", args, viaFront, embedded)
	}
	if r := full.run("--no-daemon", "sessions"); strings.Contains(r.stdout, "empty:1") {
		t.Errorf("an exec with an empty program name made a sandbox:\n%v", r)
	}
}

// TestFrontHandsOver: the front hands to berth-cli (the front alone then exits 125,
// naming berth-cli and the go build that makes it) every call it cannot be sure of:
// no daemon, a config file edited since the daemon read it, a config that mentions
// state_dir, BERTH_NO_DAEMON, BERTH_HOST, any other command.
func TestFrontHandsOver(t *testing.T) {
	e := newEnv(t)
	alone := frontAlone(t)
	handsOver := func(what string, args ...string) {
		t.Helper()
		r := e.runFront(alone, args...)
		if r.code != 125 || !strings.Contains(r.stderr, "berth-cli") || !strings.Contains(r.stderr, "go build -o") {
			t.Errorf("%s: the front alone: %v, want exit 125 naming berth-cli and the build", what, r)
		}
	}
	handsOver("no daemon", "exec", "--", "true")

	e.config = e.writeFile("config.hcl", "# a config file\n")
	e.serve()
	if r := e.runFront(alone, "exec", "--", "true"); r.code != 0 {
		t.Fatalf("the front alone, through the daemon, with the config the daemon read: %v", r)
	}
	handsOver("version", "version")
	handsOver("-i", "exec", "-i", "--", "true")
	e.extra = []string{"BERTH_NO_DAEMON=1"}
	handsOver("BERTH_NO_DAEMON", "exec", "--", "true")
	e.extra = []string{"BERTH_HOST=unix://" + filepath.Join(e.state, serveSocket)}
	handsOver("BERTH_HOST", "exec", "--", "true")
	e.extra = nil
	if err := os.WriteFile(e.config, []byte("# a config file, edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	handsOver("a config edited since the daemon read it", "exec", "--", "true")
	// berth-cli reads the edited file, and goes through the same daemon.
	if r := e.run("exec", "--", "true"); r.code != 0 {
		t.Errorf("berth after the edit: %v", r)
	}
	if err := os.WriteFile(e.config, []byte("# state_dir is not set here\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	handsOver("a config that mentions state_dir", "exec", "--", "true")

	// A config that can be read once (a FIFO, BERTH_CONFIG=<(...)) is left for
	// berth-cli to read: the front does not open it (opening a FIFO without a writer
	// would block it here).
	fifo := filepath.Join(e.dir, "config.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	e.config = fifo
	handsOver("a config that is a FIFO", "exec", "--", "true")
	e.config = e.writeFile("config.hcl", "# for the cleanup\n")
}

// TestFrontHungDaemon: a daemon whose socket takes the connection but that does not
// answer its status call (stopped) is an error from the front itself, worded as
// berth-cli words it (exit 125), after one status timeout, not handed over to
// berth-cli to wait as long again: the front alone says it, not "cannot run
// berth-cli".
func TestFrontHungDaemon(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer d.cmd.Process.Signal(syscall.SIGCONT)
	r := e.runFront(frontAlone(t), "exec", "--", "true")
	if r.code != 125 || !strings.Contains(r.stderr, "does not answer its status call") || strings.Contains(r.stderr, "berth-cli") {
		t.Errorf("the front alone, a stopped daemon: %v, want 125 saying the daemon does not answer its status call", r)
	}
}
