package cli

import (
	"context"
	"errors"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/server/apiv1"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func newExecCmd(g *globals) *cobra.Command { return execCmd(g, &execrun.Flags{}) }

// execCmd is the exec command with its flags parsed into f.
func execCmd(g *globals, f *execrun.Flags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "exec [flags] -- CMD [ARG...] | exec [flags] --shell 'COMMAND'",
		Short: "Run a command in a session's sandbox",
		Long: `Run CMD in the sandbox of SESSION (default "main"), streaming its stdout and stderr,
and exit with its exit code. berth's own exit codes: 124 the command timed out, 125 berth
failed or was used wrongly, 126 not executable, 127 not found. SIGINT, SIGTERM and SIGHUP
are forwarded to the command's process group; a second SIGINT kills its process tree.

With --shell, COMMAND runs in shell mode (bash, else sh): the directory and exported
variables it leaves are the session's starting point for its next --shell call (calls
of one session run side by side; the last to end records the state), and each stream is capped (head, a marker line with
the exact count of bytes left out, tail; 50 KiB unless --max-output or the rule's
max_output), the full stream kept in a file under the state dir.`,
		Example: `  berth exec -- sh -c 'echo hello; exit 3'
  berth exec -s chat:4711 --timeout 30s -- make test
  berth exec -s main --json --max-output 65536 -- ls -la
  berth exec -s chat:1 --shell 'cd /src && export CC=clang'
  berth exec -s chat:1 --shell 'make test' --json
  berth exec -s chat:1 --recreate -- true`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("max-output") && f.MaxOutput < 0 {
				return execrun.Usage("--max-output %d: must be 0 or more bytes", f.MaxOutput)
			}
			if cmd.Flags().Changed("shell") {
				if len(args) > 0 {
					return execrun.Usage("--shell takes the whole command as its value; drop the arguments after it (%q)", args)
				}
				return runShellMode(cmd.Context(), g, f)
			}
			if len(args) == 0 {
				return execrun.Usage("no command: give one after -- (berth exec -- CMD [ARG...]) or use --shell 'COMMAND'")
			}
			return runExec(cmd.Context(), g, f, args)
		},
	}
	fl := cmd.Flags()
	sessionFlag(fl, &f.Session)
	fl.StringArrayVarP(&f.Env, "env", "e", nil, "set an environment variable for this command (KEY=VALUE, repeatable)")
	fl.StringVarP(&f.Workdir, "workdir", "w", "", "working directory in the sandbox")
	fl.Var(durationValue{&f.Timeout}, "timeout", "kill the command's process tree after this long (e.g. 30s, 5m, 1d) and exit 124")
	fl.BoolVarP(&f.Stdin, "interactive", "i", false, "pass stdin to the command")
	fl.BoolVarP(&f.TTY, "tty", "t", false, "allocate a terminal for the command")
	fl.Int64Var(&f.MaxOutput, "max-output", -1, "cap each output stream at BYTES (default: no cap; 1 MiB per stream with --json)")
	fl.Lookup("max-output").DefValue = "0" // -1 means "not set": the usage says the default, pflag must not add "(default -1)"
	fl.StringVar(&f.Shell, "shell", "", "run this command string in shell mode (- reads it from stdin, for a command longer than the argument limit): cd and export carry over to the session's next --shell call; output capped at 50 KiB per stream unless --max-output")
	fl.BoolVar(&f.Recreate, "recreate", false, "remove the session's sandbox first and run in a new one made from its rule's current config (the remedy for drift; files, processes and shell state in the old one are lost)")
	fl.BoolVar(&f.JSON, "json", false, "print one JSON object with the result and the output at the end (image pull progress, if any, as JSON lines on stderr)")
	fl.SetInterspersed(false)
	return takesSignals(cmd)
}

// sessionFlag defines -s/--session on fl into p, defaulting to $BERTH_SESSION, else
// main. A value of "--" is a flag error (execrun.CheckSession): `-s -- CMD` left the
// name out.
func sessionFlag(fl *pflag.FlagSet, p *string) {
	*p = execrun.DefaultSession()
	fl.VarP(sessionValue{p}, "session", "s", "session name ($BERTH_SESSION sets the default)")
}

// sessionValue is the value of sessionFlag.
type sessionValue struct{ p *string }

func (v sessionValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v sessionValue) Set(s string) error {
	if execrun.CheckSession(s) != nil {
		return errors.New(execrun.MissingSession) // pflag names the flag and the value
	}
	*v.p = s
	return nil
}

func (v sessionValue) Type() string { return "string" }

// durationValue is a duration flag that takes what config durations take: Go's units
// and d for 24 hours ("90s", "36h", "7d"; config.ParseDuration).
type durationValue struct{ d *time.Duration }

func (v durationValue) String() string {
	if v.d == nil || *v.d == 0 {
		return "0" // pflag shows no default for "0"
	}
	return v.d.String()
}

func (v durationValue) Set(s string) error {
	d, err := config.ParseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

func (v durationValue) Type() string { return "duration" }

// runExec is berth exec without --shell (execrun.Run) through g.api: embedded, or
// through berth serve.
func runExec(ctx context.Context, g *globals, f *execrun.Flags, argv []string) error {
	return execrun.Run(ctx, f, argv, func(ctx context.Context) (execrun.Starter, error) {
		g.onPull = newPullDisplay(f.JSON).event
		a, err := g.api(ctx)
		if err != nil {
			return nil, err
		}
		return starter{a}, nil
	})
}

// starter is an api as execrun.Run starts commands through it.
type starter struct{ api }

func (s starter) Exec(ctx context.Context, session string, req backend.ExecRequest) (backend.Process, *apiv1.ExecStarted, error) {
	return s.api.Exec(ctx, session, req)
}
