package conformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/registry"
)

// needsRegistry is the skip reason of the registry cases when Options.OpenRegistry is
// nil.
const needsRegistry = "needs a registry (run through berth conformance or pass Options.OpenRegistry)"

// registryConfig returns the config of the registry cases: a session-isolated rule for
// "conf-iso-ID:*" and a shared rule (sandbox name "conf-shared-ID") for
// "conf-shared-ID:*", both on the driver under test.
func (h *Harness) registryConfig(id string) string {
	image := h.ruleLines()
	driver := strconv.Quote(h.Info.Name)
	return fmt.Sprintf(`scope "conf-iso-%[1]s:*" {
  driver    = %[2]s
  isolation = "session"
%[3]s}

scope "conf-shared-%[1]s:*" {
  driver    = %[2]s
  isolation = "shared"
  name      = "conf-shared-%[1]s"
%[3]s}
`, id, driver, image)
}

// openRegistry opens the registry of the registry cases, or skips.
func (h *Harness) openRegistry(t T, id string) *registry.Registry {
	t.Helper()
	if h.Options.OpenRegistry == nil {
		t.Skip(needsRegistry)
	}
	cfg := h.registryConfig(id)
	r, err := h.Options.OpenRegistry(t, cfg)
	if err != nil {
		t.Fatalf("opening a registry with config\n%s: %v", cfg, err)
	}
	return r
}

// acquire acquires session, registers its removal, and checks the sandbox runs.
func acquire(t T, r *registry.Registry, session string) *registry.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), createTimeout)
	defer cancel()
	lease, err := r.Acquire(ctx, session)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", session, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
		defer cancel()
		if err := r.RemoveSession(ctx, session); err != nil && !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("cleanup: RemoveSession(%s): %v", session, err)
		}
		if err := driverOf(t, r, lease).Remove(ctx, lease.Sandbox); err != nil {
			t.Errorf("cleanup: Remove(%s): %v", lease.Sandbox, err)
		}
	})
	ictx, icancel := context.WithTimeout(t.Context(), callTimeout)
	defer icancel()
	sb, err := driverOf(t, r, lease).Inspect(ictx, lease.Sandbox)
	if err != nil {
		t.Fatalf("Inspect(%s) of session %s's sandbox: %v", lease.Sandbox, session, err)
	}
	if sb.State != backend.StateRunning {
		t.Errorf("session %s's sandbox %s is %q, want running", session, lease.Sandbox, sb.State)
	}
	return lease
}

// leaseSh runs `sh -c script sh args...` in a lease's session through r; it must exit
// 0.
func leaseSh(t T, r *registry.Registry, lease *registry.Lease, script string, args ...string) execOut {
	t.Helper()
	out, _ := regExec(t, r, lease.Session, script, args...)
	return execOut{Stdout: out}
}

// driverOf returns the driver of a lease's sandbox, as r runs it.
func driverOf(t T, r *registry.Registry, lease *registry.Lease) backend.TerminalBackend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	b, err := r.Backend(ctx, lease.Driver)
	if err != nil {
		t.Fatalf("driver %s of session %s: %v", lease.Driver, lease.Session, err)
	}
	return b
}

// Two sessions under a session-isolated rule get different sandboxes, and a file one
// writes is not in the other's; the same session again gets the same sandbox.
func caseSessionsIsolated(t T, h *Harness) {
	id := randHex(4)
	r := h.openRegistry(t, id)
	s1, s2 := "conf-iso-"+id+":1", "conf-iso-"+id+":2"
	l1 := acquire(t, r, s1)
	l2 := acquire(t, r, s2)
	if l1.Sandbox == l2.Sandbox {
		t.Fatalf("sessions %s and %s under a session-isolated rule share sandbox %s", s1, s2, l1.Sandbox)
	}
	if again := acquire(t, r, s1); again.Sandbox != l1.Sandbox {
		t.Errorf("session %s got sandbox %s, then %s", s1, l1.Sandbox, again.Sandbox)
	}
	file := "berth-conf-session-" + randHex(4)
	leaseSh(t, r, l1, `echo secret > "$1"`, file)
	if out := leaseSh(t, r, l1, `cat "$1"`, file); out.Stdout != "secret\n" {
		t.Fatalf("reading the file back in session %s: %q", s1, out.Stdout)
	}
	if out := leaseSh(t, r, l2, `if [ -e "$1" ]; then echo present; fi`, file); strings.TrimSpace(out.Stdout) != "" {
		t.Errorf("a file written in session %s is in session %s's directory", s1, s2)
	}
}

// Two sessions under a shared rule get the same sandbox, and see each other's files.
func caseSessionsShared(t T, h *Harness) {
	id := randHex(4)
	r := h.openRegistry(t, id)
	s1, s2 := "conf-shared-"+id+":1", "conf-shared-"+id+":2"
	l1 := acquire(t, r, s1)
	l2 := acquire(t, r, s2)
	if l1.Sandbox != l2.Sandbox {
		t.Fatalf("sessions %s and %s under a shared rule got sandboxes %s and %s, want one", s1, s2, l1.Sandbox, l2.Sandbox)
	}
	file := "berth-conf-shared-" + randHex(4)
	leaseSh(t, r, l1, `echo shared > "$1"`, file)
	if out := leaseSh(t, r, l2, `cat "$1"`, file); out.Stdout != "shared\n" {
		t.Errorf("a file written in session %s is not in session %s's sandbox: %q", s1, s2, out.Stdout)
	}
}

// RegistryOpener returns an Options.OpenRegistry that writes the config text to
// config.hcl in a t.TempDir(), loads it with config.Load(path, load...) (so load
// names the drivers the text may use: config.WithKnownDrivers, default the built-in
// ones), opens a registry on it with a state dir of its own (another t.TempDir(),
// or the config's state_dir when the text sets one; a registry.WithStateDir in opts
// replaces either), then opts, and closes it in
// t.Cleanup. The registry's clock is always a Clock of its own (ClockOf), which the
// retention cases advance instead of waiting: a registry.WithClock in opts is
// overridden. Pass registry.WithBerthBinary (the agent source and plugin server)
// and, for an in-process driver, registry.WithDriver (and its name in load);
// without it the registry launches the driver as a plugin.
func RegistryOpener(load []config.Option, opts ...registry.Option) func(t T, configHCL string) (*registry.Registry, error) {
	return func(t T, configHCL string) (*registry.Registry, error) {
		path := filepath.Join(t.TempDir(), "config.hcl")
		if err := os.WriteFile(path, []byte(configHCL), 0o600); err != nil {
			return nil, err
		}
		cfg, err := config.Load(path, load...)
		if err != nil {
			return nil, err
		}
		clk := NewClock()
		dir := cfg.StateDir // the pool cases reopen a state dir with a changed config
		if dir == "" {
			dir = filepath.Join(t.TempDir(), "state")
		}
		all := append([]registry.Option{registry.WithStateDir(dir)}, opts...)
		all = append(all, registry.WithClock(clk.Now))
		ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
		defer cancel()
		r, err := registry.Open(ctx, cfg, all...)
		if err != nil {
			return nil, err
		}
		clocks.Store(r, clk)
		t.Cleanup(func() {
			clocks.Delete(r)
			if err := r.Close(); err != nil {
				t.Errorf("cleanup: closing the registry: %v", err)
			}
		})
		return r, nil
	}
}
