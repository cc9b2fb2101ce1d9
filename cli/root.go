package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/phase"
	"github.com/berth-sh/berth/internal/sigstart"
	_ "github.com/berth-sh/berth/internal/sigstart/early" // berth-cli and berth-serve catch the signals from their start

	// local is the one driver compiled into berth (catalog.Register in its init).
	_ "github.com/berth-sh/berth/local"
	"github.com/berth-sh/berth/registry"
	"github.com/spf13/cobra"
)

// version is set at build time with
// -ldflags "-X github.com/berth-sh/berth/cli.version=...".
var version = "0.1.0-dev"

// envTrace, when set, makes berth print when it reached each phase of its work to
// stderr at the end ("phase NAME UNIX-NANOS" lines; see internal/phase): a
// developer's setting, for the breakdown of a command's time.
const envTrace = "BERTH_TRACE"

// Option configures Main.
type Option func(*globals)

// WithServer gives `berth serve` the HTTP API's server (package server's, through
// cmd/berth-serve). Without it, serve runs the berth-serve executable found beside
// the berth binary in this process's place (execve), with the same arguments.
func WithServer(s Server) Option { return func(g *globals) { g.server = s } }

// WithBerth names the berth binary when this process is another executable built
// from this package (berth-serve): the binary whose directory holds the driver
// executables, that the local driver's plugin is run as, and that is the default
// agent (config's agent_path). Without it, it is this process's own executable.
func WithBerth(path string) Option { return func(g *globals) { g.exe = path } }

// Main runs the berth command line args (os.Args[1:]) and returns the process's
// exit code: 0, the command's own code, 124 for an exec that timed out, 125 when
// berth itself failed or was used wrongly (docs/cli.md). It does not exit. A
// program that is also berth's agent must dispatch to agent.Main before it calls
// this (cmd/berth does).
func Main(args []string, opts ...Option) int {
	if os.Getenv(envTrace) != "" {
		phase.Enable()
		phase.Mark("main")
	}
	code := run(args, opts...)
	// A run that reached no command (help, a usage error) neither took nor released
	// the early signals: one that came meanwhile ends berth now, as it would have.
	sigstart.Release()
	phase.Report(os.Stderr)
	return code
}

// globals are the flags every command shares.
type globals struct {
	configPath string
	stateDir   string
	logLevel   string
	inProcess  bool
	// noDaemonFlag is --no-daemon: run embedded even when berth serve runs.
	noDaemonFlag bool
	// detected is the config that daemon detection loaded; settings uses it once
	// instead of reading the file again.
	detected *config.Config
	log      *logSink
	// onPull shows image pull progress for the calls that may create a sandbox
	// (exec, shell); nil elsewhere.
	onPull func(registry.PullEvent)
	// plugins maps driver names to plugin executables given on the command line
	// (conformance --plugin); nil elsewhere.
	plugins map[string]string
	// args are the command line (Main's), which serve hands to berth-serve.
	args []string
	// server is WithServer's; nil in berth itself.
	server Server
	// exe is the berth binary: WithBerth's, else this process's own once self
	// has looked it up; "" before.
	exe string
	// pluginPathNote notes the skipped entries of BERTH_PLUGIN_PATH on stderr once
	// (configOptions; berth serve checks configs from its handlers too).
	pluginPathNote sync.Once
}

// self returns the berth binary: WithBerth's, else this process's executable
// (looked up once: daemon detection and the settings both ask).
func (g *globals) self() (string, error) {
	if g.exe != "" {
		return g.exe, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("cannot find the berth binary: %w", err)
	}
	g.exe = exe
	return exe, nil
}

