package agent

import (
	"archive/tar"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
)

// Tar extraction, both ways.
//
// Upload (the agent's CopyIn, inside the sandbox) trusts the stream: it comes from the
// host. Entries are extracted through an os.Root, so nothing leaves the destination;
// modes (setuid, setgid and sticky included), mtimes and, when the agent runs as root,
// owners are kept; symlinks are created as they are; a hard link may join a regular
// file that the same stream created earlier (berth's own WriteTar never writes one: it
// stores every file in full); devices, FIFOs and other types are skipped. An upload
// that fails (a refused entry, a write through a link that leads out of the
// destination, a broken stream) is undone: what it created is removed and what it
// replaced is put back (extractAll), so it leaves nothing behind, links included.
//
// Download (ExtractTar, on the host) treats the stream as hostile: it comes from a
// sandbox, whose root can replace the agent. See ExtractTar.

// ExtractOptions say how ExtractTar places and checks what it extracts.
type ExtractOptions struct {
	// Top is the name of the one tree the stream must hold (a cleaned relative name,
	// e.g. "out" for a copy of /work/out): every entry must be Top or lie under it.
	// "" takes the first entry's name, which must then be one path component (for a
	// source such as "." whose name only the sandbox knows); "." accepts every name
	// (a copy of a sandbox's whole filesystem, "/").
	Top string
	// Name, when set, is the name that Top gets in the destination directory (a
	// download to a new path); a "." tree is then extracted into the directory Name.
	// It must be one path component.
	Name string
	// Archive keeps the owners the stream names (uid and gid as numbers, set with
	// lchown: that needs root, and an owner that cannot be set is an error) and the
	// setuid and setgid bits. Without it everything belongs to the user who runs the
	// extraction and setuid and setgid are dropped. The sticky bit is always kept.
	Archive bool
	// MaxBytes bounds the size of the copy's regular files together, in bytes: a
	// file that would take the total past it is refused before any of it is written.
	// 0 means DefaultMaxCopyBytes; a negative value means no bound.
	MaxBytes int64
}

// DefaultMaxCopyBytes is ExtractOptions.MaxBytes's default, 1 GiB: the most one
// download writes unless its caller raises it (berth cp --max-size), so that a
// sandbox cannot fill the host's disk with one copy.
const DefaultMaxCopyBytes int64 = 1 << 30

