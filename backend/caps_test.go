package backend_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
)

// bare implements only TerminalBackend, and claims every interface flag in Info.
type bare struct{ agent backend.AgentReach }

func (b bare) Info(context.Context) (backend.Info, error) {
	c := backend.Capabilities{Agent: b.agent, Copy: true, ImagePull: true, ImageImport: true, Config: true, AgentDial: true, Validate: true, TTY: true}
	rt := c
	return backend.Info{Name: "bare", Capabilities: backend.Capabilities{
		Agent: b.agent, Copy: true, ImagePull: true, ImageImport: true, Config: true, AgentDial: true, Validate: true, TTY: true,
		Runtimes: []backend.RuntimeCapabilities{{Name: "runsc", Capabilities: rt}},
	}}, nil
}
func (bare) Create(context.Context, backend.CreateRequest) (backend.Sandbox, error) {
	return backend.Sandbox{}, nil
}
func (bare) Inspect(context.Context, string) (backend.Sandbox, error) {
	return backend.Sandbox{}, nil
}
func (bare) List(context.Context, map[string]string) ([]backend.Sandbox, error) { return nil, nil }
func (bare) Stop(context.Context, string, time.Duration) error                  { return nil }
func (bare) Close() error                                                       { return nil }
func (bare) Remove(context.Context, string) error                               { return nil }

// full adds every optional interface.
type full struct{ bare }

func (full) ConfigSchema(context.Context) ([]backend.ConfigField, error) { return nil, nil }
func (full) Configure(context.Context, backend.DriverSetup) error        { return nil }
func (full) PullImage(context.Context, string, backend.PullPolicy, func(backend.PullProgress)) error {
	return nil
}
func (full) ImportImage(context.Context, io.Reader) ([]string, error) { return nil, nil }
func (full) DialAgent(context.Context, string) (net.Conn, error)      { return nil, nil }
func (full) Validate(context.Context, backend.SandboxSpec) error      { return nil }
func (full) CopyIn(context.Context, string, string, io.Reader) error  { return nil }
func (full) CopyOut(context.Context, string, string, io.Writer) error { return nil }

// forwarder stands for a driver elsewhere: its Info is kept as it is.
type forwarder struct{ full }

func (forwarder) ForwardsDriver() {}

type flags struct{ copy, pull, imp, config, dial, validate bool }

func flagsOf(c backend.Capabilities) flags {
	return flags{c.Copy, c.ImagePull, c.ImageImport, c.Config, c.AgentDial, c.Validate}
}

// InfoOf sets the interface flags from the driver's type, whatever its Info claims,
// in Capabilities and in each runtime's entry; it keeps the other fields and a
// Forwarder's flags.
func TestInfoOfDerivesInterfaceFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    backend.TerminalBackend
		want flags
	}{
		{"bare without agent", bare{}, flags{}},
		{"bare with agent: copy through the agent", bare{agent: backend.AgentSocket}, flags{copy: true}},
		{"full", full{}, flags{true, true, true, true, true, true}},
		{"forwarder keeps its Info", forwarder{full{bare{}}}, flags{true, true, true, true, true, true}},
	} {
		info, err := backend.InfoOf(context.Background(), tc.b)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := flagsOf(info.Capabilities); got != tc.want {
			t.Errorf("%s: flags %+v, want %+v", tc.name, got, tc.want)
		}
		if len(info.Capabilities.Runtimes) != 1 {
			t.Fatalf("%s: runtimes %+v", tc.name, info.Capabilities.Runtimes)
		}
		if got := flagsOf(info.Capabilities.Runtimes[0].Capabilities); got != tc.want {
			t.Errorf("%s: runsc's flags %+v, want %+v", tc.name, got, tc.want)
		}
		if !info.Capabilities.TTY || info.Name != "bare" {
			t.Errorf("%s: other fields changed: %+v", tc.name, info)
		}
	}
}

// A Forwarder's Info is not rewritten even where its own type has fewer methods.
func TestInfoOfKeepsForwardersFlags(t *testing.T) {
	info, err := backend.InfoOf(context.Background(), bareForwarder{})
	if err != nil || !info.Capabilities.ImagePull || !info.Capabilities.Validate {
		t.Fatalf("InfoOf(forwarder) = %+v, %v; want the flags its Info reports", info.Capabilities, err)
	}
}

type bareForwarder struct{ bare }

func (bareForwarder) ForwardsDriver() {}
