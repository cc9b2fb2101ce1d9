package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/cli/hermes"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
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
				return execrun.Failure(err)
			}
			if _, err := os.Stat(path); err != nil && !explicit {
				fmt.Fprintf(os.Stdout, "no config file at %s: every session runs on the local driver\n", path)
				return nil
			}
			// The daemon's own file goes through it: its checks are the daemon's
			// (its environment, its user), what a SIGHUP would meet.
			var chk apiv1.ConfigCheck
			if d, derr := g.daemonFor(cmd.Context(), false); derr == nil && d != nil && sameConfig(d.Status.Config, path) {
				if chk, err = d.CheckConfig(cmd.Context()); err != nil {
					return execrun.Failure(err)
				}
			} else {
				chk = checkConfig(cmd.Context(), g, path)
			}
			return printConfigCheck(chk)
		},
	})
	var asJSON bool
	explain := &cobra.Command{
		Use:   "explain SESSION",
		Short: "Show which rule a session matches, its driver and its final sandbox spec",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Through berth serve when one runs: how its config places the session.
			out, err := query(cmd.Context(), g, func(a api, ctx context.Context) (apiv1.Explanation, error) {
				return a.Explanation(ctx, args[0])
			})
			if err != nil {
				return err
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
	cfg.AddCommand(newConfigImportCmd())
	return cfg
}

// sameConfig reports whether the daemon's config file daemon (absolute, "" for
// none) is path.
func sameConfig(daemon, path string) bool {
	abs, err := filepath.Abs(path)
	return err == nil && daemon != "" && filepath.Clean(daemon) == abs
}

// checkConfig checks the config file at path as berth config check does: it is
// loaded, its mounts checked against the state dir (warnings) and its drivers
// started on a temporary state dir (checkDrivers: notes). The answer says how the
// check ended; nothing is returned as an error, so that berth serve can answer it
// as it is (POST /v1/config/check).
func checkConfig(ctx context.Context, g *globals, path string) apiv1.ConfigCheck {
	chk := apiv1.ConfigCheck{Path: path}
	fail := func(err error) apiv1.ConfigCheck {
		chk.Failure = err.Error()
		return chk
	}
	self, err := g.self() // the drivers' plugins are found from it
	if err != nil {
		return fail(err)
	}
	c, err := config.Load(path, g.configOptions(self)...)
	if err != nil {
		return fail(err)
	}
	stateDir, err := g.resolveStateDir(c)
	if err != nil {
		return fail(err)
	}
	warnings, err := registry.CheckMounts(c, stateDir)
	if len(warnings) > 0 {
		chk.Warnings = config.FormatDiagnostics(warnings)
	}
	if err != nil {
		return fail(err)
	}
	if chk.Notes, err = checkDrivers(ctx, g, c, self); err != nil {
		return fail(err)
	}
	chk.OK, chk.Rules = true, len(c.Rules)
	return chk
}

// printConfigCheck prints a check's outcome as berth config check does: warnings
// and notes on stderr, "PATH: ok, N scope rules" ("1 scope rule") on stdout, or the failure (exit
// 125).
func printConfigCheck(chk apiv1.ConfigCheck) error {
	if chk.Warnings != "" {
		fmt.Fprintln(os.Stderr, chk.Warnings)
	}
	if !chk.OK {
		return execrun.Failure(errors.New(chk.Failure))
	}
	for _, n := range chk.Notes {
		fmt.Fprintf(os.Stderr, "berth: note: %s\n", n)
	}
	rules := "scope rules"
	if chk.Rules == 1 {
		rules = "scope rule"
	}
	fmt.Fprintf(os.Stdout, "%s: ok, %d %s\n", chk.Path, chk.Rules, rules)
	return nil
}

// newConfigImportCmd is `berth config import hermes FILE`: it prints the berth
// config (HCL) that stands for the terminal: section of a hermes-agent config file
// on stdout and a note per key without an equivalent on stderr (package
// cli/hermes; docs/hermes.md).
func newConfigImportCmd() *cobra.Command {
	imp := group(&cobra.Command{Use: "import", Short: "Translate another tool's config into a berth config"})
	var glob string
	h := &cobra.Command{
		Use:   "hermes FILE",
		Short: "Print the berth config for the terminal: section of a hermes-agent config.yaml; report keys without an equivalent on stderr",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := os.ReadFile(config.ExpandHome(args[0]))
			if err != nil {
				return execrun.Failure(fmt.Errorf("cannot read the hermes config: %w", err))
			}
			home, _ := os.UserHomeDir() // "" refuses a ~ volume with a message that says so
			res, err := hermes.Import(src, args[0], hermes.Options{Glob: glob, Home: home})
			if err != nil {
				return execrun.Failure(err)
			}
			if _, err := os.Stdout.Write(res.HCL); err != nil {
				return execrun.Failure(err)
			}
			for _, n := range res.Notes {
				fmt.Fprintf(os.Stderr, "berth: note: %s (no equivalent in the berth config)\n", n)
			}
			return nil
		},
	}
	h.Flags().StringVar(&glob, "scope", hermes.DefaultGlob, "scope glob of the rule: the session names the berth hermes plugin uses")
	imp.AddCommand(h)
	return imp
}