// ExtractTar extracts the tar stream r, which comes from a sandbox and is treated
// as hostile, into the existing directory dir (a download to the host). It accepts
// only regular files, directories and symlinks whose target is relative and stays
// inside the copied tree (no ".." after a name, no more leading ".." than the link
// is deep in the tree; a lone symlink is refused, as its target is outside the
// copy); hard links, devices, FIFOs, sparse files (a few bytes of sparse map could
// expand to gigabytes of zeros) and every other type are refused, and so are
// entries outside opts.Top, names that leave dir, entries under a symlink, and a
// file that takes the copy past opts.MaxBytes. Modes and mtimes are kept; owners and
// setuid/setgid only with opts.Archive. Runs of zeros in files (4 KiB blocks) are
// written as holes, so a sparse file of the sandbox stays sparse on the host.
//
// The stream is extracted into a private directory inside dir (.berth-cp-*) and
// moved into place only after r has ended without error (r is read to its end: the
// caller closes it with the copy's own error), so a refused entry, a broken stream
// or a failed copy leaves dir as it was. Once moved, the copy replaces what is in its
// way as cp does: a directory merges into an existing directory, a file or link
// replaces the file or link of its name (a link is replaced, never followed) and is
// refused where a directory has its name. Errors name the entry and why, and say
// what was written.
func ExtractTar(r io.Reader, dir string, opts ExtractOptions) error {
	if opts.Name != "" && (opts.Name == "." || opts.Name == ".." || strings.Contains(opts.Name, "/")) {
		return fmt.Errorf("destination name %q is not one path component", opts.Name)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	var rnd [6]byte
	rand.Read(rnd[:])
	stage := ".berth-cp-" + hex.EncodeToString(rnd[:])
	if err := root.Mkdir(stage, 0o700); err != nil {
		return fmt.Errorf("making the staging directory in %s: %v", dir, err)
	}
	sroot, err := root.OpenRoot(stage)
	if err != nil {
		root.RemoveAll(stage)
		return err
	}
	x := &extractor{root: sroot, hostile: true, top: opts.Top, name: opts.Name, owners: opts.Archive, setid: opts.Archive, limit: opts.MaxBytes}
	if x.limit == 0 {
		x.limit = DefaultMaxCopyBytes
	}
	if opts.Top == "" {
		x.top, x.topFromFirst = "", true
	}
	err = x.extract(r)
	if err == nil {
		// The tar padding after the end marker, and the copy's own outcome: an error
		// that closes r means the stream may be cut short.
		if _, cerr := io.Copy(io.Discard, r); cerr != nil {
			err = fmt.Errorf("the copy failed after %d entries: %w", x.entries, cerr)
		}
	}
	sroot.Close()
	if err != nil {
		xe := &ExtractError{Err: err, Dir: dir}
		if rerr := root.RemoveAll(stage); rerr != nil {
			xe.Left = filepath.Join(dir, stage)
		}
		return xe
	}
	ents, err := readDirNames(root, stage)
	moved := false
	if err == nil {
		for _, n := range ents {
			if err = moveInto(root, stage+"/"+n, n); err != nil {
				break
			}
			moved = true
		}
	}
	if err != nil {
		return &ExtractError{Err: fmt.Errorf("moving the copy into place: %v", err), Dir: dir, Left: filepath.Join(dir, stage), Moved: moved}
	}
	root.RemoveAll(stage)
	if err := x.finishDirs(root); err != nil {
		return &ExtractError{Err: err, Dir: dir, InPlace: true}
	}
	return nil
}

// ExtractError is ExtractTar's error: why it failed, and what it left in Dir.
type ExtractError struct {
	// Err says what went wrong, naming the entry.
	Err error
	// Dir is the destination directory.
	Dir string
	// Left is the staging directory left behind (it could not be removed, or moving
	// its entries into place failed), "" when none is.
	Left string
	// Moved is true when some entries were moved into Dir before a move failed.
	Moved bool
	// InPlace is true when the whole copy is in Dir but not every directory got its
	// mode and mtime.
	InPlace bool
}

// Outcome says what the failed extraction left, e.g. "nothing was written to DIR".
func (e *ExtractError) Outcome() string {
	switch {
	case e.InPlace:
		return "the copy is in " + e.Dir + ", but not every directory in it got its mode and time"
	case e.Moved:
		return "some entries are already in " + e.Dir + ", the rest is left in " + e.Left + ": remove it"
	case e.Left != "":
		return "the partial copy is left in " + e.Left + ": remove it"
	default:
		return "nothing was written to " + e.Dir
	}
}

// Error returns Err and the Outcome.
func (e *ExtractError) Error() string { return e.Err.Error() + "; " + e.Outcome() }

// Unwrap returns Err.
func (e *ExtractError) Unwrap() error { return e.Err }

// extractAll extracts the tar stream r under root as the agent's CopyIn does (see the
// comment at the top of this file): the stream is trusted. No entry may be, lie
// under or (as a non-directory) replace a name in reserved (relative to root). When
// it fails, it undoes what it did (extractor.rollback) before it returns the error.
func extractAll(root *os.Root, r io.Reader, reserved ...string) error {
	x := &extractor{root: root, top: ".", owners: os.Geteuid() == 0, ownersBestEffort: true, setid: true, files: map[string]bool{}, reserved: reserved, undo: &journal{made: map[string]bool{}}}
	err := x.extract(r)
	if err == nil {
		err = x.finishDirs(root)
	}
	if err != nil {
		if left := x.rollback(); left != nil {
			return fmt.Errorf("%v; undoing the upload failed, so some of it is left: %v", err, left)
		}
		return fmt.Errorf("%v; nothing of the upload was kept", err)
	}
	x.commit()
	return nil
}

// journal is what an upload did, so that a failed one can be undone.
type journal struct {
	// created are the names the upload created (files, links, directories), in
	// order; made holds them as a set.
	created []string
	made    map[string]bool
	// saved are the files and links the upload replaced, moved aside until it ends.
	saved []savedEntry
}

// savedEntry is a file or link that an upload replaced: moved from name to backup.
type savedEntry struct{ name, backup string }

// created records that the upload made name (when it is undoable).
func (x *extractor) created(name string) {
	if x.undo != nil {
		x.undo.created = append(x.undo.created, name)
		x.undo.made[name] = true
	}
}

// rollback undoes a failed upload: it removes what it created, newest first (so a
// directory is empty by the time its turn comes, and a link is removed after what
// was made through it), then moves back what it replaced. It returns the first error
// of something that could not be undone (a directory that another process filled
// meanwhile stays), nil when all was.
func (x *extractor) rollback() error {
	var first error
	for i := len(x.undo.created) - 1; i >= 0; i-- {
		if err := x.root.Remove(x.undo.created[i]); err != nil && !errors.Is(err, fs.ErrNotExist) && first == nil {
			first = err
		}
	}
	for i := len(x.undo.saved) - 1; i >= 0; i-- {
		e := x.undo.saved[i]
		if err := x.root.Rename(e.backup, e.name); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// commit ends a successful upload: what it replaced goes.
func (x *extractor) commit() {
	for _, e := range x.undo.saved {
		x.root.Remove(e.backup)
	}
}

// dotNotDir is the error of an entry named "." that is not a directory.
const dotNotDir = "refused: a file or link named . would be the destination directory itself"

// extractor extracts the entries of one tar stream under root.
type extractor struct {
	root *os.Root
	// hostile: the stream comes from a sandbox (ExtractTar's rules).
	hostile bool
	// top and name: ExtractOptions.Top and Name (hostile only); topFromFirst takes
	// top from the first entry.
	top, name    string
	topFromFirst bool
	// owners: lchown entries to the stream's uid and gid; ownersBestEffort ignores
	// failures (the agent as root in a user namespace that does not map them).
	owners, ownersBestEffort bool
	// setid keeps setuid and setgid bits.
	setid bool
	// files are the regular files this stream created, by name (hard link targets
	// allowed on upload).
	files map[string]bool
	// dirs get their mode and mtime at the end, deepest first: creating their entries
	// would change the mtime, and a read-only mode would stop them.
	dirs []dirAttrs
	// entries counts the entries extracted.
	entries int
	// limit bounds the regular files' bytes together (ExtractOptions.MaxBytes; no
	// bound when ≤ 0); size is their total so far.
	limit, size int64
	// reserved are names under root that no entry may be, lie under, or replace as
	// a non-directory (the agent's own directories: CopyIn's refusal).
	reserved []string
	// undo, when set, records what the extraction does so that rollback can undo it
	// (upload); a download is staged instead (ExtractTar).
	undo *journal
}

type dirAttrs struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
	// owner: chown to uid and gid at the end (a directory that was there before the
	// upload, which a failed one leaves as it was).
	owner    bool
	uid, gid int
}

// extract extracts every entry of r, stopping at the first error, which names the
// entry.
func (x *extractor) extract(r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the tar stream after %d entries: %v", x.entries, err)
		}
		if err := x.entry(tr, hdr); err != nil {
			return fmt.Errorf("%s: %v", shown(hdr.Name), err)
		}
		x.entries++
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

// shown is name as an error shows it: as it is when every character is printable,
// else quoted, so that a name from a hostile stream cannot drive the terminal.
func shown(name string) string {
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return strconv.Quote(name)
		}
	}
	return name
}

