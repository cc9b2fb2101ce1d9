package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/internal/apiclient"
	"github.com/berth-sh/berth/server/apiv1"
)

// The client side of berth cp through a running berth serve (the files routes of
// docs/api.md), on daemonClient. A download is extracted here, on the client, as
// the user who runs berth cp, with berth cp's rules (agent.ExtractTar): the daemon
// may run as another user, and the stream it passes on comes from the sandbox.

// sessionURL returns the URL of session's route tail ("archive", "tty") with the
// query q: the name is one percent-encoded path segment.
func (d *daemonClient) sessionURL(session, tail string, q url.Values) string {
	u := strings.TrimSuffix(d.Base, "/") + apiclient.SessionPath(session, tail)
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// upload copies the host path src to dst in session's sandbox through the daemon
// (PUT /archive), streaming the tar as it is written: berth cp SRC :DST.
func (d *daemonClient) upload(ctx context.Context, session, src, dst string) error {
	dir, name, err := uploadTarget(src, dst)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(agent.WriteTar(pw, src, name)) }()
	defer pr.CloseWithError(io.ErrClosedPipe)
	// No max_size: berth cp's uploads have no bound, as embedded ones.
	q := url.Values{"path": {dir}, "max_size": {"unlimited"}}
	resp, err := d.Request(ctx, http.MethodPut, apiclient.SessionPath(session, "archive")+"?"+q.Encode(), pr, apiv1.TarType, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return nil
}

// download copies src in session's sandbox to the host path dst through the daemon
// (GET /archive), extracting here with download's rules (archive, limit).
func (d *daemonClient) download(ctx context.Context, session, src, dst string, archive bool, limit int64) error {
	dir, opts, err := downloadTarget(src, dst, archive, limit)
	if err != nil {
		return err
	}
	return extractCopy(dir, opts, func(w io.Writer) error {
		resp, err := d.Request(ctx, http.MethodGet, apiclient.SessionPath(session, "archive")+"?"+url.Values{"path": {src}}.Encode(), nil, "", "")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(w, resp.Body); err != nil {
			return fmt.Errorf("session %s: copying %s out: the stream from berth serve broke off (%v); its log says why", session, src, err)
		}
		return nil
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