// checkDrivers starts, through a registry on a temporary state dir (so the check
// changes nothing of the user's), every driver that c has a driver block for or that
// a rule selects, as the plugin berth would run: that decodes each block against
// its driver's schema and applies it (Configure), errors at the block's
// file:line:col. Then, for every rule whose driver claims Capabilities.Validate, it
// asks the driver to check the rule's sandbox spec as Create would, without
// creating anything (backend.Validator: containerd reads its seccomp profile file,
// docker and containerd refuse what they refuse without a daemon), errors at the
// rule's file:line:col. Last, each rule's image is looked up in its driver's store
// (checkImage). The drivers' processes end before it returns. It returns notes on
// what it could not settle (an image the first exec will pull, a runtime that does
// not answer), or the first error.
func checkDrivers(ctx context.Context, g *globals, c *config.Config, self string) ([]string, error) {
	tmp, err := os.MkdirTemp("", "berth-config-check-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	opts := append([]registry.Option{registry.WithStateDir(tmp), registry.WithBerthBinary(self), registry.WithLogger(g.logger())}, g.driverOptions()...)
	reg, err := registry.Open(ctx, c, opts...)
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	owner, err := reg.Owner()
	if err != nil {
		return nil, err
	}
	// Drivers of blocks first (their errors carry the block's position), then those
	// of rules, in file order.
	var names []string
	for name := range c.Drivers {
		names = append(names, name)
	}
	sort.Strings(names)
	firstRule := map[string]*config.Rule{}
	for i := range c.Rules {
		r := &c.Rules[i]
		if firstRule[r.Driver] == nil {
			firstRule[r.Driver] = r
			if c.Drivers[r.Driver] == nil {
				names = append(names, r.Driver)
			}
		}
	}
	validators := map[string]backend.Validator{}
	pullers := map[string]backend.ImagePuller{}
	caps := map[string]backend.Capabilities{}
	silent := map[string]bool{} // drivers whose runtime did not answer
	var notes []string
	for _, name := range names {
		b, err := reg.Backend(ctx, name)
		if err == nil {
			var info backend.Info
			info, err = backend.InfoOf(ctx, b)
			switch {
			case err == nil:
				caps[name] = info.Capabilities
				if v, ok := b.(backend.Validator); ok && info.Capabilities.Validate {
					validators[name] = v
				}
				if p, ok := b.(backend.ImagePuller); ok && info.Capabilities.ImagePull {
					pullers[name] = p
				}
			case errors.Is(err, backend.ErrUnavailable):
				// The driver runs, its runtime (an engine that is down, on another
				// machine) does not answer: what only the runtime can say waits for
				// the first exec, as an image not pulled yet does.
				where := ""
				if r := firstRule[name]; r != nil {
					where = fmt.Sprintf("%s: scope %q: ", r.Pos(), r.Glob)
				}
				notes = append(notes, fmt.Sprintf("%sdriver %s: %v; its rules were checked without its runtime (their images, and what only the runtime can say, are checked by the first exec)", where, name, err))
				silent[name], err = true, nil
			}
		}
		if err != nil {
			if r := firstRule[name]; c.Drivers[name] == nil && r != nil {
				return nil, atRule(r, err)
			}
			return nil, err
		}
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		if silent[r.Driver] {
			continue
		}
		if _, err := registry.RuntimeCapabilities(caps[r.Driver], r); err != nil {
			return nil, err
		}
		if v := validators[r.Driver]; v != nil {
			if err := v.Validate(ctx, r.Spec(owner, r.ExampleSession())); err != nil {
				return nil, atRule(r, err)
			}
		}
		if p := pullers[r.Driver]; p != nil && r.Image != "" {
			note, err := checkImage(ctx, p, r)
			if err != nil {
				return nil, atRule(r, err)
			}
			if note != "" {
				notes = append(notes, fmt.Sprintf("%s: scope %q: %s", r.Pos(), r.Glob, note))
			}
		}
	}
	return notes, nil
}

// checkImage looks rule r's image up in its driver's store without pulling it
// (PullImage with backend.PullNever). Missing under pull = "never" is an error (the
// first exec would fail); missing otherwise is a note (the first exec pulls it), and
// so is a runtime that does not answer (nothing can be said about the image).
func checkImage(ctx context.Context, p backend.ImagePuller, r *config.Rule) (string, error) {
	err := p.PullImage(ctx, r.Image, backend.PullNever, nil)
	switch {
	case err == nil:
		return "", nil
	case errors.Is(err, backend.ErrNotFound) && r.Pull == backend.PullNever:
		return "", fmt.Errorf("image %s is not in driver %s's image store, and pull = \"never\" keeps berth from pulling it: import it (berth image import --driver %s FILE.tar), pull it with the runtime's own tool, or set pull = \"missing\"", r.Image, r.Driver, r.Driver)
	case errors.Is(err, backend.ErrNotFound):
		return fmt.Sprintf("image %s is not in driver %s's image store yet; the first exec pulls it (pull = %q)", r.Image, r.Driver, pullOrDefault(r.Pull)), nil
	case errors.Is(err, backend.ErrInvalid):
		return "", err
	}
	return fmt.Sprintf("could not look image %s up: %v", r.Image, err), nil
}

func pullOrDefault(p backend.PullPolicy) backend.PullPolicy {
	if p == "" {
		return backend.PullMissing
	}
	return p
}

// atRule prefixes err with rule r's position and glob.
func atRule(r *config.Rule, err error) error {
	return fmt.Errorf("%s: scope %q: %w", r.Pos(), r.Glob, err)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
