package registry

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"syscall"

	"github.com/berth-sh/berth/backend"
)

// bbolt maps the store file into memory: a page that lies past the end of a
// truncated file is a SIGBUS, which no error check in bbolt catches. So the file is
// read with plain reads first and checked as bbolt checks it (meta pages: magic,
// version, checksum; the newest valid one decides), and then against what mapping
// it needs (the file must hold every page the newest meta page counts).
//
// These are bbolt's on-disk constants (go.etcd.io/bbolt/internal/common): a page
// starts with a 16-byte header (id, flags, count, overflow); a meta page's body is
// magic, version, page size, flags, root bucket (page, sequence), freelist page,
// page count (the high-water mark), transaction id and an FNV-64a checksum of the
// fields before it, in the machine's byte order.
const (
	boltMagic          = 0xED0CDAED
	boltVersion        = 2
	boltPageHeaderSize = 16
	boltMetaSize       = 64
	boltMetaSummed     = 56 // bytes of the meta covered by its checksum
	boltNoFreelist     = ^uint64(0)
)

// boltMeta is one decoded meta page.
type boltMeta struct {
	magic, version, pageSize uint32
	root, freelist, pgid     uint64
	txid                     uint64
	sumOK                    bool
}

func decodeBoltMeta(b []byte) boltMeta {
	e := binary.NativeEndian
	h := fnv.New64a()
	h.Write(b[:boltMetaSummed])
	return boltMeta{
		magic:    e.Uint32(b[0:]),
		version:  e.Uint32(b[4:]),
		pageSize: e.Uint32(b[8:]),
		root:     e.Uint64(b[16:]),
		freelist: e.Uint64(b[32:]),
		pgid:     e.Uint64(b[40:]),
		txid:     e.Uint64(b[48:]),
		sumOK:    e.Uint64(b[56:]) == h.Sum64(),
	}
}

// problem says what bbolt's Validate would refuse in m, or "".
func (m boltMeta) problem() string {
	switch {
	case m.magic != boltMagic:
		return "it is not a bbolt database (no bbolt magic number in its meta pages)"
	case m.version != boltVersion:
		return fmt.Sprintf("its bbolt format version is %d, not %d", m.version, boltVersion)
	case !m.sumOK:
		return "its meta pages fail their checksums"
	}
	return ""
}

// readMetaAt reads the meta page at off; ok is false when the file is too short.
func readMetaAt(f *os.File, off int64) (m boltMeta, ok bool, err error) {
	var b [boltPageHeaderSize + boltMetaSize]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		if errors.Is(err, io.EOF) {
			return boltMeta{}, false, nil
		}
		return boltMeta{}, false, err
	}
	return decodeBoltMeta(b[boltPageHeaderSize:]), true, nil
}

// storeVersion names one committed state of the store file: the file (device,
// inode and change time, so a store moved aside and made anew is another file) and
// the transaction id of the meta page bbolt uses. bbolt gives every committed write
// transaction the next id and writes its meta page last, after its data pages are on
// disk, so two reads that find the same version read the same data. The zero value
// is no file.
type storeVersion struct {
	dev, ino uint64
	ctime    int64 // ns since the epoch
	txid     uint64
}

// fileVersion is the version of the open store file f as of transaction txid.
func fileVersion(f *os.File, txid uint64) (storeVersion, error) {
	fi, err := f.Stat()
	if err != nil {
		return storeVersion{}, err
	}
	return versionOf(fi, txid), nil
}

func versionOf(fi os.FileInfo, txid uint64) storeVersion {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return storeVersion{}
	}
	return storeVersion{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim.Nano(), txid: txid}
}

// storeDamage checks the bbolt file at path with plain reads and returns what makes
// it unusable ("" when bbolt can map it safely). A missing file is not damaged.
func storeDamage(path string) (string, error) {
	_, damage, err := inspectStore(path)
	return damage, err
}

