// Package front is the berth executable (cmd/berth): a thin front that runs the
// commonest command, a plain `berth exec` through a running berth serve, itself,
// and hands every other command line to berth's full command line, the berth-cli
// executable beside it, in its own place (execve: same arguments, environment and
// pid).
//
// Why: a Go program pays the initialisation of every package it links before main
// runs, and the full CLI links the registry, gRPC, go-plugin, HCL and bbolt (about
// 190 package initialisers, 8–12 ms of a `berth version` on the machines berth is
// measured on, docs/performance.md). Through a daemon an exec needs none of them:
// this package links only the standard library, golang.org/x/sys and x/term, and
// berth's light packages (client, cli/internal/execrun, server/apiv1,
// config/paths and units), and TestFrontDeps keeps it that way.
//
// The front takes a call only when it is sure that the full CLI would make the same
// calls of the same daemon; anything else, before anything is sent, goes to
// berth-cli, which then decides as it always has:
//   - the command line is `berth exec` with only -s/--session, -e/--env,
//     -w/--workdir and --timeout, then the command (after `--` or not); any other
//     flag (-i, -t, --json, --shell, --recreate, --max-output, a global flag, help)
//     goes to berth-cli;
//   - none of BERTH_HOST, BERTH_NO_DAEMON (other than 0) and BERTH_CLOCK_OFFSET is
//     set;
//   - the state dir is $BERTH_STATE_DIR or the default one, and the config file
//     ($BERTH_CONFIG or the default one) does not mention state_dir at all (a
//     config that may set the state dir goes to berth-cli, which parses it);
//   - STATE/berth.sock answers GET /v1/status, and the daemon's state dir, config
//     file and clock offset are the command's, and the config file's bytes hash to
//     what the daemon read (status's config_sha256): a file edited since is read and
//     checked by berth-cli first, as before. The front then goes by the daemon's
//     check of those bytes: a config whose check depends on the caller's own
//     environment ($BERTH_PLUGIN_PATH for a third-party driver, $HOME for a "~/"
//     path) is checked in the daemon's, where berth-cli would check it in the
//     caller's.
//
// The exec itself is package execrun's, as in berth-cli: output, signals, messages
// and exit codes cannot differ.
package front

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/client"
	"github.com/berth-sh/berth/config/paths"
	"github.com/berth-sh/berth/config/units"
	"github.com/berth-sh/berth/internal/phase"
	"github.com/berth-sh/berth/internal/sigstart"
	"github.com/berth-sh/berth/server/apiv1"
)

// FullCLI is the name of berth's full command line, found beside the front.
const FullCLI = "berth-cli"

// The environment that the front reads besides client's and execrun's (cli's,
// docs/cli.md).
const (
	envTrace = "BERTH_TRACE"
	// EnvNoFront=1 makes the front hand every command to berth-cli (a developer's
	// setting, for comparing the two).
	EnvNoFront = "BERTH_NO_FRONT"
)

// Main runs the command line args (os.Args) and returns the exit code of a `berth
// exec` that it ran itself; every other command line it hands to berth-cli
// (execve), so Main then does not return. When berth-cli cannot be run it prints
// why, with the build command that makes it, and returns 125.
func Main(args []string) int {
	if os.Getenv(envTrace) != "" {
		phase.Enable()
		phase.Mark("main")
	}
	if f, argv, ok := Takes(args[1:]); ok && !noFront() {
		// From here a signal is the exec's (execrun: before the start, exit 128+N;
		// after, forwarded); until here it ended the front, as it ends any program
		// that has not started yet.
		sigstart.Start()
		c, err := daemon()
		if err != nil {
			// berth-cli would say the same and end (it does not hand such a
			// daemon over either); a signal that came meanwhile then ends it.
			code := execrun.Report(execrun.Failure(err))
			sigstart.Sync()
			sigstart.Release()
			return code
		}
		if c != nil {
			code := execrun.Report(execrun.Run(context.Background(), f, argv, func(context.Context) (execrun.Starter, error) {
				return starter{c}, nil
			}))
			phase.Report(os.Stderr)
			return code
		}
		// berth-cli's exec would find a signal that came by now before it started
		// anything: say so as it would (exit 128+N), rather than hand over a command
		// that the signal then ends without a word.
		sigstart.Sync()
		if s := sigstart.Pending(); s != nil {
			early := execrun.EarlySignals{Signals: []os.Signal{s}}
			return execrun.Report(execrun.StartError(f.Session, early, execrun.ErrBeforeStart))
		}
	}
	return handOver(args)
}

