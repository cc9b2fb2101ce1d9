package registry

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-sh/berth/backend"
)

// goodStore makes a store with one record in a fresh state dir and returns the
// store, its file's bytes and the owner id.
func goodStore(t *testing.T) (*store, []byte, string) {
	t.Helper()
	dir := t.TempDir()
	s := newStore(filepath.Join(dir, StoreFile), 10*time.Second)
	owner, err := s.init()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.put(record{Session: "main", Driver: "local", Sandbox: "b-1", Created: time.Unix(1, 0).UTC(), LastUsed: time.Unix(2, 0).UTC()}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(s.path)
	if err != nil {
		t.Fatal(err)
	}
	return s, b, owner
}

// otherBolt returns the bytes of a valid bbolt file that is not a berth store.
func otherBolt(t *testing.T) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "other.db")
	db, err := bolt.Open(p, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("widgets"))
		if err != nil {
			return err
		}
		return b.Put([]byte("k"), []byte("v"))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDamagedStore: a store file bbolt cannot map safely (or that is not berth's) is
// refused before bbolt maps it, by every kind of call, with one error of kind
// ErrInvalid that names the file, the damage and what to do; the file is left as
// it is. Before the check, the truncated files were a SIGBUS.
func TestDamagedStore(t *testing.T) {
	_, good, _ := goodStore(t)
	ps := os.Getpagesize() // bbolt's default page size, that of goodStore's file
	// The pages the newest meta page counts: the file may be longer (bbolt grows it
	// ahead).
	m0, m1 := decodeBoltMeta(good[16:]), decodeBoltMeta(good[ps+16:])
	need := int(max(m0.pgid, m1.pgid)) * ps
	if need <= 2*ps || need > len(good) {
		t.Fatalf("good store: %d bytes, its meta pages count %d and %d pages", len(good), m0.pgid, m1.pgid)
	}
	flip := func(b []byte, offs ...int) []byte {
		b = append([]byte(nil), b...)
		for _, o := range offs {
			b[o] ^= 0xff
		}
		return b
	}
	garbage := make([]byte, 40000)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}
	cases := []struct {
		name, damage string
		data         []byte
	}{
		{"zero-length", "it is empty (0 bytes)", nil},
		{"shorter than a page", "shorter than one bbolt page", good[:50]},
		{"one page", "shorter than its two", good[:ps+100]},
		{"meta pages only", "it is truncated (", good[:2*ps]},
		{"last page missing", "it is truncated (", good[:need-ps]},
		{"last page cut", "it is truncated (", good[:need-100]},
		{"garbage", "it is not a bbolt database", garbage},
		{"meta checksums", "fail their checksums", flip(good, 16+20, ps+16+20)},
		{"other bbolt file", `is not berth's: it is a bbolt database with bucket(s) "widgets" and no "meta" bucket`, otherBolt(t)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, StoreFile)
			if err := os.WriteFile(path, c.data, 0o600); err != nil {
				t.Fatal(err)
			}
			s := newStore(path, 10*time.Second)
			calls := map[string]func() error{
				"init": func() error { _, err := s.init(); return err },
				"all":  func() error { _, err := s.all(); return err },
				"put":  func() error { return s.put(record{Session: "x"}) },
			}
			for what, call := range calls {
				if c.name == "other bbolt file" && what != "init" {
					continue // init is what every call of a Registry runs first
				}
				err := call()
				if err == nil || !errors.Is(err, backend.ErrInvalid) {
					t.Fatalf("%s: error %v, want kind ErrInvalid", what, err)
				}
				msg := err.Error()
				for _, want := range []string{"state store " + path + " ", c.damage, "move it aside (mv " + path + " " + path + ".damaged)",
					"a new store then gets a new owner id"} {
					if !strings.Contains(msg, want) {
						t.Errorf("%s: error %q\ndoes not say %q", what, msg, want)
					}
				}
				if strings.Contains(msg, "\n") {
					t.Errorf("%s: error has more than one line: %q", what, msg)
				}
				if b, _ := os.ReadFile(path); string(b) != string(c.data) {
					t.Errorf("%s changed the damaged file", what)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, OwnerFile)); err == nil {
				t.Errorf("a refused store left an owner copy")
			}
		})
	}
	// The check accepts every good store: fresh, and grown by many records.
	s, _, _ := goodStore(t)
	for i := range 300 {
		if err := s.put(record{Session: strings.Repeat("s", 100) + string(rune('a'+i%26)) + time.Duration(i).String()}); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := storeDamage(s.path); d != "" || err != nil {
		t.Errorf("a grown store: %q, %v", d, err)
	}
}

