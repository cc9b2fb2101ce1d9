// Command testimage writes the images that scripts/kubernetes.sh imports into its
// cluster's containerd, as `docker save` archives (internal/imagearchive): berth's
// busybox test image (testimage.Ref, from the host's static busybox) and, given a
// static pause binary (scripts/k8s/pause.c), the Pod sandbox image PauseRef.
//
//	testimage -o test.tar [-pause PAUSE-BINARY -pause-o pause.tar]
//
// It prints each archive's path and image reference, one pair a line.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/internal/imagearchive"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
)

// PauseRef is the pause image the cluster's containerd is configured with
// (sandbox_image); the kubelet 1.37 and containerd 1.6 default to this version.
const PauseRef = "registry.k8s.io/pause:3.10"

func main() {
	out := flag.String("o", "", "where to write the test image archive")
	pause := flag.String("pause", "", "a statically linked pause binary to make the pause image of")
	pauseOut := flag.String("pause-o", "", "where to write the pause image archive (with -pause)")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 || (*pause == "") != (*pauseOut == "") {
		fmt.Fprintln(os.Stderr, "usage: testimage -o test.tar [-pause PAUSE-BINARY -pause-o pause.tar]")
		os.Exit(2)
	}
	if err := run(*out, *pause, *pauseOut); err != nil {
		fmt.Fprintln(os.Stderr, "testimage:", err)
		os.Exit(1)
	}
}

func run(out, pause, pauseOut string) error {
	a, err := testimage.Archive()
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, a, 0o644); err != nil {
		return err
	}
	fmt.Println(out, testimage.Ref)
	if pause == "" {
		return nil
	}
	a, err = pauseArchive(pause)
	if err != nil {
		return err
	}
	if err := os.WriteFile(pauseOut, a, 0o644); err != nil {
		return err
	}
	fmt.Println(pauseOut, PauseRef)
	return nil
}

// pauseArchive returns the pause image: /pause (the binary at bin, which must be
// static: the image has no libc) as its entrypoint.
func pauseArchive(bin string) ([]byte, error) {
	static, err := agent.IsStatic(bin)
	if err != nil {
		return nil, fmt.Errorf("pause binary: %w", err)
	}
	if !static {
		return nil, fmt.Errorf("pause binary %s is dynamically linked; build it with gcc -static", bin)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	layer, err := imagearchive.Layer([]imagearchive.Entry{{Name: "pause", Mode: 0o755, Data: data}})
	if err != nil {
		return nil, err
	}
	return imagearchive.Archive(PauseRef, layer, imagearchive.Config{
		Entrypoint: []string{"/pause"},
		CreatedBy:  "berth scripts/kubernetes.sh: scripts/k8s/pause.c, static",
	})
}
