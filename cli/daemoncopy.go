package cli

import (
	"context"
	"io"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/cli/internal/execrun"
)

// The client side of berth cp through a running berth serve (the files routes of
// docs/api.md), on daemonClient. A download is extracted here, on the client, as
// the user who runs berth cp, with berth cp's rules (agent.ExtractTar): the daemon
// may run as another user, and the stream it passes on comes from the sandbox.

// upload copies the host path src to dst in session's sandbox through the daemon
// (client.CopyIn, PUT /archive), streaming the tar as it is written: berth cp SRC :DST.
func (d *daemonClient) upload(ctx context.Context, session, src, dst string) error {
	dir, name, err := uploadTarget(src, dst)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(agent.WriteTar(pw, src, name)) }()
	defer pr.CloseWithError(io.ErrClosedPipe)
	// No bound (-1): berth cp's uploads have none, as embedded ones.
	return d.CopyIn(ctx, session, dir, pr, -1)
}

// download copies src in session's sandbox to the host path dst through the daemon
// (GET /archive), extracting here with download's rules (archive, limit).
func (d *daemonClient) download(ctx context.Context, session, src, dst string, archive bool, limit int64) error {
	dir, opts, err := downloadTarget(src, dst, archive, limit)
	if err != nil {
		return err
	}
	return extractCopy(dir, opts, func(w io.Writer) error {
		return d.CopyOut(ctx, session, src, w)
	})
}

// copyDaemon is berth cp through the daemon d, once cp's arguments are read (up: an
// upload of the host path src to the sandbox path dst; else a download of the
// sandbox path src to the host path dst with archive and limit): the same copies,
// messages and exit codes (errors are failures, exit 125) as embedded.
func copyDaemon(ctx context.Context, d *daemonClient, session, src, dst string, up, archive bool, limit int64) error {
	if up {
		return execrun.Failure(d.upload(ctx, session, src, dst))
	}
	return execrun.Failure(d.download(ctx, session, src, dst, archive, limit))
}