// inspectStore is storeDamage that also returns the store's version when it is not
// damaged (the zero version for a missing file).
func inspectStore(path string) (v storeVersion, damage string, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return storeVersion{}, "", nil
	} else if err != nil {
		return storeVersion{}, "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return storeVersion{}, "", err
	}
	damage, txid, err := metaDamage(f, fi)
	if err != nil || damage != "" {
		return storeVersion{}, damage, err
	}
	return versionOf(fi, txid), "", nil
}

// metaDamage is inspectStore's check of the open file f: what makes it unusable, or
// "" and the transaction id of the meta page bbolt uses.
func metaDamage(f *os.File, fi os.FileInfo) (damage string, txid uint64, err error) {
	size := fi.Size()
	if !fi.Mode().IsRegular() {
		return "it is not a regular file", 0, nil
	}
	if size == 0 {
		return "it is empty (0 bytes)", 0, nil
	}
	// The page size: from the first meta page, else from a second one at one of the
	// offsets bbolt tries (1 KiB to 16 MiB), as bbolt finds it.
	first, ok, err := readMetaAt(f, 0)
	if err != nil {
		return "", 0, err
	}
	if !ok {
		return fmt.Sprintf("it is truncated (%d bytes, shorter than one bbolt page)", size), 0, nil
	}
	var pageSize int64
	if first.problem() == "" {
		pageSize = int64(first.pageSize)
	} else {
		for i := 0; i <= 14 && pageSize == 0; i++ {
			pos := int64(1024) << i
			if pos >= size-1024 {
				break
			}
			if m, ok, err := readMetaAt(f, pos); err != nil {
				return "", 0, err
			} else if ok && m.problem() == "" {
				pageSize = int64(m.pageSize)
			}
		}
	}
	if pageSize == 0 {
		return first.problem(), 0, nil
	}
	if pageSize < 1024 || pageSize&(pageSize-1) != 0 {
		return fmt.Sprintf("its meta page gives an impossible page size %d", pageSize), 0, nil
	}
	if size < 2*pageSize {
		return fmt.Sprintf("it is truncated (%d bytes, shorter than its two %d-byte meta pages)", size, pageSize), 0, nil
	}
	// The meta page bbolt uses: the valid one with the higher transaction id.
	var metas []boltMeta
	for i := range int64(2) {
		m, _, err := readMetaAt(f, i*pageSize)
		if err != nil {
			return "", 0, err
		}
		if m.problem() == "" && int64(m.pageSize) == pageSize {
			metas = append(metas, m)
		}
	}
	if len(metas) == 0 {
		return first.problem(), 0, nil
	}
	m := metas[0]
	if len(metas) == 2 && metas[1].txid > m.txid {
		m = metas[1]
	}
	if m.pgid < 4 || m.pgid > uint64(1<<62)/uint64(pageSize) {
		return fmt.Sprintf("its meta page counts an impossible %d pages", m.pgid), 0, nil
	}
	if need := int64(m.pgid) * pageSize; size < need {
		return fmt.Sprintf("it is truncated (%d bytes; its meta page counts %d pages of %d bytes, %d bytes)", size, m.pgid, pageSize, need), 0, nil
	}
	if m.root < 2 || m.root >= m.pgid || (m.freelist != boltNoFreelist && (m.freelist < 2 || m.freelist >= m.pgid)) {
		return "its meta page points at pages past its end", 0, nil
	}
	if m.freelist != boltNoFreelist {
		var hdr [boltPageHeaderSize]byte
		if _, err := f.ReadAt(hdr[:], int64(m.freelist)*pageSize); err != nil {
			return "", 0, err
		}
		if overflow := uint64(binary.NativeEndian.Uint32(hdr[12:])); m.freelist+overflow >= m.pgid {
			return "its freelist runs past its end", 0, nil
		}
	}
	return "", m.txid, nil
}

