package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func newSessionsCmd(g *globals) *cobra.Command {
	var asJSON, pools bool
	cmd := &cobra.Command{
		Use:   "sessions [--pool] [--json]",
		Short: "List sessions with their driver, sandbox, state, last use and drift",
		Long: `List the recorded sessions: driver, sandbox, state, last use, drift, and POOLED
for a sandbox that was a warm pool member the session claimed.

With --pool, list the warm pools instead: one line per rule with a pool block
(its scope, driver, size and how many members are ready, being made, being claimed
or draining after a config change), then, with --json, every member. Pools are
read from the state store, so the listing is the same through berth serve and
embedded; only berth serve fills them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if pools {
				return listPools(cmd, g, asJSON)
			}
			list, err := query(cmd.Context(), g, api.Sessions)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(list) // as GET /v1/sessions lists them
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SESSION\tDRIVER\tSANDBOX\tSTATE\tLAST USE\tDRIFT\tPOOLED")
			for _, s := range list {
				drift, pooled := "", ""
				if s.Drift {
					drift = "drift"
				}
				if s.Pooled {
					pooled = "pooled"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Session, s.Driver, s.Sandbox, s.State, ago(s.LastUsed), drift, pooled)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&pools, "pool", false, "list the warm pools (GET /v1/pools) instead of the sessions")
	return cmd
}

// listPools is berth sessions --pool: a line per pool, or with asJSON the objects
// of GET /v1/pools.
func listPools(cmd *cobra.Command, g *globals, asJSON bool) error {
	list, err := query(cmd.Context(), g, api.Pools)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(list)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tDRIVER\tSIZE\tREADY\tCREATING\tCLAIMING\tDRAINING\tMAX IDLE\tOLDEST READY")
	for _, p := range list {
		maxIdle := "-"
		if p.MaxIdleMS > 0 {
			maxIdle = (time.Duration(p.MaxIdleMS) * time.Millisecond).String()
		}
		var oldest time.Time
		for _, m := range p.Members {
			if m.State == "ready" && (oldest.IsZero() || m.Ready.Before(oldest)) {
				oldest = m.Ready
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", p.Scope, p.Driver, p.Size, p.Ready, p.Creating, p.Claiming, p.Draining, maxIdle, ago(oldest))
	}
	return tw.Flush()
}

// ago says how long before now t was; a t after now (a store written by a berth whose
// clock ran ahead) is said to be in the future, not as a negative time ago.
func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t).Round(time.Second)
	if d < 0 {
		return (-d).String() + " in the future"
	}
	return d.String() + " ago"
}

func newCloseCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "close SESSION",
		Short: "Close a session, applying its rule's on_close (keep, stop or remove)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withAPI(cmd.Context(), func(a api) error {
				return a.CloseSession(cmd.Context(), args[0])
			})
		},
	}
}

func newRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm SESSION",
		Short: "Remove a session's sandbox and its files, whatever on_close says",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withAPI(cmd.Context(), func(a api) error {
				return a.RemoveSession(cmd.Context(), args[0])
			})
		},
	}
}

func newStopCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "stop SESSION",
		Short: "Stop a session's sandbox, keeping its files; the next command starts it again",
		Long: `Stop the sandbox of SESSION whatever its rule's on_close says: every process in it
ends (the agent asks them, then they are killed), its files stay (where the driver
keeps files across a stop), and the session's next command starts it again, with
this berth's agent. For a sandbox that several sessions share, all of them are
stopped. Stopping a stopped sandbox, or a session without one, succeeds.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withAPI(cmd.Context(), func(a api) error {
				return a.StopSession(cmd.Context(), args[0])
			})
		},
	}
}
