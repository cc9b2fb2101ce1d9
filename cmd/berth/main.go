// Command berth is berth's command line as its users run it: a thin front that makes
// a plain `berth exec` through a running berth serve itself, and hands every other
// command line to berth-cli, berth's full command line, beside it (execve: same
// arguments, environment and pid). It links only the standard library, x/sys and
// x/term, and berth's light packages, so that such an exec costs the start of a small program, not the
// initialisation of the registry, gRPC and HCL (package cli/front says when it
// takes a call; docs/architecture.md). Build it with the rest:
//
//	CGO_ENABLED=0 go build -o DIR/ ./cmd/...
//
// `go run ./cmd/berth` builds the front alone, which then cannot hand over; run
// berth-cli (`go run ./cmd/berth-cli ...`) for that.
package main

import (
	"os"

	"github.com/berth-sh/berth/cli/front"
)

func main() { os.Exit(front.Main(os.Args)) }
