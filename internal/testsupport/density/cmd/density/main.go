// Command density measures what idle sandboxes cost on this machine (package
// internal/testsupport/density; docs/performance.md, "Density"). Run it as root through
// scripts/density.sh, which builds the static agent:
//
//	scripts/density.sh docker 100
//	scripts/density.sh containerd 1000 -parallel 4 -json
//
// It creates N idle sandboxes beside a probe sandbox through the driver in process,
// prints the probe's and the fleet's figures and the probe's warm exec p50/p95 with
// 0 and N beside it, and removes everything it made (also on SIGINT or SIGTERM).
// Exit status: 0 when it measured and cleaned up, 1 otherwise.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/containerd"
	"github.com/berth-sh/berth/docker"
	"github.com/berth-sh/berth/internal/testsupport/density"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
)

func main() {
	var (
		driver    = flag.String("driver", "docker", "driver: docker or containerd")
		n         = flag.Int("n", 10, "idle sandboxes beside the probe")
		rounds    = flag.Int("rounds", 30, "interleaved exec rounds per measurement (at least 30)")
		parallel  = flag.Int("parallel", 4, "sandboxes created or removed at once")
		agentBin  = flag.String("agent", "", "static berth binary to use as the agent (required)")
		image     = flag.String("image", testimage.Ref, "image of the sandboxes; the default is built from busybox-static and imported")
		host      = flag.String("host", os.Getenv("DOCKER_HOST"), "docker: engine address")
		address   = flag.String("address", os.Getenv("CONTAINERD_ADDRESS"), "containerd: daemon socket")
		namespace = flag.String("namespace", "", "containerd: namespace (default the driver's)")
		state     = flag.String("state", "", "state dir for the agent and its per-sandbox directories (default a new temporary one, removed at the end)")
		maxThr    = flag.Int("max-host-threads", 28000, "stop creating when the host's threads reach this")
		minAvail  = flag.Int64("min-mem-available-mb", 4096, "stop creating when MemAvailable falls below this many MiB")
		asJSON    = flag.Bool("json", false, "print the report as JSON on stdout")
	)
	flag.Parse()
	if *agentBin == "" {
		fmt.Fprintln(os.Stderr, "density: -agent is required: build one with CGO_ENABLED=0 go build -o /tmp/ ./cmd/berth-cli (or ./cmd/berth-agent) and pass /tmp/berth-cli")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var d interface {
		backend.TerminalBackend
		backend.ImageImporter
		backend.Configurer
	}
	switch *driver {
	case "docker":
		d = docker.New(docker.WithHost(*host))
	case "containerd":
		opts := []containerd.Option{containerd.WithAddress(*address)}
		if *namespace != "" {
			opts = append(opts, containerd.WithNamespace(*namespace))
		}
		d = containerd.New(opts...)
	default:
		fmt.Fprintf(os.Stderr, "density: unknown driver %q (docker or containerd)\n", *driver)
		os.Exit(2)
	}
	defer d.Close()

	dir := *state
	if dir == "" {
		tmp, err := os.MkdirTemp("", "berth-density-")
		if err != nil {
			fail(err)
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	owner := density.NewOwner()
	if err := d.Configure(ctx, backend.DriverSetup{StateDir: filepath.Join(dir, "drivers", *driver), Owner: owner}); err != nil {
		fail(fmt.Errorf("configuring the %s driver: %w", *driver, err))
	}
	if *image == testimage.Ref {
		archive, err := testimage.Archive()
		if err != nil {
			fail(err)
		}
		ictx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err = d.ImportImage(ictx, bytes.NewReader(archive))
		cancel()
		if err != nil {
			fail(fmt.Errorf("importing the test image: %w", err))
		}
	}
	fmt.Fprintf(os.Stderr, "density: %s, N=%d, host threads %d, load %s\n", *driver, *n, density.HostThreads(), density.LoadAvg())
	rep, err := density.Run(ctx, density.Options{
		Driver: d, AgentBinary: *agentBin, StateDir: dir, Image: *image,
		N: *n, Rounds: *rounds, Parallel: *parallel,
		MaxHostThreads: *maxThr, MinMemAvailable: *minAvail << 20,
		Owner: owner, Log: os.Stderr,
	})
	if *asJSON && rep != nil {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "density: %v\n", err)
	os.Exit(1)
}
