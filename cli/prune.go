package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/client"
	"github.com/berth-sh/berth/registry"
	"github.com/spf13/cobra"
)

type pruneFlags struct {
	dryRun bool
	json   bool
	watch  time.Duration
	owner  string
	all    bool
}

func newPruneCmd(g *globals) *cobra.Command {
	f := &pruneFlags{}
	cmd := &cobra.Command{
		Use:   "prune [--dry-run] [--json] [--watch INTERVAL] [--owner ID]",
		Short: "Reconcile every driver's sandboxes with the state and apply retention now",
		Long: `Reconcile every configured driver with berth's state and apply retention now:
sandboxes idle for longer than their rule's idle_ttl are stopped or removed
(idle_action), sandboxes older than max_age are removed, sandboxes of ours that the
state does not record are adopted when a rule still maps to them and removed
otherwise (never while younger than the grace period), and state dir files that
nothing references are deleted. Sandboxes without this state dir's owner label are
never touched. Each action is printed with its reason.

A driver whose runtime is down is reported and skipped; berth prune then exits 1.
--watch keeps one registry (and its driver plugins) running and prunes every
INTERVAL until SIGINT or SIGTERM; with berth serve running (which prunes on its
own), it says so and makes its rounds through the daemon, and goes on embedded if
the daemon goes away. --owner ID removes the sandboxes of another owner
id, left behind by a lost state dir.`,
		Example: `  berth prune --dry-run
  berth prune --json
  berth prune --watch 10m
  berth prune --owner 3f2a...c9 --dry-run`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("watch") && f.watch <= 0 {
				return execrun.Usage("--watch %v: the interval must be positive, e.g. --watch 10m", f.watch)
			}
			return runPrune(cmd.Context(), g, f)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.dryRun, "dry-run", false, "report what would be done, change nothing")
	fl.BoolVar(&f.json, "json", false, "print the report as JSON (one object per round, one line each with --watch)")
	fl.Var(durationValue{&f.watch}, "watch", "prune every INTERVAL (e.g. 10m) until interrupted")
	fl.StringVar(&f.owner, "owner", "", "reconcile the sandboxes of this owner id instead (cleans up after a lost state dir)")
	fl.BoolVarP(&f.all, "all", "a", false, "also list sandboxes and files that are kept")
	return cmd
}

func runPrune(ctx context.Context, g *globals, f *pruneFlags) error {
	reg, err := g.api(ctx)
	if err != nil {
		return err
	}
	defer func() { reg.Close() }()
	opts := registry.PruneOptions{DryRun: f.dryRun, Owner: f.owner}
	if f.watch <= 0 {
		rep, err := reg.Prune(ctx, opts)
		if err != nil {
			return execrun.Failure(err)
		}
		if err := printPrune(os.Stdout, rep, f, false); err != nil {
			return execrun.Failure(err)
		}
		if rep.Failed() {
			return execrun.ExitCode(1)
		}
		return nil
	}
	if d, ok := reg.(*daemonClient); ok {
		watchNote(d, f.watch)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ticker := time.NewTicker(f.watch)
	defer ticker.Stop()
	for {
		rep, err := reg.Prune(ctx, opts)
		if ctx.Err() != nil {
			return nil
		}
		var answered *client.APIError
		switch {
		case err != nil && isDaemon(reg) && !errors.As(err, &answered):
			// The daemon went away (stopped, restarted): the rounds go on with
			// whatever runs now, a new daemon or embedded.
			fmt.Fprintf(os.Stderr, "berth: prune: %v\n", err)
			if next, aerr := g.api(ctx); aerr == nil {
				reg.Close()
				reg = next
				if d, ok := reg.(*daemonClient); ok {
					watchNote(d, f.watch)
				} else {
					fmt.Fprintf(os.Stderr, "berth: prune --watch: no berth serve answers now; the rounds go on embedded\n")
				}
			} else {
				fmt.Fprintf(os.Stderr, "berth: prune: %v\n", aerr)
			}
		case err != nil:
			// The state dir may come back (a full disk, a held store): say so and go on.
			fmt.Fprintf(os.Stderr, "berth: prune: %v\n", err)
		default:
			if err := printPrune(os.Stdout, rep, f, true); err != nil {
				return execrun.Failure(err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

func isDaemon(a api) bool { _, ok := a.(*daemonClient); return ok }

// watchNote tells the user of prune --watch through the daemon d that d prunes on
// its own already: the rounds of --watch come on top of the daemon's, through it,
// and end when --watch does; the daemon's go on.
func watchNote(d *daemonClient, every time.Duration) {
	own := "prunes on its own"
	if ms := d.Status.PruneIntervalMS; ms > 0 {
		own = fmt.Sprintf("already prunes every %v on its own", time.Duration(ms)*time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "berth: note: berth serve at %s (pid %d) %s; --watch adds a round through it every %v and prints its report (the daemon's rounds go on when this stops)\n",
		d.Where(), d.Status.PID, own, every)
}

// printPrune writes a report: JSON (compact with --watch), or a table of the
// actions that change something (every action with --all) and a summary line.
func printPrune(w io.Writer, rep *registry.PruneReport, f *pruneFlags, watch bool) error {
	if f.json {
		if !watch {
			return printJSON(rep)
		}
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		return enc.Encode(rep)
	}
	verb := ""
	if rep.DryRun {
		verb = "would "
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%sACTION\tDRIVER\tSANDBOX/PATH\tSESSIONS\tREASON\n", strings.ToUpper(verb))
	counts := map[string]int{}
	for _, a := range rep.Actions {
		counts[a.Action]++
		if a.Action == registry.PruneKeep && !f.all && a.Error == "" {
			continue
		}
		what := a.Sandbox
		if what == "" {
			what = a.Path
		}
		reason := a.Reason
		if a.Error != "" {
			reason += " — FAILED: " + a.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s: %s\n", a.Action, dash(a.Driver), what, dash(strings.Join(a.Sessions, ",")), a.Cause, reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, d := range rep.Drivers {
		if d.Error != "" {
			fmt.Fprintf(w, "driver %s skipped: %s\n", d.Name, d.Error)
		}
	}
	_, err := fmt.Fprintf(w, "%s %s: %d kept, %d adopted, %d stopped, %d removed, %d files deleted\n",
		rep.At.Format(time.RFC3339), strings.TrimSpace("prune "+map[bool]string{true: "(dry run)", false: ""}[rep.DryRun]),
		counts[registry.PruneKeep], counts[registry.PruneAdopt], counts[registry.PruneStop], counts[registry.PruneRemove], counts[registry.PruneDelete])
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
