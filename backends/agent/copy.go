package agent

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/agent/agentpb"
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
// through an os.Root, so no entry and no link is followed out of it.
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
	root, err := os.OpenRoot(target)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return backend.Errorf(backend.ErrNotFound, "directory %q does not exist", target)
		}
		return backend.Errorf(backend.ErrInvalid, "directory %q: %v", target, err)
	}
	defer root.Close()
	r := &copyInReader{stream: stream}
	if err := extractAll(root, r, nil); err != nil {
		return backend.Errorf(backend.ErrInvalid, "%v", err)
	}
	// Swallow the tar padding and wait for the client's end of stream.
	if _, err := io.Copy(io.Discard, r); err != nil && err != io.EOF {
		return err
	}
	return stream.SendAndClose(&agentpb.CopyInResponse{})
}

// ExtractTar extracts the tar stream r into the existing directory dir, as the
// agent's CopyIn does: through an os.Root, so no entry and no link (planted in dir
// before or by the stream itself) is followed out of dir; entries that would leave it
// are refused; modes, mtimes and (as root) owners are kept; symlinks are created as
// symlinks; devices and FIFOs are skipped. rename, when set, maps each cleaned entry
// name (slash-separated, relative) to the name to create. Errors name the entry.
func ExtractTar(r io.Reader, dir string, rename func(string) string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	return extractAll(root, r, rename)
}

// extractAll extracts every entry of the tar stream r under root. Directories get
// their modification times at the end, deepest first: creating their entries would
// change them.
func extractAll(root *os.Root, r io.Reader, rename func(string) string) error {
	tr := tar.NewReader(r)
	type dirTime struct {
		name string
		t    time.Time
	}
	var dirs []dirTime
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			for i := len(dirs) - 1; i >= 0; i-- {
				root.Chtimes(dirs[i].name, dirs[i].t, dirs[i].t)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading tar stream: %v", err)
		}
		if rename != nil {
			n, err := cleanName(hdr.Name)
			if err != nil {
				return fmt.Errorf("%s: %v", hdr.Name, err)
			}
			hdr.Name = rename(n)
		}
		if err := extractEntry(root, tr, hdr); err != nil {
			return fmt.Errorf("%s: %v", hdr.Name, err)
		}
		if n, err := cleanName(hdr.Name); err == nil && hdr.Typeflag == tar.TypeDir && !hdr.ModTime.IsZero() {
			dirs = append(dirs, dirTime{n, hdr.ModTime})
		}
	}
}

// cleanName makes a tar entry name relative and refuses one that leaves the root.
func cleanName(name string) (string, error) {
	n := path.Clean(strings.TrimLeft(name, "/"))
	if n != "." && !filepath.IsLocal(n) {
		return "", fmt.Errorf("name leaves the destination")
	}
	return n, nil
}

func extractEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	mode := fs.FileMode(hdr.Mode).Perm() | fs.FileMode(hdr.Mode)&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
	if d := path.Dir(name); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// Replace whatever non-directory is in the way; never write through a link.
	removeOld := func() error {
		fi, err := root.Lstat(name)
		if err != nil {
			return nil
		}
		if fi.IsDir() && hdr.Typeflag == tar.TypeDir {
			return nil
		}
		if fi.IsDir() {
			return root.RemoveAll(name)
		}
		return root.Remove(name)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if name == "." {
			return nil
		}
		if err := removeOld(); err != nil {
			return err
		}
		if err := root.MkdirAll(name, 0o755); err != nil {
			return err
		}
	case tar.TypeReg:
		if err := removeOld(); err != nil {
			return err
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := removeOld(); err != nil {
			return err
		}
		return root.Symlink(hdr.Linkname, name)
	case tar.TypeLink:
		old, err := cleanName(hdr.Linkname)
		if err != nil {
			return err
		}
		if err := removeOld(); err != nil {
			return err
		}
		return root.Link(old, name)
	default:
		// Devices, FIFOs and the like are not created.
		return nil
	}
	if os.Geteuid() == 0 {
		root.Lchown(name, hdr.Uid, hdr.Gid)
	}
	if err := root.Chmod(name, mode); err != nil {
		return err
	}
	if !hdr.ModTime.IsZero() {
		root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	}
	return nil
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
		return backend.Errorf(backend.ErrInvalid, "%v", err)
	}
	err := WriteTar(copyOutWriter{stream}, p, "")
	if err != nil {
		return fmt.Errorf("copy out %q: %w", p, err)
	}
	return nil
}

// WriteTar writes the file or directory at path to w as a tar stream, as the agent's
// CopyOut does: the top entry is named name (path's base name when empty), the others
// name/REL; symlinks are stored as symlinks and never followed; sockets are skipped.
func WriteTar(w io.Writer, path, name string) error {
	path = filepath.Clean(path)
	if name == "" {
		name = filepath.Base(path)
	}
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(path, func(fp string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(path, fp)
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(fp); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return nil // a socket or the like: skip
		}
		hdr.Name = filepath.ToSlash(filepath.Join(name, rel))
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.OpenFile(fp, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, hdr.Size)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
