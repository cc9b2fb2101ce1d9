package agent

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"time"
)

// ErrTarTooLarge is wrapped by CheckTar's error when the stream's files together
// exceed its limit.
var ErrTarTooLarge = errors.New("the copy is larger than its limit")

// CheckTar copies the tar stream r, which comes from a client of berth serve and is
// treated as hostile, to w as a tar stream of the same entries, refusing what berth
// cp would never send: it keeps only directories, regular files stored in full and
// symlinks (symlinks are kept as they are: on upload they name files of the
// sandbox, which the client may reach anyway); hard links, devices, FIFOs, sparse
// files and every other type are refused, and so are names that leave the
// destination (absolute names are made relative, as tar -x does) and a regular file
// that takes the files' total past limit bytes (limit < 0: no bound; 0:
// DefaultMaxCopyBytes), before any of its data is copied (the error then wraps
// ErrTarTooLarge). Entries are written with only their name, type, mode (setuid,
// setgid and sticky included), owner numbers, mtime, link target and size; other
// header fields (PAX records, user and group names) are dropped. Errors name the
// entry and say why; w then holds a partial stream that the caller must discard.
// It returns the number of entries and of file bytes copied; a directory entry
// named "." (the destination itself) is neither copied nor counted, and a file or
// link of that name is refused.
//
// The agent's CopyIn extracts what it reads at once (the host's stream is trusted),
// so berth serve checks a whole upload with CheckTar before the agent sees any of
// it: a refused entry, wherever it is in the stream, leaves the sandbox unchanged.
func CheckTar(r io.Reader, w io.Writer, limit int64) (entries int, size int64, err error) {
	if limit == 0 {
		limit = DefaultMaxCopyBytes
	}
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return entries, size, fmt.Errorf("reading the tar stream after %d entries: %v", entries, err)
		}
		out, err := checkEntry(hdr, limit, size)
		if err != nil {
			return entries, size, fmt.Errorf("%s: %w", shown(hdr.Name), err)
		}
		if out == nil {
			continue // the destination itself: nothing to write or count
		}
		if err := tw.WriteHeader(out); err != nil {
			return entries, size, fmt.Errorf("%s: %v", shown(hdr.Name), err)
		}
		if out.Typeflag == tar.TypeReg {
			n, err := io.Copy(tw, tr)
			size += n
			if err != nil {
				return entries, size, fmt.Errorf("%s: reading its data: %v", shown(hdr.Name), err)
			}
		}
		entries++
	}
	return entries, size, tw.Close()
}

// checkEntry checks one header of CheckTar's stream, given the files' bytes so far,
// and returns the header to write, or nil for a directory entry named "." (the
// destination directory itself, whose attributes an upload never changes: it is
// dropped, so that the count is of what is written).
func checkEntry(hdr *tar.Header, limit, size int64) (*tar.Header, error) {
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink:
		if sparse(hdr) {
			return nil, fmt.Errorf("refused: %s", refusedType(hdr))
		}
	default:
		return nil, fmt.Errorf("refused: %s", refusedType(hdr))
	}
	name, err := cleanName(hdr.Name)
	if err != nil {
		return nil, err
	}
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return nil, errors.New(dotNotDir)
		}
		return nil, nil
	}
	if hdr.Typeflag == tar.TypeSymlink && hdr.Linkname == "" {
		return nil, fmt.Errorf("refused: a symlink with an empty target")
	}
	if hdr.Typeflag == tar.TypeReg && limit > 0 && hdr.Size > limit-size {
		return nil, fmt.Errorf("refused: %d bytes, which would take the copy past its limit of %d bytes (%s; %d bytes before this file): %w", hdr.Size, limit, formatSize(limit), size, ErrTarTooLarge)
	}
	out := &tar.Header{
		Typeflag: hdr.Typeflag, Name: name, Mode: hdr.Mode & 0o7777, Uid: hdr.Uid, Gid: hdr.Gid,
		ModTime: hdr.ModTime.Truncate(time.Second), Linkname: hdr.Linkname, // whole seconds, cut (WriteTar)
	}
	if hdr.Typeflag == tar.TypeReg {
		out.Size = hdr.Size
	}
	if hdr.Typeflag == tar.TypeDir {
		out.Name += "/"
	}
	return out, nil
}