// damagedStore is badStore for a damaged file.
func damagedStore(path, damage string) error { return badStore(path, "is damaged", damage) }

// badStore is the error for a state store berth cannot use (kind
// backend.ErrInvalid): it names the file, what is wrong with it (state: "is
// damaged"; why), and what to do, including what a new store keeps.
func badStore(path, state, why string) error {
	dir := filepath.Dir(path)
	next := "a new store then gets a new owner id, and the sandboxes of the old one become another owner's, which berth never uses or prunes: " +
		"remove them with `berth prune --owner OLD` (OLD is their berth.owner label)"
	if id, ok := readOwnerCopy(dir); ok {
		next = fmt.Sprintf("the new store keeps this state dir's owner id %s (copied in %s), so the next exec of a session, or `berth prune`, adopts its sandboxes again; "+
			"what only the store knew (last use, removals by retention, moves) is lost", id, filepath.Join(dir, OwnerFile))
	}
	return backend.Errorf(backend.ErrInvalid, "state store %s %s: %s; move it aside (mv %s %s.damaged) and run berth again: %s",
		path, state, why, path, path, next)
}

// checkStore returns damagedStore when the file at path exists but bbolt cannot map
// it safely, and the store's version otherwise (see inspectStore).
func checkStore(path string) (storeVersion, error) {
	v, damage, err := inspectStore(path)
	if err != nil {
		return storeVersion{}, fmt.Errorf("reading state store %s: %w", path, err)
	}
	if damage != "" {
		return storeVersion{}, damagedStore(path, damage)
	}
	return v, nil
}

// faultError is what a memory fault in the mapped store becomes.
type faultError interface{ Addr() uintptr }

// guardFaults makes a memory fault in the calling goroutine (a SIGBUS on a page
// of the mapped store that another process truncated after it was checked) a
// panic, and turns that panic into a damaged-store error in *errp. Use it as
// `defer guardFaults(path, &err, cleanup)()` around everything that touches the
// mapping; cleanup (if not nil) releases what the faulting call left open.
func guardFaults(path string, errp *error, cleanup func()) func() {
	old := debug.SetPanicOnFault(true)
	return func() {
		debug.SetPanicOnFault(old)
		v := recover()
		if v == nil {
			return
		}
		if _, ok := v.(faultError); !ok {
			panic(v)
		}
		if cleanup != nil {
			cleanup()
		}
		damage := "a memory fault reading it: it changed size while berth had it open (truncated by another process?)"
		if d, err := storeDamage(path); err == nil && d != "" {
			damage = d + " (found while berth had it open: changed by another process?)"
		}
		*errp = damagedStore(path, damage)
	}
}

// OwnerFile is the file in the state dir that holds a copy of the owner id (which
// lives in the store's meta bucket), so that a store that had to be moved aside is
// rebuilt with the same owner id and this state dir's sandboxes stay ours.
const OwnerFile = "owner"

// readOwnerCopy returns the owner id copied in dir's OwnerFile, when it holds one.
func readOwnerCopy(dir string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(dir, OwnerFile))
	if err != nil {
		return "", false
	}
	id := string(b)
	if len(id) > 0 && id[len(id)-1] == '\n' {
		id = id[:len(id)-1]
	}
	if !generatedOwner(id) {
		return "", false
	}
	return id, true
}

// generatedOwner reports whether id looks like an owner id berth generates (32
// lowercase hex digits).
func generatedOwner(id string) bool {
	if len(id) != 32 {
		return false
	}
	for _, c := range id {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// writeOwnerCopy makes dir's OwnerFile hold id, unless it does already; it writes
// a temporary file and renames it into place, so the copy is never half written.
func writeOwnerCopy(dir, id string) error {
	if got, ok := readOwnerCopy(dir); ok && got == id {
		return nil
	}
	path := filepath.Join(dir, OwnerFile)
	tmp := path + ".new-" + randomHex(8)
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