// handOver runs berth-cli in this process's place with args (args[0] kept, so that
// a berth-agent name still makes it the agent). A signal that came since the front
// began catching them ends the front by it first, as it would have ended berth
// (sigstart.Release).
func handOver(args []string) int {
	sigstart.Sync()
	sigstart.Release()
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth: cannot find its own executable: %v\n", err)
		return execrun.ExitInternal
	}
	dir := filepath.Dir(self)
	full := filepath.Join(dir, FullCLI)
	err = syscall.Exec(full, args, os.Environ())
	if !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "berth: cannot run %s, berth's full command line beside this berth: %v; check that it is an executable file, or build them again together: CGO_ENABLED=0 go build -o DIR/ ./cmd/...\n", full, err)
		return execrun.ExitInternal
	}
	fmt.Fprintf(os.Stderr, "berth: cannot run %s, berth's full command line, which must be beside this berth: %v; build them together into one directory DIR: CGO_ENABLED=0 go build -o DIR/ ./cmd/... (go run ./cmd/berth builds the front alone; go run ./cmd/berth-cli runs the full command line)\n",
		full, err)
	return execrun.ExitInternal
}

// noFront reports whether BERTH_NO_FRONT asks to hand every command to berth-cli.
func noFront() bool {
	v := os.Getenv(EnvNoFront)
	return v != "" && v != "0"
}

// Takes parses a command line (without the program's name) that the front runs
// itself, as berth-cli's exec command parses it (pflag, flags before the command):
// exec with only -s/--session, -e/--env, -w/--workdir and --timeout, and a command.
// It returns the flags (the session defaulting to $BERTH_SESSION, else main) and
// the command; ok is false for every other command line, and for a --timeout that
// does not parse (berth-cli then says what is wrong with it).
func Takes(args []string) (f *execrun.Flags, argv []string, ok bool) {
	if len(args) < 2 || args[0] != "exec" {
		return nil, nil, false
	}
	f = &execrun.Flags{Session: execrun.DefaultSession(), MaxOutput: -1}
	rest := args[1:]
	for len(rest) > 0 {
		a := rest[0]
		if a == "--" {
			rest = rest[1:]
			break
		}
		if a == "-" || !strings.HasPrefix(a, "-") {
			break // the command: flags end at the first argument that is none (pflag, not interspersed)
		}
		name, value, n := flagOf(rest)
		if n == 0 {
			return nil, nil, false
		}
		rest = rest[n:]
		switch name {
		case "s", "session":
			if execrun.CheckSession(value) != nil {
				return nil, nil, false // berth-cli's -s refuses it as it parses
			}
			f.Session = value
		case "e", "env":
			f.Env = append(f.Env, value)
		case "w", "workdir":
			f.Workdir = value
		case "timeout":
			d, err := units.ParseDuration(value)
			if err != nil {
				return nil, nil, false // berth-cli says what is wrong with it
			}
			f.Timeout = d
		default:
			return nil, nil, false
		}
	}
	if len(rest) == 0 {
		return nil, nil, false
	}
	return f, rest, true
}

// flagOf reads the flag at args[0] that takes a value, as pflag does: -s V, -sV,
// -s=V, --session V, --session=V. n is how many arguments it used, 0 for a flag
// the front does not take (a short flag that is not one of s, e, w; a long one that
// is not session, env, workdir or timeout) or one without its value.
func flagOf(args []string) (name, value string, n int) {
	a := args[0]
	inline := false
	if long, ok := strings.CutPrefix(a, "--"); ok {
		name, value, inline = strings.Cut(long, "=")
		switch name {
		case "session", "env", "workdir", "timeout":
		default:
			return "", "", 0
		}
	} else {
		name = a[1:2]
		if !strings.Contains("sew", name) {
			return "", "", 0
		}
		switch {
		case len(a) > 3 && a[2] == '=':
			value, inline = a[3:], true
		case len(a) > 2:
			value, inline = a[2:], true
		}
	}
	if inline {
		return name, value, 1
	}
	if len(args) < 2 {
		return "", "", 0
	}
	return name, args[1], 2
}