// tarMode turns a tar header's mode (Unix bits: 04000 setuid, 02000 setgid, 01000
// sticky) into an fs.FileMode, with setuid and setgid only when setid.
func tarMode(m int64, setid bool) fs.FileMode {
	mode := fs.FileMode(m).Perm()
	if m&0o4000 != 0 && setid {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 && setid {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// place checks the entry name (hostile: inside the one tree) and returns the name to
// create, and the depth of its directory inside the copied tree (-1: the entry is the
// tree's top, whose directory is outside the copy).
func (x *extractor) place(name string) (string, int, error) {
	if !x.hostile {
		return name, strings.Count(name, "/"), nil
	}
	if x.topFromFirst {
		if name == "." || strings.Contains(name, "/") {
			return "", 0, fmt.Errorf("the copy's first entry must name one file or directory")
		}
		x.top, x.topFromFirst = name, false
	}
	var rel string
	switch {
	case x.top == ".":
		rel = name
	case name == x.top:
		rel = "."
	case strings.HasPrefix(name, x.top+"/"):
		rel = name[len(x.top)+1:]
	default:
		return "", 0, fmt.Errorf("refused: not inside %s, the path asked for", shown(x.top))
	}
	depth := strings.Count(rel, "/")
	if rel == "." && x.top != "." {
		depth = -1
	}
	final := name
	if x.name != "" {
		if x.top == "." {
			final = path.Join(x.name, name)
		} else {
			final = x.name + name[len(x.top):]
		}
	}
	return final, depth, nil
}

// linkInside reports why the symlink target leaves the copied tree, from a link
// whose directory is depth levels below the tree's top (-1: the link is the top), or
// "" when it stays inside. Only a relative target whose ".." components all lead
// (none after a name: the name may be a link) and are no more than depth stays
// inside; entries are never created under a symlink, so the link's place in the tree
// is where it is on disk.
func linkInside(target string, depth int) string {
	switch {
	case target == "":
		return "its target is empty"
	case path.IsAbs(target):
		return "its target is absolute, and on the host it would name a host file"
	case depth < 0:
		return "it is copied by itself, so its target is outside the copy"
	}
	up, named := 0, false
	for _, c := range strings.Split(target, "/") {
		switch c {
		case "", ".":
		case "..":
			if named {
				return "its target has \"..\" after a name, which cannot be checked without following links"
			}
			up++
		default:
			named = true
		}
	}
	if up > depth {
		return "its target leads out of the copied tree"
	}
	return ""
}

// mkParents makes the missing parent directories of name (0755). Hostile: every
// existing parent must be a directory, not a symlink, so that no entry is created
// through a link. Upload: a link that stays inside the root is followed, and the
// directories made are recorded for rollback.
func (x *extractor) mkParents(name string) error {
	d := path.Dir(name)
	if d == "." {
		return nil
	}
	// Upload: a link inside the destination is followed (os.Root refuses one that
	// leads out of it). Hostile: none is.
	stat := x.root.Stat
	if x.hostile {
		stat = x.root.Lstat
	}
	p := ""
	for _, c := range strings.Split(d, "/") {
		p = path.Join(p, c)
		fi, err := stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := x.root.Mkdir(p, 0o755); err != nil {
				return err
			}
			x.created(p)
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("refused: it lies under the symlink %s, and extraction never writes through a link", shown(p))
		case !fi.IsDir():
			return fmt.Errorf("%s is not a directory", shown(p))
		}
	}
	return nil
}

// removeOld removes the file or link at name, if any, for the entry of that name;
// a directory there stays, merging with an entry that is a directory and refusing
// one that is not (dirInTheWay). It never follows a link.
//
// In an upload, a file or link that was there before it is moved aside instead (to
// .berth-old-RANDOM in its directory), to be put back if the upload fails.
func (x *extractor) removeOld(name string, dir bool) error {
	delete(x.files, name)
	fi, err := x.root.Lstat(name)
	if err != nil {
		return nil
	}
	if fi.IsDir() {
		if dir {
			return nil
		}
		return dirInTheWay(name)
	}
	if x.undo == nil || x.undo.made[name] {
		return x.root.Remove(name)
	}
	for {
		var rnd [6]byte
		rand.Read(rnd[:])
		backup := path.Join(path.Dir(name), ".berth-old-"+hex.EncodeToString(rnd[:]))
		if _, err := x.root.Lstat(backup); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := x.root.Rename(name, backup); err != nil {
			return err
		}
		x.undo.saved = append(x.undo.saved, savedEntry{name: name, backup: backup})
		return nil
	}
}

// dirInTheWay is the error of a copy whose file or link would replace the directory
// name: refused, as cp(1) refuses to overwrite a directory with a non-directory,
// rather than deleting a tree that the copy's author most likely meant to copy into.
func dirInTheWay(name string) error {
	return fmt.Errorf("%s is a directory, and a copy never replaces a directory with a file or link; to copy into it, end the destination with / (or name the copy inside it); to replace it, remove it first", shown(name))
}

// refusedType says why a hostile stream's entry of type t is refused.
func refusedType(hdr *tar.Header) string {
	if sparse(hdr) {
		return "a sparse file; a download keeps only files stored in full (berth's agent sends no sparse entries, and the holes of a small stream could fill the host's disk)"
	}
	switch hdr.Typeflag {
	case tar.TypeLink:
		return fmt.Sprintf("a hard link to %s; a download keeps only regular files, directories and symlinks inside the copy (a hard link could join a host file to the copy)", shown(hdr.Linkname))
	case tar.TypeChar, tar.TypeBlock:
		return "a device; a download keeps only regular files, directories and symlinks"
	case tar.TypeFifo:
		return "a FIFO; a download keeps only regular files, directories and symlinks"
	default:
		return fmt.Sprintf("an entry of tar type %q; a download keeps only regular files, directories and symlinks", hdr.Typeflag)
	}
}

// sparse reports whether hdr is a sparse file: old GNU ('S') or GNU's PAX sparse
// formats, whose holes archive/tar reads out as zeros.
func sparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

func (x *extractor) entry(tr *tar.Reader, hdr *tar.Header) error {
	n, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink:
		if x.hostile && sparse(hdr) {
			return fmt.Errorf("refused: %s", refusedType(hdr))
		}
	case tar.TypeLink:
		if x.hostile {
			return fmt.Errorf("refused: %s", refusedType(hdr))
		}
	default:
		if x.hostile {
			return fmt.Errorf("refused: %s", refusedType(hdr))
		}
		return nil // upload: devices, FIFOs and the like are not created
	}
	name, depth, err := x.place(n)
	if err != nil {
		return err
	}
	for _, r := range x.reserved {
		if name == r || strings.HasPrefix(name, r+"/") || strings.HasPrefix(r, name+"/") && hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("refused: %s is berth's agent's own directory (its socket, state or binary), which a copy never writes", shown(r))
		}
	}
	if hdr.Typeflag == tar.TypeReg && x.limit > 0 {
		if hdr.Size > x.limit-x.size {
			return fmt.Errorf("refused: %d bytes, which would take the copy past its limit of %d bytes (%s; %d bytes before this file); raise the limit (berth cp --max-size SIZE, or unlimited) if you expect a copy this large", hdr.Size, x.limit, formatSize(x.limit), x.size)
		}
		x.size += hdr.Size
	}
	if x.hostile && hdr.Typeflag == tar.TypeSymlink {
		if why := linkInside(hdr.Linkname, depth); why != "" {
			return fmt.Errorf("refused: a symlink to %s: %s", shown(hdr.Linkname), why)
		}
	}
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return errors.New(dotNotDir)
		}
		return nil // the destination itself: its attributes are not changed
	}
	if err := x.mkParents(name); err != nil {
		return err
	}
	if err := x.removeOld(name, hdr.Typeflag == tar.TypeDir); err != nil {
		return err
	}
	mode := tarMode(hdr.Mode, x.setid)
	switch hdr.Typeflag {
	case tar.TypeDir:
		err := x.root.Mkdir(name, 0o700)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		d := dirAttrs{name: name, mode: mode, mtime: hdr.ModTime}
		if err != nil && x.undo != nil && !x.undo.made[name] {
			// There before the upload: its owner changes only once the upload has
			// succeeded, as its mode and mtime do.
			d.owner, d.uid, d.gid = x.owners, hdr.Uid, hdr.Gid
			x.dirs = append(x.dirs, d)
			return nil
		}
		if err == nil {
			x.created(name)
		}
		x.dirs = append(x.dirs, d)
		return x.chown(name, hdr)
	case tar.TypeSymlink:
		if err := x.root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
		x.created(name)
		return x.chown(name, hdr)
	case tar.TypeLink:
		old, err := cleanName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hard link to %s: %v", shown(hdr.Linkname), err)
		}
		if !x.files[old] {
			return fmt.Errorf("hard link to %s: not a regular file that this copy created before it (hard links may only join files inside the copied tree)", shown(hdr.Linkname))
		}
		if err := x.root.Link(old, name); err != nil {
			return err
		}
		x.created(name)
		x.files[name] = true
		return nil
	}
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	x.created(name)
	err = writeSparse(f, tr)
	if err == nil && x.owners {
		if cerr := f.Chown(hdr.Uid, hdr.Gid); cerr != nil && !x.ownersBestEffort {
			err = fmt.Errorf("keeping the owner %d:%d: %v (only root can give files to other users; drop --archive to keep them yours)", hdr.Uid, hdr.Gid, cerr)
		}
	}
	if err == nil {
		err = f.Chmod(mode) // after chown, which clears setuid and setgid
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if x.files != nil {
		x.files[name] = true
	}
	if !hdr.ModTime.IsZero() {
		x.root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	}
	return nil
}

