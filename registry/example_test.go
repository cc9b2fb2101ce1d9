package registry_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"os"
	"testing"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/local"
	"github.com/berth-sh/berth/registry"
)

// TestMain lets this test binary serve as the sandboxes' agent, as any Go program
// that embeds berth does (see docs/library.md): the registry's default agent binary
// is the running program, started under the name berth-agent.
func TestMain(m *testing.M) {
	if agent.IsAgent() {
		os.Exit(agent.Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// A Go program opens a registry on the local driver, runs a command in session
// chat:42, reads its output and closes the registry. Without a config (nil) every
// session runs on local; its sandbox stays for the next call until removed.
func Example() {
	ctx := context.Background()
	state, _ := os.MkdirTemp("", "berth-example-")
	defer os.RemoveAll(state)
	reg, err := registry.Open(ctx, nil, registry.WithStateDir(state),
		registry.WithDriver(local.Name, func() backend.TerminalBackend { return local.New() }))
	if err != nil {
		log.Fatal(err)
	}
	defer reg.Close()
	var out bytes.Buffer
	p, _, err := reg.Exec(ctx, "chat:42", backend.ExecRequest{Argv: []string{"echo", "hello from chat:42"}, Stdout: &out})
	if err != nil {
		log.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s(exit %d)\n", out.String(), res.ExitCode)
	reg.RemoveSession(ctx, "chat:42")
	// Output:
	// hello from chat:42
	// (exit 0)
}

// A program runs in process every driver it links: importing a driver's package
// registers it (here local, imported above), and WithLinkedDrivers hands each one to
// the registry. Without it the registry would launch local's plugin from the running
// program, which this test binary does not serve.
func ExampleWithLinkedDrivers() {
	ctx := context.Background()
	state, _ := os.MkdirTemp("", "berth-example-")
	defer os.RemoveAll(state)
	reg, err := registry.Open(ctx, nil, registry.WithStateDir(state), registry.WithLinkedDrivers())
	if err != nil {
		log.Fatal(err)
	}
	defer reg.Close()
	var out bytes.Buffer
	p, _, err := reg.Exec(ctx, "main", backend.ExecRequest{Argv: []string{"echo", "in process"}, Stdout: &out})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := p.Wait(); err != nil {
		log.Fatal(err)
	}
	fmt.Print(out.String())
	reg.RemoveSession(ctx, "main")
	// Output:
	// in process
}
