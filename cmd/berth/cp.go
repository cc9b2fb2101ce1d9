package main

import (
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-sh/berth/backends/agent"
	"github.com/berth-sh/berth/registry"
)

func newCpCmd(g *globals) *cobra.Command {
	var session string
	cmd := &cobra.Command{
		Use:   "cp [-s SESSION] SRC :DEST | cp [-s SESSION] :SRC DEST",
		Short: "Copy files and directories into or out of a session's sandbox",
		Long: `Copy a file or a directory tree between this host and a session's sandbox. A leading
colon marks the sandbox side (so session names may contain colons): "SRC :DEST" uploads,
":SRC DEST" downloads. Directories, modes and modification times are kept; symlinks are
copied as symlinks, and extraction never follows a link out of the destination.

DEST names the copy; when it ends in "/" (or, downloading, is an existing directory)
the copy goes inside it under SRC's name. A relative sandbox path is relative to the
sandbox's default directory (local: the sandbox's own directory).`,
		Example: `  berth cp -s chat:1 ./src :/work/src
  berth cp -s chat:1 report.txt :/tmp/
  berth cp -s chat:1 :/work/out ./out`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := args[0], args[1]
			up, down := strings.HasPrefix(dst, ":"), strings.HasPrefix(src, ":")
			switch {
			case up == down:
				return usageError("mark exactly one side as the sandbox's with a leading colon: berth cp SRC :DEST (upload) or berth cp :SRC DEST (download)")
			case up && dst == ":" || down && src == ":":
				return usageError("the sandbox path after the colon is empty")
			}
			if up {
				return upload(cmd, g, session, src, dst[1:])
			}
			return download(cmd, g, session, src[1:], dst)
		},
	}
	cmd.Flags().StringVarP(&session, "session", "s", defaultSession(), "session name ($BERTH_SESSION sets the default)")
	return cmd
}

// upload copies the host path src to dst in the sandbox.
func upload(cmd *cobra.Command, g *globals, session, src, dst string) error {
	if _, err := os.Lstat(src); err != nil {
		return usageError("source %s: %v", src, err)
	}
	dir, name := path.Dir(dst), path.Base(dst)
	if strings.HasSuffix(dst, "/") {
		dir, name = dst, filepath.Base(filepath.Clean(src))
	}
	return g.withRegistry(cmd.Context(), func(reg *registry.Registry) error {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(agent.WriteTar(pw, src, name)) }()
		err := reg.CopyIn(cmd.Context(), session, dir, pr)
		pr.CloseWithError(io.ErrClosedPipe)
		return err
	})
}

// download copies src in the sandbox to the host path dst.
func download(cmd *cobra.Command, g *globals, session, src, dst string) error {
	srcBase := path.Base(path.Clean(src))
	dir, rename := dst, (func(string) string)(nil)
	if fi, err := os.Stat(dst); !strings.HasSuffix(dst, "/") && (err != nil || !fi.IsDir()) {
		dir = filepath.Dir(dst)
		newBase := filepath.Base(dst)
		rename = func(n string) string {
			if n == srcBase {
				return newBase
			}
			if rest, ok := strings.CutPrefix(n, srcBase+"/"); ok {
				return newBase + "/" + rest
			}
			return n
		}
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return usageError("destination directory %s does not exist; create it first", dir)
	}
	return g.withRegistry(cmd.Context(), func(reg *registry.Registry) error {
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			err := agent.ExtractTar(pr, dir, rename)
			if err == nil {
				io.Copy(io.Discard, pr) // the tar padding after the end marker
			}
			pr.CloseWithError(err)
			done <- err
		}()
		err := reg.CopyOut(cmd.Context(), session, src, pw)
		pw.CloseWithError(err)
		if xerr := <-done; err == nil && xerr != nil {
			return fmt.Errorf("extracting into %s: %w", dir, xerr)
		}
		return err
	})
}
