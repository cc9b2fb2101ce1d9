package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/registry"
)

func newCpCmd(g *globals) *cobra.Command {
	var session, maxSize string
	var archive bool
	cmd := &cobra.Command{
		Use:   "cp [-s SESSION] [-a] SRC :DEST | cp [-s SESSION] [-a] :SRC DEST",
		Short: "Copy files and directories into or out of a session's sandbox",
		Long: `Copy a file or a directory tree between this host and a session's sandbox. A leading
colon marks the sandbox side (so session names may contain colons): "SRC :DEST" uploads,
":SRC DEST" downloads. Directories, modes (setuid, setgid and sticky bits included, but
see below for downloads) and modification times are kept; symlinks are copied as
symlinks, and extraction never follows a link out of the destination. Hard links are not kept: each file is copied in
full.

DEST names the copy; when it ends in "/" (or, downloading, is an existing directory)
the copy goes inside it under SRC's name. A file or symlink in DEST's way is
replaced; a directory in the way of a file or symlink is not (the copy fails, as cp's
"cannot overwrite directory with non-directory"): end DEST with "/" to copy into it. A relative sandbox path is relative to the
sandbox's default directory (local: the sandbox's own directory).

A download trusts nothing the sandbox sends (its root can replace berth's agent): it
keeps only regular files, directories and symlinks whose target is relative and stays
inside the copy, under the path asked for. A hard link, device, FIFO, sparse file,
absolute symlink or symlink out of the copy fails the download with an error naming the entry, and the
destination is left as it was: the copy is made in a private directory beside it and
moved into place only when all of it arrived. Downloaded files belong to the user who
runs berth cp, and setuid and setgid bits are dropped (a safety choice: a sandbox must
not hand the host a setuid program); the sticky bit is kept. --archive keeps the owners
the sandbox names (uid and gid as numbers; only root can set other users' ones) and the
setuid and setgid bits. Uploads keep owners as numbers where the agent runs as root (in
containers), with or without --archive.

A download writes at most --max-size (default 1g) of file data: the file that would
take it past the limit fails the download, naming the limit, and nothing is written.
Raise it for larger copies, or say unlimited. Runs of zeros are written as holes both
ways, so a sparse file stays sparse (a sparse file counts at its full size).`,
		Example: `  berth cp -s chat:1 ./src :/work/src
  berth cp -s chat:1 report.txt :/tmp/
  berth cp -s chat:1 :/work/out ./out
  sudo berth cp -a -s chat:1 :/work/rootfs ./rootfs   # keep owners and setuid bits`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := args[0], args[1]
			up, down := strings.HasPrefix(dst, ":"), strings.HasPrefix(src, ":")
			switch {
			case up == down:
				return execrun.Usage("mark exactly one side as the sandbox's with a leading colon: berth cp SRC :DEST (upload) or berth cp :SRC DEST (download)")
			case up && dst == ":" || down && src == ":":
				return execrun.Usage("the sandbox path after the colon is empty")
			}
			limit, err := parseMaxSize(maxSize)
			if err != nil && !up {
				return execrun.Usage("--max-size: %v", err)
			}
			// Through a running berth serve when one answers (daemon.go); the download
			// is still extracted here, as the user who runs berth cp.
			d, err := g.daemon(cmd.Context())
			if err != nil {
				return execrun.Failure(err)
			}
			switch {
			case d != nil && up:
				return copyDaemon(cmd.Context(), d, session, src, dst[1:], true, false, 0)
			case d != nil:
				return copyDaemon(cmd.Context(), d, session, src[1:], dst, false, archive, limit)
			case up:
				return upload(cmd, g, session, src, dst[1:])
			}
			return download(cmd, g, session, src[1:], dst, archive, limit)
		},
	}
	sessionFlag(cmd.Flags(), &session)
	cmd.Flags().StringVar(&maxSize, "max-size", "1g", "downloads: the most file data one copy may write (a size such as 512m or 4g, or unlimited)")
	cmd.Flags().BoolVarP(&archive, "archive", "a", false, "downloads: keep the owners (uid/gid) and setuid/setgid bits the sandbox names, instead of giving every file to you and dropping setuid/setgid")
	return cmd
}

