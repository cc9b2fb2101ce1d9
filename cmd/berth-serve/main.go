// Command berth-serve is berth's HTTP API server: `berth serve` runs it in its own
// place (execve, same arguments and pid), from beside the berth binary. It is berth's
// command line with package server linked in, kept out of berth itself because the
// server links Prometheus' client, whose initialisers would cost every berth command
// about a millisecond at start (docs/architecture.md). Every other command works
// here too, as berth's.
//
// The berth-cli beside it (berth's full command line, cmd/berth-cli) is what the
// daemon runs as the local driver's plugin and copies into sandboxes as their agent,
// as an embedded berth would: the two never disagree on the agent a sandbox should
// hold.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/berth-sh/berth/cli"
	"github.com/berth-sh/berth/cli/front"
	_ "github.com/berth-sh/berth/internal/sigstart/early" // catches SIGINT, SIGTERM, SIGHUP from the start
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server"
)

func main() {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth-serve: cannot find its own executable: %v\n", err)
		os.Exit(125)
	}
	berth := filepath.Join(filepath.Dir(self), front.FullCLI)
	if _, err := os.Stat(berth); err != nil {
		fmt.Fprintf(os.Stderr, "berth-serve: %s, berth's full command line, must be beside it: %v; build them all (CGO_ENABLED=0 go build -o %s/ ./cmd/...)\n", front.FullCLI, err, filepath.Dir(self))
		os.Exit(125)
	}
	os.Exit(cli.Main(os.Args[1:], cli.WithServer(apiServer{server.NewMetrics()}), cli.WithBerth(berth)))
}

// apiServer is cli.Server over package server, with one set of metrics for the
// process (every registry it is given, the first and each reload's, feeds them).
type apiServer struct{ metrics *server.Metrics }

func (a apiServer) RegistryOptions() []registry.Option { return a.metrics.RegistryOptions() }

func (apiServer) OpenAudit(path string) error { return server.OpenAudit(path) }

func (a apiServer) Start(reg *registry.Registry, o cli.ServerOptions) cli.Daemon {
	return daemon{server.New(reg, server.WithLogger(o.Log), server.WithToken(o.Token), server.WithVersion(o.Version),
		server.WithMaxRequestBody(o.MaxRequestBody), server.WithBodyTimeout(o.BodyTimeout), server.WithMetrics(a.metrics),
		server.WithAudit(o.AuditPath, o.AuditMaxMB, o.AuditKeep), server.WithPruneInterval(o.PruneInterval),
		server.WithConfigCheck(o.ConfigCheck))}
}

// daemon is cli.Daemon: a server.Server whose retention runs at its
// WithPruneInterval.
type daemon struct{ *server.Server }

func (d daemon) RunRetention(ctx context.Context) { d.Server.RunRetention(ctx, 0, nil) }
