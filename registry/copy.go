package registry

import (
	"context"
	"fmt"
	"io"

	"github.com/berth-sh/berth/backend"
)

// copier returns session's sandbox and its driver's Copier. create says whether a
// session without a sandbox gets one (uploads) or is ErrNotFound (downloads).
func (r *Registry) copier(ctx context.Context, session string, create bool) (*Lease, backend.Copier, error) {
	if !create {
		if err := r.haveSandbox(session, " to copy from"); err != nil {
			return nil, nil, err
		}
	}
	lease, err := r.Acquire(ctx, session)
	if err != nil {
		return nil, nil, err
	}
	c, ok := lease.Backend.(backend.Copier)
	caps, cerr := r.capabilities(ctx, lease.Backend)
	if !ok || cerr == nil && !caps.Copy {
		return nil, nil, backend.Errorf(backend.ErrUnsupported, "session %q: driver %s cannot copy files (Capabilities.Copy)", session, lease.Driver)
	}
	return lease, c, nil
}

// CopyIn extracts the tar stream rd into the directory dir of session's sandbox
// (creating the sandbox when needed), through the driver's Copier: entries and links
// are never followed out of dir, modes and mtimes are kept, symlinks stay symlinks. A
// relative dir is relative to the sandbox's default directory (local: the sandbox's
// own directory). Errors: those of Acquire; ErrNotFound when dir does not exist;
// ErrInvalid for an entry that would leave dir; ErrUnsupported when the driver cannot
// copy.
func (r *Registry) CopyIn(ctx context.Context, session, dir string, rd io.Reader) error {
	lease, c, err := r.copier(ctx, session, true)
	if err != nil {
		return err
	}
	if err := c.CopyIn(ctx, lease.Sandbox, dir, rd); err != nil {
		return fmt.Errorf("session %q: copying into %s in sandbox %s: %w", session, dir, lease.Sandbox, err)
	}
	return nil
}

// CopyOut writes the file or directory path of session's sandbox to w as a tar stream
// whose entries are named from path's base name (links stored, never followed).
// Errors: ErrNotFound when the session has no sandbox or path does not exist; those
// of Acquire; ErrUnsupported when the driver cannot copy.
func (r *Registry) CopyOut(ctx context.Context, session, path string, w io.Writer) error {
	lease, c, err := r.copier(ctx, session, false)
	if err != nil {
		return err
	}
	if err := c.CopyOut(ctx, lease.Sandbox, path, w); err != nil {
		return fmt.Errorf("session %q: copying %s out of sandbox %s: %w", session, path, lease.Sandbox, err)
	}
	return nil
}
