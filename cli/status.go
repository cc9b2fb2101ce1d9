package cli

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/spf13/cobra"
)

// statusJSON is what berth status --json prints.
type statusJSON struct {
	// Mode is "daemon" (commands go through berth serve) or "embedded".
	Mode string `json:"mode"`
	// Reason says why a command runs embedded.
	Reason string `json:"reason,omitempty"`
	// Daemon is the berth serve that commands go through, in daemon mode.
	Daemon *daemonJSON `json:"daemon,omitempty"`
	// StateDir and Config are this command's (in daemon mode, the daemon's too).
	StateDir string `json:"state_dir"`
	Config   string `json:"config"`
	// Version is this berth's version.
	Version string `json:"version"`
}

// daemonJSON is the daemon of berth status --json.
type daemonJSON struct {
	Address  string `json:"address"`
	PID      int    `json:"pid"`
	Version  string `json:"version"`
	StateDir string `json:"state_dir"`
	Config   string `json:"config"`
}

func newStatusCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [--json]",
		Short: "Say whether commands go through a running berth serve (and which) or run embedded",
		Long: `Say whether this berth's commands (exec, sessions, close, stop, rm, prune, job) go
through a running berth serve or run embedded, and where: the daemon's address, pid,
version, state dir and config file. A daemon whose state dir or config differs from
this command's is refused, as every command would refuse it: status exits 125 with
the same message.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			want, err := g.wantedIdentity()
			if err != nil {
				return execrun.Failure(err)
			}
			out := statusJSON{Mode: "embedded", StateDir: want.StateDir, Config: want.Config, Version: version}
			d, err := g.daemon(cmd.Context())
			switch {
			case err != nil:
				return execrun.Failure(err)
			case d != nil:
				out.Mode = "daemon"
				out.StateDir, out.Config = d.Status.StateDir, d.Status.Config
				out.Daemon = &daemonJSON{Address: d.Where(), PID: d.Status.PID, Version: d.Status.Version, StateDir: d.Status.StateDir, Config: d.Status.Config}
			case g.noDaemon() != "":
				out.Reason = g.noDaemon() + " asks for it"
			default:
				out.Reason = "no berth serve answers on " + filepath.Join(want.StateDir, serveSocket)
			}
			if asJSON {
				return printJSON(out)
			}
			w := os.Stdout
			if d != nil {
				fmt.Fprintf(w, "mode:      daemon\n")
				fmt.Fprintf(w, "daemon:    %s (pid %d, berth %s)\n", d.Where(), d.Status.PID, d.Status.Version)
			} else {
				fmt.Fprintf(w, "mode:      embedded (%s)\n", out.Reason)
			}
			fmt.Fprintf(w, "state dir: %s\n", out.StateDir)
			fmt.Fprintf(w, "config:    %s\n", orBuiltin(out.Config))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
