package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/registry"
	"github.com/spf13/cobra"
)

func newImageCmd(g *globals) *cobra.Command {
	img := group(&cobra.Command{Use: "image", Short: "Manage the images of drivers with their own filesystem"})
	var driver string
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Load an image archive (docker save or OCI layout tar; - for stdin) into a driver",
		Long: `Load an image archive into a driver's image store, as 'docker load' does, and print
the references it holds, one a line. FILE "-" reads the archive from stdin.`,
		Example: `  berth image import busybox.tar
  docker save alpine:3 | berth image import --driver docker -
  berth image import --driver containerd busybox.tar`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r io.Reader = os.Stdin
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return execrun.Usage("image archive %s: %v", args[0], err)
				}
				defer f.Close()
				r = f
			}
			return g.withRegistry(cmd.Context(), func(reg *registry.Registry) error {
				imp, err := imageDriver[backend.ImageImporter](cmd.Context(), reg, driver, "import", func(c backend.Capabilities) bool { return c.ImageImport })
				if err != nil {
					return err
				}
				refs, err := imp.ImportImage(cmd.Context(), r)
				if err != nil {
					return fmt.Errorf("importing %s into driver %s: %w", args[0], driver, err)
				}
				for _, ref := range refs {
					fmt.Fprintln(cmd.OutOrStdout(), ref)
				}
				return nil
			})
		},
	}
	imp.Flags().StringVar(&driver, "driver", "docker", "driver whose image store receives the image")
	img.AddCommand(imp, newImagePullCmd(g), newImageAgentCmd(g))
	return img
}

// imageDriver returns driver as I (backend.ImagePuller or ImageImporter) when it
// implements it and its capabilities say so (has), else an error that says the
// driver cannot verb images.
func imageDriver[I any](ctx context.Context, reg *registry.Registry, driver, verb string, has func(backend.Capabilities) bool) (I, error) {
	var none I
	b, err := reg.Backend(ctx, driver)
	if err != nil {
		return none, err
	}
	info, err := backend.InfoOf(ctx, b)
	if err != nil {
		return none, err
	}
	d, ok := b.(I)
	if !ok || !has(info.Capabilities) {
		return none, fmt.Errorf("driver %s cannot %s images (it has no image store); choose one with --driver, e.g. docker or containerd", driver, verb)
	}
	return d, nil
}