func run(args []string, opts ...Option) int {
	g := &globals{log: &logSink{}, args: args}
	for _, o := range opts {
		o(g)
	}
	defer g.log.Close()
	root := newRoot(g)
	root.SetArgs(args)
	return execrun.Report(root.Execute())
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "berth",
		Short: "Give every terminal session its own execution environment",
		Long: `berth runs each session's commands in its own sandbox, on a runtime chosen per
session scope in config: the host (local), Docker, containerd, or a third-party driver.
Without a config file every session runs on the local driver.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// SIGINT, SIGTERM and SIGHUP are caught from the start of the process
		// (internal/sigstart); the commands that handle them take them over, every
		// other one gives them their default action back here.
		PersistentPreRun: func(cmd *cobra.Command, args []string) {
			if !handlesSignals(cmd) {
				sigstart.Release()
			}
		},
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &execrun.ExitError{Code: execrun.ExitInternal, Err: fmt.Errorf("%v (see '%s --help')", err, c.CommandPath())}
	})
	pf := root.PersistentFlags()
	pf.StringVar(&g.configPath, "config", "", "config file (default $BERTH_CONFIG, then $XDG_CONFIG_HOME/berth/config.hcl)")
	pf.StringVar(&g.stateDir, "state-dir", "", "state directory (default $BERTH_STATE_DIR, then $XDG_STATE_HOME/berth)")
	pf.StringVar(&g.logLevel, "log-level", "", "log level for berth's log file STATE/berth.log: trace, debug, info, warn, error, off (default $BERTH_LOG, then warn)")
	pf.BoolVar(&g.noDaemonFlag, "no-daemon", false, "run embedded (open the state dir in this process) even when berth serve runs for it (also "+envNoDaemon+"=1)")
	pf.BoolVar(&g.inProcess, "in-process", false, "run the local driver inside this process instead of as a plugin (the only driver compiled into berth)")
	pf.MarkHidden("in-process")

	root.AddCommand(
		newExecCmd(g), newShellCmd(g), newSessionsCmd(g), newCloseCmd(g), newStopCmd(g), newRmCmd(g), newPruneCmd(g),
		newDriversCmd(g), newConfigCmd(g), newConformanceCmd(g), newVersionCmd(),
		newDriverCmd(g), newImageCmd(g), newJobCmd(g), newCpCmd(g), newServeCmd(g), newStatusCmd(g),
	)
	return root
}

// withRegistry opens the registry, runs f with it and closes it; every error is a
// berth failure (exit 125) unless f returns an exit code of its own.
func (g *globals) withRegistry(ctx context.Context, f func(reg *registry.Registry) error) error {
	reg, err := g.open(ctx)
	if err != nil {
		return execrun.Failure(err)
	}
	defer reg.Close()
	return execrun.Failure(f(reg))
}

// query calls f on the api (the daemon, else an embedded registry); errors are
// berth failures (exit 125).
func query[T any](ctx context.Context, g *globals, f func(api, context.Context) (T, error)) (T, error) {
	var out T
	err := g.withAPI(ctx, func(a api) error {
		var err error
		out, err = f(a, ctx)
		return err
	})
	return out, err
}

// logSink is berth's log file: opened on first write once the state dir is known,
// truncated when it has grown past maxLogBytes. Before the path is known, lines are
// dropped: nothing goes to the command's stderr.
type logSink struct {
	mu   sync.Mutex
	path string
	f    *os.File
}

const maxLogBytes = 8 << 20

func (s *logSink) SetPath(p string) {
	s.mu.Lock()
	s.path = p
	s.mu.Unlock()
}

func (s *logSink) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		if s.path == "" {
			return len(b), nil
		}
		flags := os.O_WRONLY | os.O_CREATE | os.O_APPEND
		if st, err := os.Stat(s.path); err == nil && st.Size() > maxLogBytes {
			flags |= os.O_TRUNC
		}
		f, err := os.OpenFile(s.path, flags, 0o600)
		if err != nil {
			s.path = ""
			return len(b), nil
		}
		s.f = f
	}
	s.f.Write(b)
	return len(b), nil
}

func (s *logSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != nil {
		return s.f.Close()
	}
	return nil
}

var _ io.Writer = (*logSink)(nil)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print berth's version and protocol versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "berth %s (driver protocol %d)\n", version, backend.ProtocolVersion)
			return nil
		},
	}
}

// signalsAnnotation marks a command that takes over the signals caught since the start
// (sigstart.Take): exec, shell, job logs.
const signalsAnnotation = "berth.signals"

// takesSignals marks c as a command that handles SIGINT, SIGTERM and SIGHUP itself.
func takesSignals(c *cobra.Command) *cobra.Command {
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[signalsAnnotation] = "take"
	return c
}

func handlesSignals(c *cobra.Command) bool { return c.Annotations[signalsAnnotation] == "take" }

// group makes c a command that only groups subcommands: an unknown or missing
// subcommand is a usage error (exit 125), not a help text with exit 0.
func group(c *cobra.Command) *cobra.Command {
	c.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return execrun.Usage("unknown command %q for %q; see '%s --help'", args[0], cmd.CommandPath(), cmd.CommandPath())
		}
		return nil
	}
	c.RunE = func(cmd *cobra.Command, args []string) error {
		return execrun.Usage("%s needs a subcommand; see '%s --help'", cmd.CommandPath(), cmd.CommandPath())
	}
	return c
}

// exactArgs is cobra.ExactArgs(n) with a message that says what is missing or too
// much, and the command's usage line, instead of "accepts 1 arg(s), received 0":
// e.g. "berth: stop: want 1 argument, got none (usage: berth stop SESSION [flags]; ...)".
// Exit 125.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == n {
			return nil
		}
		want := "1 argument"
		if n != 1 {
			want = fmt.Sprintf("%d arguments", n)
		}
		got := "none"
		if len(args) > 0 {
			got = fmt.Sprintf("%d (%q)", len(args), args)
		}
		name := strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
		return execrun.Usage("%s: want %s, got %s (usage: %s; see '%s --help')", name, want, got, cmd.UseLine(), cmd.CommandPath())
	}
}