// daemon returns the client of the berth serve that the full CLI would use for this
// command, or nil when the front cannot be sure of one (package doc). A daemon whose
// socket accepts the connection but that does not answer its status call (within
// 10 s) is an error, worded as berth-cli words it: handing the call over would only
// make berth-cli wait as long again for the same answer.
func daemon() (*client.Client, error) {
	if os.Getenv(client.EnvHost) != "" || os.Getenv(execrun.EnvClockOffset) != "" || execrun.NoDaemonEnv() != "" {
		return nil, nil
	}
	state, ok := stateDir()
	if !ok {
		return nil, nil
	}
	sock := filepath.Join(state, client.SocketName)
	if _, err := os.Lstat(sock); err != nil {
		return nil, nil
	}
	cfgPath, cfgSum, ok := configFile()
	if !ok {
		return nil, nil
	}
	phase.Mark("config")
	c, err := client.New(sock)
	if err != nil {
		return nil, nil // berth-cli says what
	}
	ctx, cancel := context.WithTimeout(context.Background(), execrun.StatusTimeout)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		c.Close()
		if client.Refused(err) {
			return nil, nil // nobody listens: berth-cli runs it embedded
		}
		var ae *client.APIError
		if errors.As(err, &ae) {
			return nil, nil // an answer, but not a status: berth-cli says what
		}
		return nil, execrun.StatusFailed(c.Where(), err, execrun.FixNoStatus)
	}
	if filepath.Clean(st.StateDir) != state || st.Config != cfgPath || st.ConfigSHA256 != cfgSum || st.ClockOffsetMS != 0 {
		c.Close()
		return nil, nil
	}
	phase.Mark("daemon")
	return c, nil
}

// configFile resolves the config file as the full CLI does (config.ResolvePath):
// "" for none (a missing default file), with its SHA-256. ok is false when the full
// CLI must decide: the file is not a regular file, cannot be read, is named but
// missing, or mentions state_dir.
func configFile() (path, sum string, ok bool) {
	path, explicit, err := paths.ResolvePath("")
	if err != nil {
		return "", "", false
	}
	st, err := os.Stat(path)
	if err != nil {
		if _, lerr := os.Lstat(path); errors.Is(err, fs.ErrNotExist) && !explicit && lerr != nil {
			return "", "", true // no file (not even a dangling link): the built-in default
		}
		return "", "", false
	}
	// Only a regular file is read: a pipe or a FIFO (BERTH_CONFIG=<(...)) can be read
	// once, and berth-cli must find its bytes still there.
	if !st.Mode().IsRegular() {
		return "", "", false
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return "", "", false
	}
	if bytes.Contains(src, []byte("state_dir")) {
		return "", "", false
	}
	h := sha256.Sum256(src)
	return path, hex.EncodeToString(h[:]), true
}

// stateDir is $BERTH_STATE_DIR, else the default state dir, absolute and clean, as
// the full CLI resolves it when the config sets none.
func stateDir() (string, bool) {
	dir := os.Getenv(paths.EnvStateDir)
	if dir == "" {
		d, err := paths.DefaultStateDir()
		if err != nil {
			return "", false
		}
		dir = d
	}
	dir, err := filepath.Abs(paths.ExpandHome(dir))
	if err != nil {
		return "", false
	}
	return filepath.Clean(dir), true
}

// starter is execrun.Starter through the daemon.
type starter struct{ *client.Client }

func (s starter) Exec(ctx context.Context, session string, req backend.ExecRequest) (backend.Process, *apiv1.ExecStarted, error) {
	p, err := s.Client.Exec(ctx, session, req)
	if err != nil {
		return nil, nil, err
	}
	return p, p.Started(), nil
}
