package main

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
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "sessions",
		Short: "List sessions with their driver, sandbox, state, last use and drift",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			reg, err := g.open(cmd.Context())
			if err != nil {
				return failure(err)
			}
			defer reg.Close()
			list, err := reg.Sessions(cmd.Context())
			if err != nil {
				return failure(err)
			}
			if asJSON {
				if list == nil {
					return printJSON([]any{})
				}
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SESSION\tDRIVER\tSANDBOX\tSTATE\tLAST USE\tDRIFT")
			for _, s := range list {
				drift := ""
				if s.Drift {
					drift = "drift"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Session, s.Driver, s.Sandbox, s.State, ago(s.LastUsed), drift)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

func newCloseCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "close SESSION",
		Short: "Close a session, applying its rule's on_close (keep, stop or remove)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg, err := g.open(cmd.Context())
			if err != nil {
				return failure(err)
			}
			defer reg.Close()
			return failure(reg.CloseSession(cmd.Context(), args[0]))
		},
	}
}

func newRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm SESSION",
		Short: "Remove a session's sandbox and its files, whatever on_close says",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg, err := g.open(cmd.Context())
			if err != nil {
				return failure(err)
			}
			defer reg.Close()
			return failure(reg.RemoveSession(cmd.Context(), args[0]))
		},
	}
}
