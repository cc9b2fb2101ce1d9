package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/internal/sigstart"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

func newJobCmd(g *globals) *cobra.Command {
	var session string
	job := group(&cobra.Command{
		Use:   "job",
		Short: "Run and watch background jobs in a session's sandbox",
		Long: `Background jobs outlive the call that starts them: berth's agent in the sandbox keeps
them, with their output (stdout and stderr together, the newest 1 MiB), until they end
or the sandbox stops. The host reads that output only through the agent.`,
	})
	sessionFlag(job.PersistentFlags(), &session)

	var env []string
	var workdir, shellCmd string
	var startJSON bool
	start := &cobra.Command{
		Use:   "start [-s SESSION] [-e K=V] [-w DIR] [--json] -- CMD [ARG...] | start [flags] --shell 'COMMAND'",
		Short: "Start CMD as a background job and print its id (or, with --json, the job)",
		Example: `  berth job start -s chat:1 -- sh -c 'while :; do date; sleep 1; done'
  berth job start -s chat:1 --shell 'make test > test.log 2>&1'`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := execrun.CheckEnv(env); err != nil {
				return err
			}
			argv := args
			switch {
			case cmd.Flags().Changed("shell") && len(args) > 0:
				return execrun.Usage("--shell takes the whole command as its value; drop the arguments after it (%q)", args)
			case cmd.Flags().Changed("shell") && strings.TrimSpace(shellCmd) == "":
				return execrun.Usage("--shell: empty command")
			case cmd.Flags().Changed("shell"):
				argv = []string{"/bin/sh", "-c", shellCmd}
			case len(args) == 0:
				return execrun.Usage("no command: give one after -- (berth job start -- CMD [ARG...]) or use --shell 'COMMAND'")
			}
			return g.withAPI(cmd.Context(), func(a api) error {
				j, err := a.JobStart(cmd.Context(), session, registry.JobStartRequest{Argv: argv, Env: env, Dir: workdir})
				if err != nil {
					return err
				}
				if startJSON {
					return printJSON(j)
				}
				fmt.Println(j.ID)
				return nil
			})
		},
	}
	start.Flags().StringArrayVarP(&env, "env", "e", nil, "set an environment variable for the job (KEY=VALUE, repeatable)")
	start.Flags().StringVarP(&workdir, "workdir", "w", "", "working directory in the sandbox")
	start.Flags().StringVar(&shellCmd, "shell", "", "run this command string with /bin/sh -c (not shell mode: no session state)")
	start.Flags().BoolVar(&startJSON, "json", false, "print the job as JSON (as job ls --json lists it) instead of its id")
	start.Flags().SetInterspersed(false)

	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls [-s SESSION] [--json]",
		Short: "List the session's jobs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			jobs, err := query(cmd.Context(), g, func(a api, ctx context.Context) ([]apiv1.Job, error) {
				return a.Jobs(ctx, session)
			})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(jobs)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tSTARTED\tOUTPUT\tCOMMAND")
			for _, j := range jobs {
				state := "running"
				if !j.Running {
					state = fmt.Sprintf("exited %d", j.ExitCode)
					if j.Signal != 0 {
						state = fmt.Sprintf("killed (signal %d)", j.Signal)
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d B\t%s\n", j.ID, state, ago(j.Started), j.LogBytes, strings.Join(j.Argv, " "))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON (an array of jobs)")

	var follow bool
	var offset int64
	logs := &cobra.Command{
		Use:   "logs [-s SESSION] [--follow] [--offset N] ID",
		Short: "Print a job's output; with --follow, until it ends (exit with its exit code)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			// SIGINT, SIGTERM and SIGHUP, caught since berth started (sigstart), stop
			// the reading (not the job): berth exits 128+N.
			sigs := sigstart.Take()
			defer signal.Stop(sigs)
			got := make(chan os.Signal, 1)
			go func() {
				select {
				case s := <-sigs:
					got <- s
					cancel()
				case <-ctx.Done():
				}
			}()
			if offset < 0 {
				return execrun.Usage("--offset %d: want a byte offset, 0 or more", offset)
			}
			var res agent.JobLogsEnd
			err := g.withAPI(ctx, func(a api) error {
				var err error
				res, err = a.JobLogs(ctx, session, registry.JobLogsRequest{ID: args[0], Offset: offset, Follow: follow}, os.Stdout)
				return err
			})
			select {
			case s := <-got: // interrupted while following: the job runs on
				return execrun.ExitCode(128 + int(s.(syscall.Signal)))
			default:
			}
			if err != nil {
				return err
			}
			if follow && res.Signal != 0 {
				return execrun.ExitCode(128 + res.Signal)
			}
			if follow && res.ExitCode != 0 {
				return execrun.ExitCode(res.ExitCode)
			}
			return nil
		},
	}
	logs.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output until the job ends, then exit with its exit code")
	logs.Flags().Int64Var(&offset, "offset", 0, "start at this byte offset of the job's output (its log_bytes in job ls --json is where new output starts)")

	kill := &cobra.Command{
		Use:   "kill [-s SESSION] ID",
		Short: "End a job's process tree (TERM, then KILL)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withAPI(cmd.Context(), func(a api) error {
				return a.JobKill(cmd.Context(), session, args[0])
			})
		},
	}
	job.AddCommand(start, ls, takesSignals(logs), kill)
	return job
}