// upload copies the host path src to dst in the sandbox.
func upload(cmd *cobra.Command, g *globals, session, src, dst string) error {
	dir, name, err := uploadTarget(src, dst)
	if err != nil {
		return err
	}
	return g.withRegistry(cmd.Context(), func(reg *registry.Registry) error {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(agent.WriteTar(pw, src, name)) }()
		err := reg.CopyIn(cmd.Context(), session, dir, pr)
		pr.CloseWithError(io.ErrClosedPipe)
		return err
	})
}

// uploadTarget checks the host path src of an upload to the sandbox path dst and
// returns the sandbox directory to extract into and the name the copy gets there.
func uploadTarget(src, dst string) (dir, name string, err error) {
	if _, err := os.Lstat(src); err != nil {
		return "", "", execrun.Usage("source %s: %v", src, err)
	}
	dir, name = path.Dir(dst), path.Base(dst)
	if strings.HasSuffix(dst, "/") {
		dir, name = dst, filepath.Base(filepath.Clean(src))
	}
	return dir, name, nil
}

// parseMaxSize reads cp's --max-size: a size (config.ParseBytes) or "unlimited"
// (-1, agent.ExtractOptions.MaxBytes's no bound).
func parseMaxSize(s string) (int64, error) {
	if strings.EqualFold(strings.TrimSpace(s), "unlimited") {
		return -1, nil
	}
	return config.ParseBytes(s)
}

// download copies src in the sandbox to the host path dst (see agent.ExtractTar:
// the stream is hostile). archive keeps owners and setuid/setgid bits; limit is the
// most file data it writes (agent.ExtractOptions.MaxBytes).
func download(cmd *cobra.Command, g *globals, session, src, dst string, archive bool, limit int64) error {
	dir, opts, err := downloadTarget(src, dst, archive, limit)
	if err != nil {
		return err
	}
	return g.withRegistry(cmd.Context(), func(reg *registry.Registry) error {
		return extractCopy(dir, opts, func(w io.Writer) error { return reg.CopyOut(cmd.Context(), session, src, w) })
	})
}

// downloadTarget checks the host destination dst of a download of the sandbox path
// src and returns the existing host directory to extract into and how (archive and
// limit as download takes them).
func downloadTarget(src, dst string, archive bool, limit int64) (string, agent.ExtractOptions, error) {
	opts := agent.ExtractOptions{Top: path.Base(path.Clean(src)), Archive: archive, MaxBytes: limit}
	switch opts.Top {
	case "/":
		opts.Top = "." // the sandbox's whole filesystem
	case ".", "..":
		opts.Top = "" // named by the sandbox: its first entry
	}
	dir := dst
	if fi, err := os.Stat(dst); !strings.HasSuffix(dst, "/") && (err != nil || !fi.IsDir()) {
		dir, opts.Name = filepath.Dir(dst), filepath.Base(dst)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", opts, execrun.Usage("destination directory %s does not exist; create it first", dir)
	}
	return dir, opts, nil
}

// extractCopy extracts into dir, with opts (agent.ExtractTar: the stream is
// hostile), the tar stream that copy writes, and returns copy's error or the
// extraction's, whichever explains the failure.
func extractCopy(dir string, opts agent.ExtractOptions, copy func(w io.Writer) error) error {
	pr, pw := io.Pipe()
	stream := &errRecorder{r: pr}
	done := make(chan error, 1)
	go func() {
		// ExtractTar reads pr to its end, which carries the copy's outcome.
		err := agent.ExtractTar(stream, dir, opts)
		pr.CloseWithError(err)
		done <- err
	}()
	err := copy(pw)
	pw.CloseWithError(err)
	xerr := <-done
	var xe *agent.ExtractError
	switch {
	case xerr != nil && stream.err == nil:
		// The extraction refused what it got: the copy's own error (if any) is
		// only the broken pipe that followed.
		return fmt.Errorf("extracting into %s: %w", dir, xerr)
	case err != nil && errors.As(xerr, &xe):
		return fmt.Errorf("%w; %s", err, xe.Outcome())
	}
	return err
}

// errRecorder is a reader that records its first error other than io.EOF, so that a
// download can tell a refused stream from a failed copy.
type errRecorder struct {
	r   io.Reader
	err error
}

func (e *errRecorder) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}
