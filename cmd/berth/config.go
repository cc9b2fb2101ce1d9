package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/registry/config"
	"github.com/spf13/cobra"
)

func newConfigCmd(g *globals) *cobra.Command {
	cfg := group(&cobra.Command{Use: "config", Short: "Check a config file or explain how a session is placed"})
	cfg.AddCommand(&cobra.Command{
		Use:   "check [FILE]",
		Short: "Check a config file (default: the one berth would load) and report errors with file:line:col",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			flag := g.configPath
			if len(args) == 1 {
				flag = args[0]
			}
			path, explicit, err := config.ResolvePath(flag)
			if err != nil {
				return failure(err)
			}
			if _, err := os.Stat(path); err != nil && !explicit {
				fmt.Fprintf(os.Stdout, "no config file at %s: every session runs on the local driver\n", path)
				return nil
			}
			self, _ := os.Executable() // without it, discovery skips the binary's directory
			c, err := config.Load(path, g.configOptions(self)...)
			if err != nil {
				return failure(err)
			}
			if err := checkDriverBlocks(cmd.Context(), c); err != nil {
				return failure(err)
			}
			fmt.Fprintf(os.Stdout, "%s: ok, %d scope rules\n", path, len(c.Rules))
			return nil
		},
	})
	var asJSON bool
	explain := &cobra.Command{
		Use:   "explain SESSION",
		Short: "Show which rule a session matches, its driver and its final sandbox spec",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg, err := g.open(cmd.Context())
			if err != nil {
				return failure(err)
			}
			defer reg.Close()
			ex, err := reg.Explain(args[0])
			if err != nil {
				return failure(err)
			}
			out := explainJSON{
				Session: ex.Session, Rule: ex.Rule.Glob, RuleIndex: ex.RuleIndex, Position: ex.Position,
				Driver: ex.Driver, Isolation: string(ex.Isolation), Sandbox: ex.Sandbox, SpecHash: ex.SpecHash,
				Spec: ex.Spec, Retention: retentionJSON{OnClose: string(ex.Rule.Retention.OnClose)},
			}
			if d := ex.Rule.Retention.IdleTTL; d > 0 {
				out.Retention.IdleTTL = d.String()
				out.Retention.IdleAction = string(ex.Rule.Retention.IdleAction)
			}
			if d := ex.Rule.Retention.MaxAge; d > 0 {
				out.Retention.MaxAge = d.String()
			}
			if asJSON {
				return printJSON(out)
			}
			w := os.Stdout
			fmt.Fprintf(w, "session:   %s\n", out.Session)
			fmt.Fprintf(w, "rule:      scope %q (rule %d, %s)\n", out.Rule, out.RuleIndex+1, out.Position)
			fmt.Fprintf(w, "driver:    %s\n", out.Driver)
			fmt.Fprintf(w, "isolation: %s\n", out.Isolation)
			fmt.Fprintf(w, "sandbox:   %s\n", out.Sandbox)
			idle := orNone(out.Retention.IdleTTL)
			if out.Retention.IdleAction != "" {
				idle += " idle_action=" + out.Retention.IdleAction
			}
			fmt.Fprintf(w, "retention: on_close=%s idle_ttl=%s max_age=%s\n", out.Retention.OnClose, idle, orNone(out.Retention.MaxAge))
			fmt.Fprintln(w, "spec:")
			b, _ := json.MarshalIndent(out.Spec, "  ", "  ")
			fmt.Fprintf(w, "  %s\n", b)
			return nil
		},
	}
	explain.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cfg.AddCommand(explain)
	return cfg
}

// checkDriverBlocks decodes every driver block of c against its driver's schema, for
// the built-in drivers, whose schema is known without starting them, and applies it
// to a fresh driver of that kind (Configure checks values, e.g. containerd's seccomp
// profile file, and connects to nothing), naming the block's position on error.
func checkDriverBlocks(ctx context.Context, c *config.Config) error {
	for name := range c.Drivers {
		// No state dir is made: Configure only records it.
		d, err := configuredBuiltin(ctx, c, name, filepath.Join(os.TempDir(), "berth-config-check"))
		if v, ok := d.(interface{ Validate(context.Context) error }); ok && err == nil {
			err = v.Validate(ctx) // what Configure checks only for shape (containerd's profile file)
		}
		closeDriver(d)
		if err != nil {
			if b := c.Drivers[name]; b != nil {
				return fmt.Errorf("%s:%d:%d: %w", b.Range.Filename, b.Range.Start.Line, b.Range.Start.Column, err)
			}
			return err
		}
	}
	return nil
}

// configuredBuiltin returns a fresh in-process built-in driver called name,
// configured with c's block for it (decoded against its schema) and stateDir; nil
// when name is no built-in driver or takes no config. On error the driver is closed.
func configuredBuiltin(ctx context.Context, c *config.Config, name, stateDir string) (backend.TerminalBackend, error) {
	mk := builtinDrivers()[name]
	if mk == nil {
		return nil, nil
	}
	d := mk()
	cfg, ok := d.(backend.Configurer)
	if !ok {
		closeDriver(d)
		return nil, nil
	}
	schema, err := cfg.ConfigSchema(ctx)
	if err == nil {
		var raw []byte
		if raw, err = c.DriverConfig(name, schema); err == nil {
			err = cfg.Configure(ctx, backend.DriverSetup{Config: raw, StateDir: stateDir})
		}
	}
	if err != nil {
		closeDriver(d)
		return nil, err
	}
	return d, nil
}

// closeDriver closes d when it has a Close method (nil is fine).
func closeDriver(d backend.TerminalBackend) {
	if c, ok := d.(interface{ Close() error }); ok {
		c.Close()
	}
}

// explainJSON is the output of `berth config explain --json`.
type explainJSON struct {
	Session   string              `json:"session"`
	Rule      string              `json:"rule"`
	RuleIndex int                 `json:"rule_index"`
	Position  string              `json:"position"`
	Driver    string              `json:"driver"`
	Isolation string              `json:"isolation"`
	Sandbox   string              `json:"sandbox"`
	SpecHash  string              `json:"spec_hash"`
	Retention retentionJSON       `json:"retention"`
	Spec      backend.SandboxSpec `json:"spec"`
}

type retentionJSON struct {
	OnClose    string `json:"on_close"`
	IdleTTL    string `json:"idle_ttl,omitempty"`
	IdleAction string `json:"idle_action,omitempty"`
	MaxAge     string `json:"max_age,omitempty"`
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
