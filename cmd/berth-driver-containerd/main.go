// Command berth-driver-containerd serves berth's containerd driver (package
// containerd) as a plugin: berth launches it through go-plugin for every command that
// needs the driver, as it launches third-party drivers. It is its own executable so
// that the berth binary links no containerd client; berth looks for it beside itself
// first, then in the plugin search path ($BERTH_PLUGIN_PATH, plugin_dirs). Build it
// static, beside berth:
//
//	CGO_ENABLED=0 go build -o DIR/ ./cmd/...
//
// `berth-driver-containerd describe` prints the driver's name, version, protocol
// versions, capabilities and config schema as JSON (see backends.Main).
//
// One hidden sub-command is for `berth conformance --driver containerd` only:
//
//	berth-driver-containerd remove-unowned NAME < CONFIG.json
//
// configures the driver with the JSON object on stdin (the decoded driver
// "containerd" {} block, as Configure gets it: address, namespace; empty means the
// defaults) and removes container NAME of its namespace with its task and snapshot
// whatever its labels (containerd.Driver.RemoveUnowned). containerd drops empty label
// values, so the sandbox without an owner label that the suite's
// retention/reconcile-leaves-others plants has no owner label at all and the driver's
// Remove rightly refuses it; berth itself links no containerd client to do this. A
// missing container succeeds. Exit status 0 on success; 1 with the error on stderr;
// 2 for a usage error.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/containerd"
)

// removeUnownedCommand is the hidden sub-command (cmd/berth's conformance.go runs it).
const removeUnownedCommand = "remove-unowned"

// removeTimeout bounds remove-unowned.
const removeTimeout = 2 * time.Minute

func main() {
	if len(os.Args) > 1 && os.Args[1] == removeUnownedCommand {
		os.Exit(removeUnowned(os.Args[2:], os.Stdin, os.Stderr))
	}
	os.Exit(backends.Main(containerd.New()))
}

// removeUnowned is the remove-unowned sub-command: args holds NAME, stdin the
// driver's config JSON.
func removeUnowned(args []string, stdin io.Reader, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintf(stderr, "usage: %s %s NAME < CONFIG.json\n", os.Args[0], removeUnownedCommand)
		return 2
	}
	cfg, err := io.ReadAll(io.LimitReader(stdin, 1<<20))
	if err != nil {
		fmt.Fprintf(stderr, "%s: reading the config on stdin: %v\n", removeUnownedCommand, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
	defer cancel()
	d := containerd.New()
	defer d.Close()
	if err := d.Configure(ctx, backend.DriverSetup{Config: cfg}); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", removeUnownedCommand, err)
		return 1
	}
	if err := d.RemoveUnowned(ctx, args[0]); err != nil {
		fmt.Fprintf(stderr, "%s %s: %v\n", removeUnownedCommand, args[0], err)
		return 1
	}
	return 0
}
