package cli

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/backends/catalog"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/spf13/cobra"
)

func newDriversCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "drivers",
		Short: "List drivers with version, negotiated protocol, capabilities, health and executable",
		Long: `List the built-in drivers and the third-party drivers berth can find (berth-driver-NAME
executables in $BERTH_PLUGIN_PATH, the config's plugin_dirs and beside berth, and
those named by a driver block's plugin key). Each is started to report its version, the
plugin protocol version negotiated with it, its capabilities and the executable that
serves it: berth itself for local, berth-driver-docker and berth-driver-containerd
(beside berth, else in the plugin search path) for docker and containerd. One that
cannot start, or whose runtime does not answer (docker and containerd ask their engine
or daemon, waiting at most 5 s), shows "failed [N]" under HEALTH, and the table is
followed by "[N] NAME: why" (--json: the message is its health).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// Through berth serve when one runs: its drivers, its plugins.
			rows, err := query(cmd.Context(), g, api.DriverRows)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(rows)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tPROTOCOL\tSERVED\tHEALTH\tCAPABILITIES\tEXECUTABLE")
			// A failed driver's HEALTH is a whole error message, often hundreds of
			// characters: the table says "failed [N]" and the messages follow it.
			var failures []string
			for _, d := range rows {
				path := d.Path
				if path == "" {
					path = "-"
				}
				version, protocol, health, caps := d.Version, strconv.Itoa(d.Protocol), d.Health, capsSummary(d.Capabilities)
				if health != "ok" {
					failures = append(failures, fmt.Sprintf("[%d] %s: %s", len(failures)+1, d.Name, d.Health))
					health = fmt.Sprintf("failed [%d]", len(failures))
					if d.Version == "" {
						version, protocol, caps = "-", "-", "-" // it never answered: none of them known
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, version, protocol, d.Served, health, caps, path)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(failures) > 0 {
				fmt.Printf("\n%s\n", strings.Join(failures, "\n"))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// capsSummary renders capabilities as a short comma-separated list.
func capsSummary(c backend.Capabilities) string {
	var s []string
	s = append(s, "fs="+string(c.FSIsolation))
	if c.PIDIsolation {
		s = append(s, "pid")
	}
	if len(c.NetworkModes) > 0 {
		s = append(s, "net="+strings.Join(c.NetworkModes, "|"))
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{c.TTY, "tty"}, {c.CPULimit, "cpu"}, {c.MemoryLimit, "memory"}, {c.PidsLimit, "pids"},
		{c.DropCapabilities, "cap-drop"}, {c.Copy, "copy"}, {c.StopStart, "stop-start"},
		{c.ExecUser, "user"}, {c.ImagePull, "pull"}, {c.ImageImport, "import"}, {c.Config, "config"},
		{c.HasAgent(), "shell"}, {c.HasAgent(), "jobs"}, {c.AgentDial, "dial-agent"}, {c.Validate, "validate"}} {
		if f.on {
			s = append(s, f.name)
		}
	}
	if k := c.Keeps(); k != "" && k != backend.StopKeepsAll {
		s = append(s, "stop-keeps="+string(k))
	}
	if c.Agent != backend.AgentNone {
		s = append(s, "agent="+string(c.Agent))
	}
	// Each runtime with its kernel and how it differs from the default's: what it
	// lacks, and its own value of a key=value entry: runtime=runsc(gvisor;net=none;-memory).
	base, _ := c.ForRuntime("")
	for _, r := range c.Runtimes {
		entry := r.Name + "(" + r.Kernel
		have := strings.Split(capsSummary(r.Capabilities), ",")
		for _, f := range strings.Split(capsSummary(base), ",") {
			if slices.Contains(have, f) {
				continue
			}
			key, _, ok := strings.Cut(f, "=")
			if i := slices.IndexFunc(have, func(h string) bool { return ok && strings.HasPrefix(h, key+"=") }); i >= 0 {
				entry += ";" + have[i]
			} else {
				entry += ";-" + f
			}
		}
		s = append(s, "runtime="+entry+")")
	}
	return strings.Join(s, ",")
}

// newDriverCmd is the hidden `berth driver serve NAME`: the plugin process of a
// driver compiled into berth (local), launched by berth itself through go-plugin.
// docker and containerd are served by their own executables (catalog.Builtins).
func newDriverCmd(g *globals) *cobra.Command {
	driver := &cobra.Command{Use: "driver", Hidden: true, Short: "Serve a driver compiled into berth as a plugin (internal)"}
	driver.AddCommand(&cobra.Command{
		Use:   "serve NAME",
		Short: "Serve the driver NAME, compiled into berth, over the plugin protocol",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mk, ok := catalog.Linked(args[0])
			if !ok {
				if b, ok := catalog.LookupBuiltin(args[0]); ok && b.Executable != "" {
					return execrun.Usage("the %s driver is not compiled into berth: it is served by its own executable, %s (build it with CGO_ENABLED=0 go build -o DIR/ ./cmd/%s and put it beside berth)", b.Name, b.Executable, b.Executable)
				}
				return execrun.Usage("no driver %q is compiled into berth (only %s)", args[0], strings.Join(catalog.LinkedNames(), ", "))
			}
			// nil: go-hclog JSON on stderr at the level the host asked for.
			backends.Serve(mk(), nil)
			return nil
		},
	})
	return driver
}
