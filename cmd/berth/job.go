package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berth-sh/berth/backends/agent"
	"github.com/berth-sh/berth/internal/sigstart"
	"github.com/berth-sh/berth/registry"
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
	job.PersistentFlags().StringVarP(&session, "session", "s", defaultSession(), "session name ($BERTH_SESSION sets the default)")

	var env []string
	var workdir string
	start := &cobra.Command{
		Use:     "start [-s SESSION] [-e K=V] [-w DIR] -- CMD [ARG...]",
		Short:   "Start CMD as a background job and print its id",
		Example: `  berth job start -s chat:1 -- sh -c 'while :; do date; sleep 1; done'`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkEnvFlags(env); err != nil {
				return err
			}
			return g.withRegistry(cmd.Context(), func(reg *registry.Registry) error {
				j, err := reg.JobStart(cmd.Context(), session, registry.JobStartRequest{Argv: args, Env: env, Dir: workdir})
				if err != nil {
					return err
				}
				fmt.Println(j.ID)
				return nil
			})
		},
	}
	start.Flags().StringArrayVarP(&env, "env", "e", nil, "set an environment variable for the job (KEY=VALUE, repeatable)")
	start.Flags().StringVarP(&workdir, "workdir", "w", "", "working directory in the sandbox")
	start.Flags().SetInterspersed(false)

	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls [-s SESSION] [--json]",
		Short: "List the session's jobs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			jobs, err := query(cmd.Context(), g, func(reg *registry.Registry, ctx context.Context) ([]agent.Job, error) {
				return reg.Jobs(ctx, session)
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
	logs := &cobra.Command{
		Use:   "logs [-s SESSION] [--follow] ID",
		Short: "Print a job's output; with --follow, until it ends (exit with its exit code)",
		Args:  cobra.ExactArgs(1),
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
			var res agent.JobLogsEnd
			err := g.withRegistry(ctx, func(reg *registry.Registry) error {
				var err error
				res, err = reg.JobLogs(ctx, session, registry.JobLogsRequest{ID: args[0], Follow: follow}, os.Stdout)
				return err
			})
			select {
			case s := <-got: // interrupted while following: the job runs on
				return exitCode(128 + int(s.(syscall.Signal)))
			default:
			}
			if err != nil {
				return err
			}
			if follow && res.Signal != 0 {
				return exitCode(128 + res.Signal)
			}
			if follow && res.ExitCode != 0 {
				return exitCode(res.ExitCode)
			}
			return nil
		},
	}
	logs.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output until the job ends, then exit with its exit code")

	kill := &cobra.Command{
		Use:   "kill [-s SESSION] ID",
		Short: "End a job's process tree (TERM, then KILL)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withRegistry(cmd.Context(), func(reg *registry.Registry) error {
				return reg.JobKill(cmd.Context(), session, args[0])
			})
		},
	}
	job.AddCommand(start, ls, takesSignals(logs), kill)
	return job
}