// holeBlock is the size of the blocks writeSparse leaves as holes when they hold
// only zeros: the page and file system block size berth's hosts use.
const holeBlock = 4096

// writeSparse copies r to f (new and empty), leaving every whole holeBlock of zeros
// as a hole (a seek past it), and sets f's size at the end: a file with holes is
// written with holes, as `cp --sparse=auto` does, instead of with its zeros.
func writeSparse(f *os.File, r io.Reader) error {
	buf := make([]byte, 16*holeBlock)
	var off int64
	for {
		n, rerr := fill(r, buf)
		for b := 0; b < n; b += holeBlock {
			blk := buf[b:min(b+holeBlock, n)]
			if len(blk) == holeBlock && allZero(blk) {
				continue
			}
			if _, err := f.WriteAt(blk, off+int64(b)); err != nil {
				return err
			}
		}
		off += int64(n)
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	return f.Truncate(off)
}

// fill reads from r until buf is full or r fails; io.EOF is returned only with the
// bytes read before it (unlike io.ReadFull, r's own io.ErrUnexpectedEOF, a cut
// stream, stays an error).
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// formatSize renders n bytes as a size in the largest binary unit that divides it
// (1 GiB, 512 MiB), else in bytes.
func formatSize(n int64) string {
	for _, u := range []struct {
		name string
		size int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d %s", n/u.size, u.name)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}

// chown gives name (not followed) the entry's owner when owners are kept.
func (x *extractor) chown(name string, hdr *tar.Header) error {
	if !x.owners {
		return nil
	}
	if err := x.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil && !x.ownersBestEffort {
		return fmt.Errorf("keeping the owner %d:%d: %v (only root can give files to other users; drop --archive to keep them yours)", hdr.Uid, hdr.Gid, err)
	}
	return nil
}

// finishDirs gives the extracted directories, now under root by their names, their
// modes and mtimes, deepest first (owners were set as they were made). A name that is no longer a directory (a
// later entry replaced it) is skipped.
func (x *extractor) finishDirs(root *os.Root) error {
	dirs := slices.Clone(x.dirs)
	slices.SortStableFunc(dirs, func(a, b dirAttrs) int { return strings.Count(b.name, "/") - strings.Count(a.name, "/") })
	for _, d := range dirs {
		if fi, err := root.Lstat(d.name); err != nil || !fi.IsDir() {
			continue
		}
		if d.owner {
			if err := x.chown(d.name, &tar.Header{Uid: d.uid, Gid: d.gid}); err != nil {
				return fmt.Errorf("%s: %v", d.name, err)
			}
		}
		if err := root.Chmod(d.name, d.mode); err != nil {
			return fmt.Errorf("%s: %v", d.name, err)
		}
		if !d.mtime.IsZero() {
			root.Chtimes(d.name, d.mtime, d.mtime)
		}
	}
	return nil
}

// readDirNames lists the entries of the directory name under root.
func readDirNames(root *os.Root, name string) ([]string, error) {
	f, err := root.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// moveInto moves from to to under root, as cp places a copy: a directory merges
// into an existing directory (entry by entry); a file or link replaces a file or link
// at to (a link there is replaced, not followed) and never a directory
// (dirInTheWay).
func moveInto(root *os.Root, from, to string) error {
	tfi, err := root.Lstat(to)
	if err == nil {
		ffi, err := root.Lstat(from)
		if err != nil {
			return err
		}
		switch {
		case tfi.IsDir() && ffi.IsDir():
			names, err := readDirNames(root, from)
			if err != nil {
				return err
			}
			for _, n := range names {
				if err := moveInto(root, from+"/"+n, to+"/"+n); err != nil {
					return err
				}
			}
			return nil
		case tfi.IsDir():
			return dirInTheWay(to)
		default:
			err = root.Remove(to)
		}
		if err != nil {
			return err
		}
	}
	return root.Rename(from, to)
}

// WriteTar writes the file or directory at path to w as a tar stream, as the agent's
// CopyOut does: the top entry is named name (path's base name when empty), the others
// name/REL; symlinks are stored as symlinks and never followed; every regular file is
// stored in full (no hard links); sockets are skipped. Modes keep setuid, setgid and
// sticky (tar's 04000, 02000, 01000); owners are stored as numbers.
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
		// Whole seconds, cut as tar(1) does: archive/tar would round them (its
		// default format), which stamps a copy up to half a second after its
		// source, in the future for a file just written.
		hdr.ModTime = hdr.ModTime.Truncate(time.Second)
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
