package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/berth-sh/berth/agent/internal/agentpb"
	"github.com/berth-sh/berth/backend"
)

// copyInReader turns the data messages of a CopyIn stream into an io.Reader.
type copyInReader struct {
	stream agentpb.Agent_CopyInServer
	buf    []byte
}

func (r *copyInReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		m, err := r.stream.Recv()
		if err != nil {
			return 0, err
		}
		r.buf = m.GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// CopyIn implements the CopyIn RPC: extract a tar stream into an existing directory
// through an os.Root, so no entry and no link is followed out of it (extractAll).
func (s *server) CopyIn(stream agentpb.Agent_CopyInServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	dir, ok := first.Msg.(*agentpb.CopyInRequest_Dir)
	if !ok || dir.Dir == "" {
		return backend.Errorf(backend.ErrInvalid, "copy in: the first message must name the directory")
	}
	target := dir.Dir
	if !filepath.IsAbs(target) {
		target = filepath.Join(s.cwd, target)
	}
	s.copyGate.enter()
	defer s.copyGate.leave()
	real, err := filepath.EvalSymlinks(target)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return backend.Errorf(backend.ErrNotFound, "directory %q does not exist", target)
		}
		return backend.Errorf(backend.ErrInvalid, "directory %q: %w", target, err)
	}
	var reserved []string
	for _, d := range s.reserved {
		switch {
		case real == d:
			return backend.Errorf(backend.ErrInvalid, "%q is berth's agent's own directory (its socket, state or binary), which a copy never writes; copy somewhere else", target)
		case inside(real, d):
			return backend.Errorf(backend.ErrInvalid, "%q lies in %s, berth's agent's own directory (its socket, state or binary), which a copy never writes; copy somewhere else", target, d)
		case inside(d, real):
			rel, _ := filepath.Rel(real, d) // both clean and absolute: never an error
			reserved = append(reserved, rel)
		}
	}
	root, err := os.OpenRoot(real)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return backend.Errorf(backend.ErrNotFound, "directory %q does not exist", target)
		}
		return backend.Errorf(backend.ErrInvalid, "directory %q: %w", target, err)
	}
	defer root.Close()
	r := &copyInReader{stream: stream}
	if err := extractAll(root, r, reserved...); err != nil {
		return backend.Errorf(backend.ErrInvalid, "%w", err)
	}
	// Swallow the tar padding and wait for the client's end of stream.
	if _, err := io.Copy(io.Discard, r); err != nil && err != io.EOF {
		return err
	}
	return stream.SendAndClose(&agentpb.CopyInResponse{})
}

// inside reports whether the clean absolute path p lies inside the directory dir
// (not dir itself).
func inside(p, dir string) bool {
	return dir == "/" && p != "/" || strings.HasPrefix(p, dir+"/")
}

// reservedDirs are the directories of an agent that no copy may write (CopyIn): its
// socket dir, its state dir, the directory of its binary when it runs as
// backend.AgentBinaryName (where its token lies), and backend's /.berth when one of
// them is under it (a container's layout). Paths are resolved through their links
// (one that does not exist yet, as a state dir made on first use, is taken as it is).
func reservedDirs(opts ServeOptions) []string {
	dirs := []string{opts.SocketDir, opts.StateDir}
	if self, err := os.Executable(); err == nil && filepath.Base(self) == backend.AgentBinaryName {
		dirs = append(dirs, filepath.Dir(self))
	}
	var out []string
	for _, d := range dirs {
		if d == "" {
			continue
		}
		real, err := filepath.EvalSymlinks(d)
		if err != nil {
			if real, err = filepath.Abs(d); err != nil {
				continue
			}
		}
		out = append(out, real)
		if inside(real, backend.AgentRoot) && !slices.Contains(out, backend.AgentRoot) {
			out = append(out, backend.AgentRoot)
		}
	}
	return out
}

// copyOutWriter sends tar bytes as CopyOut chunks.
type copyOutWriter struct {
	stream agentpb.Agent_CopyOutServer
}

func (w copyOutWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += ChunkSize {
		end := min(off+ChunkSize, len(p))
		c := make([]byte, end-off)
		copy(c, p[off:end])
		if err := w.stream.Send(&agentpb.CopyOutChunk{Data: c}); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// CopyOut implements the CopyOut RPC: the file or directory at the path as a tar
// stream whose entries are named from the path's base name. Links are stored as
// links, never followed.
func (s *server) CopyOut(req *agentpb.CopyOutRequest, stream agentpb.Agent_CopyOutServer) error {
	p := req.Path
	if p == "" {
		return backend.Errorf(backend.ErrInvalid, "empty path")
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.cwd, p)
	}
	p = filepath.Clean(p)
	s.copyGate.enter()
	defer s.copyGate.leave()
	if _, err := os.Lstat(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return backend.Errorf(backend.ErrNotFound, "%q does not exist", p)
		}
		return backend.Errorf(backend.ErrInvalid, "%w", err)
	}
	err := WriteTar(copyOutWriter{stream}, p, "")
	if err != nil {
		return fmt.Errorf("copy out %q: %w", p, err)
	}
	return nil
}
