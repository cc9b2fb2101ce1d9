package registry

import (
	"context"
	"io"

	"github.com/berth-sh/berth/config"
)

const noCopy = "cannot copy files (its sandboxes run no berth agent)"

// CopyIn extracts the tar stream rd into the directory dir of session's sandbox
// (creating the sandbox when needed), through its agent: entries and links are never
// followed out of dir, modes and mtimes are kept, symlinks stay symlinks. A relative
// dir is relative to the sandbox's default directory (local: the sandbox's own
// directory). Errors: those of Exec; ErrNotFound when dir does not exist; ErrInvalid
// for an entry that would leave dir; ErrUnsupported when the driver runs no agent.
func (r *Registry) CopyIn(ctx context.Context, session, dir string, rd io.Reader) error {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return err
	}
	return r.agentCall(ctx, session, openCreate, noCopy, func(c *sessionConn) error {
		return c.callErr("copying into "+dir, c.client.CopyIn(ctx, dir, rd))
	})
}

// CopyOut writes the file or directory path of session's sandbox to w as a tar stream
// whose entries are named from path's base name (links stored, never followed); a
// stopped sandbox is started. The stream comes from the sandbox, whose root can
// replace berth's agent: extract it as hostile (agent.ExtractTar does). Errors:
// ErrNotFound when the session has no sandbox or path does not exist; those of Exec;
// ErrUnsupported when the driver runs no agent.
func (r *Registry) CopyOut(ctx context.Context, session, path string, w io.Writer) error {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return err
	}
	return r.agentCall(ctx, session, openExisting, noCopy, func(c *sessionConn) error {
		return c.callErr("copying "+path+" out", c.client.CopyOut(ctx, path, w))
	})
}