// TestDamagedStoreOwnerCopy: the owner id is copied outside the store; a store moved
// aside is rebuilt with the same owner id, and the damage message says so.
func TestDamagedStoreOwnerCopy(t *testing.T) {
	s, good, owner := goodStore(t)
	dir := filepath.Dir(s.path)
	if got, ok := readOwnerCopy(dir); !ok || got != owner {
		t.Fatalf("owner copy %q, %v; want %s", got, ok, owner)
	}
	if err := os.WriteFile(s.path, good[:len(good)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := s.all()
	want := "the new store keeps this state dir's owner id " + owner + " (copied in " + filepath.Join(dir, OwnerFile) + ")"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v\ndoes not say %q", err, want)
	}
	if err := os.Rename(s.path, s.path+".damaged"); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(s.path, 10*time.Second)
	if got, err := s2.init(); err != nil || got != owner {
		t.Errorf("rebuilt store: owner %q, %v; want %s", got, err, owner)
	}
	// A store from before the copy existed gets its copy on first use.
	os.Remove(filepath.Join(dir, OwnerFile))
	if got, err := s2.init(); err != nil || got != owner {
		t.Fatal(got, err)
	}
	if got, ok := readOwnerCopy(dir); !ok || got != owner {
		t.Errorf("owner copy after init %q, %v; want %s", got, ok, owner)
	}
	// An unusable copy is ignored: a new store gets a new owner id and the copy follows the store.
	os.Remove(s.path)
	os.WriteFile(filepath.Join(dir, OwnerFile), []byte("not an owner id\n"), 0o600)
	got, err := s2.init()
	if err != nil || got == owner || !generatedOwner(got) {
		t.Fatalf("owner %q, %v after a bad copy", got, err)
	}
	if c, _ := readOwnerCopy(dir); c != got {
		t.Errorf("owner copy %q, store's owner %q", c, got)
	}
}

// TestOwnerCopyFirstCall: a registry's first call on a session reads the owner id
// and the record in one read, without init; a store made before the owner copy
// existed gets its copy then too.
func TestOwnerCopyFirstCall(t *testing.T) {
	e := newEnv(t, twoRules)
	run(t, e.open(), "main", "true")
	copyPath := filepath.Join(e.stateDir, OwnerFile)
	owner, err := os.ReadFile(copyPath)
	if err != nil {
		t.Fatalf("no owner copy after the first call: %v", err)
	}
	os.Remove(copyPath)
	r := e.open()
	if _, ok, err := r.ownerAndRecord("main"); err != nil || !ok {
		t.Fatalf("ownerAndRecord: %v %v", ok, err)
	}
	if got, err := os.ReadFile(copyPath); err != nil || string(got) != string(owner) {
		t.Errorf("owner copy after the first call of a new registry: %q, %v; want %q", got, err, owner)
	}
}

// TestStoreTruncatedWhileOpen: a store that another process truncates while berth
// has it mapped makes the transaction fail with the damaged-store error instead of
// a SIGBUS, and leaves no lock held: the store works again once it is restored.
func TestStoreTruncatedWhileOpen(t *testing.T) {
	s, good, _ := goodStore(t)
	for _, write := range []bool{false, true} {
		tx := s.view
		if write {
			tx = s.update
		}
		err := tx(func(tx *bolt.Tx) error {
			if err := os.Truncate(s.path, 0); err != nil {
				t.Fatal(err)
			}
			b := tx.Bucket(bucketSessions)
			if write {
				return b.Put([]byte("after"), []byte("{}"))
			}
			return b.ForEach(func(k, v []byte) error { return nil })
		})
		if err == nil || !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "state store "+s.path+" is damaged: it is empty (0 bytes) (found while berth had it open") {
			t.Errorf("write %v: error %v", write, err)
		}
		if err := os.WriteFile(s.path, good, 0o600); err != nil {
			t.Fatal(err)
		}
		// A lock left behind by the faulting open would make this time out.
		if err := s.put(record{Session: "again"}); err != nil {
			t.Errorf("write %v: the restored store: %v", write, err)
		}
		if recs, err := s.all(); err != nil || len(recs) != 2 {
			t.Errorf("write %v: records %v, %v", write, recs, err)
		}
		os.WriteFile(s.path, good, 0o600)
	}
}

