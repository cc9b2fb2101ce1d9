package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/internal/imagearchive"
	"github.com/spf13/cobra"
)

// agentImageRepo is the repository of the agent image's default reference; its tag is
// the first 12 hex digits of the binary's SHA-256, so that another berth never reuses
// an image of an older agent (Pods use it with imagePullPolicy Never or IfNotPresent).
const agentImageRepo = "localhost/berth-agent"

func newImageAgentCmd(g *globals) *cobra.Command {
	var out, ref string
	c := &cobra.Command{
		Use:   "agent -o FILE",
		Short: "Write an image holding this berth as the agent (a docker save archive), for Kubernetes",
		Long: `Write a container image that holds this berth executable as /berth-agent, as a
'docker save' archive (which docker load, ctr images import and kind load
image-archive accept), and print its reference. The kubernetes driver runs it as an
init container: its entrypoint, "/berth-agent install DIR", copies the binary into
an emptyDir volume mounted at DIR, which the sandbox container mounts read-only and
starts as its first process. berth must be linked statically (CGO_ENABLED=0).

The reference defaults to ` + agentImageRepo + `:HASH, HASH being the first 12 hex
digits of the binary's SHA-256. To publish it, load the archive and push it under
your registry's name (see docs/kubernetes.md).`,
		Example: `  berth image agent -o agent.tar
  ctr -n k8s.io images import agent.tar
  berth image agent -o - --ref registry.example.com/berth-agent:1 | docker load`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return execrun.Usage("berth image agent: say where to write the archive with -o FILE (- for stdout)")
			}
			exe, err := g.self()
			if err != nil {
				return execrun.Failure(err)
			}
			static, err := agent.IsStatic(exe)
			if err != nil {
				return execrun.Failure(err)
			}
			if !static {
				return execrun.Usage("%s is dynamically linked and cannot run in a container's own filesystem; build a static berth with `CGO_ENABLED=0 go build -o DIR/ ./cmd/...` and run DIR/berth image agent", exe)
			}
			bin, err := os.ReadFile(exe)
			if err != nil {
				return execrun.Failure(err)
			}
			if ref == "" {
				sum := sha256.Sum256(bin)
				ref = agentImageRepo + ":" + hex.EncodeToString(sum[:])[:12]
			}
			a, err := agentImage(ref, bin)
			if err != nil {
				return execrun.Usage("berth image agent --ref %s: %v", ref, err)
			}
			if out == "-" {
				if _, err := cmd.OutOrStdout().Write(a); err != nil {
					return execrun.Failure(err)
				}
				fmt.Fprintln(cmd.ErrOrStderr(), ref)
				return nil
			}
			tmp := out + ".tmp"
			if err := os.WriteFile(tmp, a, 0o644); err != nil {
				return execrun.Failure(fmt.Errorf("writing the agent image: %w", err))
			}
			if err := os.Rename(tmp, out); err != nil {
				os.Remove(tmp)
				return execrun.Failure(fmt.Errorf("writing the agent image: %w", err))
			}
			fmt.Fprintln(cmd.OutOrStdout(), ref)
			return nil
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "file to write the archive to (- for stdout)")
	c.Flags().StringVar(&ref, "ref", "", "the image's reference, NAME:TAG (default "+agentImageRepo+":HASH)")
	return c
}

// agentImage returns the docker save archive of the agent image tagged ref: one layer
// with bin at /berth-agent and /tmp, entrypoint "/berth-agent install".
func agentImage(ref string, bin []byte) ([]byte, error) {
	layer, err := imagearchive.Layer([]imagearchive.Entry{
		{Name: backend.AgentBinaryName, Mode: 0o755, Data: bin},
		{Name: "tmp", Mode: 0o1777, Dir: true},
	})
	if err != nil {
		return nil, err
	}
	return imagearchive.Archive(ref, layer, imagearchive.Config{
		Entrypoint: []string{"/" + backend.AgentBinaryName, "install"},
		Cmd:        []string{"/berth"},
		CreatedBy:  "berth image agent",
	})
}