// TestStoreReadCache: a store keeps the records it read while the file stays at the
// version it read them at, and sees at once every write of another store on the
// same file (as another berth process makes them), a store made anew in its place,
// and an older copy of the file put back.
func TestStoreReadCache(t *testing.T) {
	s, _, _ := goodStore(t)
	other := newStore(s.path, 10*time.Second)
	get := func(want string) {
		t.Helper()
		r, ok, err := s.get("main")
		switch {
		case err != nil:
			t.Fatalf("get: %v", err)
		case want == "" && ok:
			t.Fatalf("get: record %+v, want none", r)
		case want != "" && (!ok || r.Sandbox != want):
			t.Fatalf("get: record %+v (%v), want sandbox %s", r, ok, want)
		}
	}
	get("b-1")

	// A read served from the cache opens nothing: it does not wait for a writer that
	// holds the store's lock (bbolt's flock), and returns what was committed last.
	f, err := os.Open(s.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	s.timeout = time.Nanosecond // a read that opened the store would fail at once
	get("b-1")
	if _, err := s.all(); !errors.Is(err, backend.ErrTimeout) {
		t.Fatalf("all with the store locked: %v, want ErrTimeout", err)
	}
	f.Close()
	s.timeout = 10 * time.Second

	before, err := os.ReadFile(s.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.put(record{Session: "main", Driver: "local", Sandbox: "b-2"}); err != nil {
		t.Fatal(err)
	}
	get("b-2")
	if _, err := other.forgetSandbox("local", "b-2"); err != nil {
		t.Fatal(err)
	}
	get("")

	// An older copy of the file renamed into place (another inode, an older
	// transaction id), then written over in place (the same inode).
	tmp := s.path + ".old"
	if err := os.WriteFile(tmp, before, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		t.Fatal(err)
	}
	get("b-1")
	if err := other.put(record{Session: "main", Driver: "local", Sandbox: "b-3"}); err != nil {
		t.Fatal(err)
	}
	get("b-3")
	if err := os.WriteFile(s.path, before, 0o600); err != nil {
		t.Fatal(err)
	}
	get("b-1")

	// A store made anew in its place (moved aside, rebuilt).
	if err := os.Rename(s.path, s.path+".damaged"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.init(); err != nil {
		t.Fatal(err)
	}
	get("")
}

// TestTouchCoalescesAcrossStores: a touch less than touchCoalesce after the last use
// that a store read from the last-use file (another berth process's touch) writes
// nothing; a later one, one of another sandbox, or one with the clock set back does.
func TestTouchCoalescesAcrossStores(t *testing.T) {
	s, _, _ := goodStore(t)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := s.touch("main", "b-1", t0); err != nil {
		t.Fatal(err)
	}
	other := newStore(s.path, 10*time.Second) // as the next berth process
	lastUse := func() time.Time {
		t.Helper()
		r, ok, err := newStore(s.path, 10*time.Second).get("main")
		if err != nil || !ok {
			t.Fatalf("get: %v %v", ok, err)
		}
		return r.LastUsed
	}
	if r, _, err := other.get("main"); err != nil || !r.LastUsed.Equal(t0) {
		t.Fatalf("get: last use %v %v, want %v", r.LastUsed, err, t0)
	}
	for _, c := range []struct {
		what    string
		sandbox string
		at      time.Time
		want    time.Time
	}{
		{"within a second", "b-1", t0.Add(touchCoalesce / 2), t0},
		{"a second later", "b-1", t0.Add(touchCoalesce), t0.Add(touchCoalesce)},
		{"clock set back", "b-1", t0.Add(-time.Minute), t0.Add(-time.Minute)},
	} {
		if err := other.touch("main", c.sandbox, c.at); err != nil {
			t.Fatal(err)
		}
		if got := lastUse(); !got.Equal(c.want) {
			t.Errorf("%s: last use %v, want %v", c.what, got, c.want)
		}
	}
	// Another sandbox's touch is written at once (the record is of b-1, so get does
	// not merge it: read the file).
	if err := other.touch("main", "b-2", t0.Add(-time.Minute).Add(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(other.lastUsePath("main")); err != nil || !strings.HasPrefix(string(b), "b-2 ") {
		t.Errorf("last-use file %q %v, want b-2's", b, err)
	}
}
