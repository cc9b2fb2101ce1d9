package registry

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/berth-sh/berth/backend"
)

// SchemaVersion is the state store's schema version, kept in the store's "meta"
// bucket under "schema". A store written by a newer schema is refused. Version 2
// adds the "pool" bucket (warm pool members) and the records' "pooled" field; a
// version 1 store is raised to 2 by its first pool write, so that a berth older than
// pools refuses it (with a clear error) instead of taking pool members for orphans.
const SchemaVersion = 2

// baseSchema is the version a new store is written with: stores without pool
// members stay readable by a berth that predates pools.
const baseSchema = 1

// StoreFile is the state store's file name inside the state dir.
const StoreFile = "state.db"

// DefaultStoreTimeout is how long a call waits for another berth process to release
// the state store (WithStoreTimeout).
const DefaultStoreTimeout = 30 * time.Second

var (
	bucketMeta     = []byte("meta")
	bucketSessions = []byte("sessions")
	bucketPool     = []byte("pool")
	keySchema      = []byte("schema")
	keyOwner       = []byte("owner")
)

// record is one session's entry in the store (JSON under its session name).
type record struct {
	Session  string    `json:"session"`
	Driver   string    `json:"driver"`
	Sandbox  string    `json:"sandbox"`
	Scope    string    `json:"scope"`
	SpecHash string    `json:"spec_hash"`
	Created  time.Time `json:"created"`
	LastUsed time.Time `json:"last_used"`
	// Removed is when retention (idle_ttl with idle_action "remove", max_age)
	// removed the sandbox while keeping the record, so the session's next exec can
	// say that its sandbox is new (Lease.Recreated); zero otherwise. RemovedReason
	// says why.
	Removed       time.Time `json:"removed,omitzero"`
	RemovedReason string    `json:"removed_reason,omitempty"`
	// Agent is how the host reaches the sandbox's agent (the driver's
	// Capabilities.Agent when the record was written): with AgentSocket a call dials
	// the socket in the sandbox's host dir without starting the driver.
	Agent backend.AgentReach `json:"agent,omitempty"`
	// Pooled is set when the sandbox is a warm pool member that the session claimed
	// (Sandbox is then a PoolMemberName, not the session's own sandbox name):
	// Created is the claim's time, and drift is judged against the rule's PoolHash.
	Pooled bool `json:"pooled,omitempty"`
}

// store is the bbolt state store, opened for each transaction so that concurrent
// berth processes share it (bbolt holds an exclusive flock while open; read-only
// opens take a shared one).
type store struct {
	path    string
	timeout time.Duration
	mu      *sync.RWMutex // serialises opens of path within this process

	// touched is each session's last touch that this store made or read (touch
	// coalesces with it), and lastUseMade says that lastUseDir exists.
	touchMu     sync.Mutex
	touched     map[string]touchMark
	lastUseMade bool

	cache readCache
}

// touchMark is a touch that this store wrote: the sandbox and the time.
type touchMark struct {
	sandbox string
	t       time.Time
}

// touchCoalesce is how close to the last touch of a session, on the same sandbox, a
// new one may be and still be skipped: a session that runs many commands a second
// (an agent's loop) costs one last-use write a second, not one per command, and its
// recorded last use is at most this much older than the truth, which no retention
// setting notices (idle_ttl counts in minutes and more).
const touchCoalesce = time.Second

var storeLocks sync.Map // path → *sync.RWMutex

func newStore(path string, timeout time.Duration) *store {
	mu, _ := storeLocks.LoadOrStore(path, new(sync.RWMutex))
	if timeout <= 0 {
		timeout = DefaultStoreTimeout
	}
	return &store{path: path, timeout: timeout, mu: mu.(*sync.RWMutex), touched: map[string]touchMark{}}
}

// withDB opens the store at path (checked first with plain reads: see checkStore),
// runs fn on it and closes it. A memory fault in the mapped file (another process
// truncated it meanwhile) becomes a damaged-store error. After a fault bbolt's own
// state is unknown (a write transaction's rollback faults too and keeps bbolt's
// locks, so DB.Close would hang): the file's flock is released and the file closed
// directly, so other processes and calls can use the store again once it is put
// right, and the mapping is left until the process ends (address space only: the
// truncated file has no pages to keep).
func (s *store) withDB(path string, opts bolt.Options, fn func(db *bolt.DB) error) (err error) {
	if _, err := checkStore(path); err != nil {
		return err
	}
	return s.withCheckedDB(path, opts, func(db *bolt.DB, _ *os.File) error { return fn(db) })
}

// withCheckedDB is withDB for a caller that has just checked the file itself
// (checkStore); fn also gets the open file.
func (s *store) withCheckedDB(path string, opts bolt.Options, fn func(db *bolt.DB, f *os.File) error) (err error) {
	var file *os.File
	defer guardFaults(path, &err, func() {
		if file != nil {
			// The mapping holds the open file, and with it the flock, after the
			// descriptor is closed: unlock first.
			syscall.Flock(int(file.Fd()), syscall.LOCK_UN)
			file.Close()
		}
	})()
	opts.Timeout = s.timeout
	opts.OpenFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, perm)
		file = f
		return f, err
	}
	db, err := bolt.Open(path, 0o600, &opts)
	if err != nil {
		switch {
		case errors.Is(err, bolterrors.ErrTimeout):
			return backend.Errorf(backend.ErrTimeout, "state store %s: another berth process held it for more than %s; try again, or find the stuck process", s.path, s.timeout)
		case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrVersionMismatch), errors.Is(err, bolterrors.ErrChecksum):
			// The file changed between the check and the open.
			if d, derr := storeDamage(path); derr == nil && d != "" {
				return damagedStore(path, d)
			}
			return damagedStore(path, err.Error())
		}
		return fmt.Errorf("opening state store %s: %w", path, err)
	}
	err = fn(db, file)
	if cerr := db.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("closing state store %s: %w", path, cerr)
	}
	return err
}

func checkSchema(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		return backend.Errorf(backend.ErrInvalid, "state store has no schema version; it was not written by berth")
	}
	v, err := strconv.Atoi(string(meta.Get(keySchema)))
	if err != nil {
		return backend.Errorf(backend.ErrInvalid, "state store schema version %q is unreadable", meta.Get(keySchema))
	}
	if v > SchemaVersion {
		return backend.Errorf(backend.ErrInvalid, "state store has schema version %d, newer than this berth's %d; upgrade berth or use another state dir", v, SchemaVersion)
	}
	return nil
}

// update runs fn in a read-write transaction; fn's error rolls it back.
func (s *store) update(fn func(tx *bolt.Tx) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.withDB(s.path, bolt.Options{}, func(db *bolt.DB) error {
		return db.Update(func(tx *bolt.Tx) error {
			if err := checkSchema(tx); err != nil {
				return err
			}
			return fn(tx)
		})
	})
}

// view runs fn in a read-only transaction.
func (s *store) view(fn func(tx *bolt.Tx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.withDB(s.path, bolt.Options{ReadOnly: true}, func(db *bolt.DB) error {
		return db.View(func(tx *bolt.Tx) error {
			if err := checkSchema(tx); err != nil {
				return err
			}
			return fn(tx)
		})
	})
}

// init creates the store if needed (buckets, schema version, owner id generated
// once) and returns the owner id. A new store is built in a temporary file and
// linked into place, so state.db, whenever it exists, is complete: concurrent
// processes never see (or delete) a half-made store. It writes only when something
// is missing. A new store takes the owner id kept in OwnerFile (a store moved aside
// keeps its sandboxes ours), and the owner id is copied there when it is not.
func (s *store) init() (string, error) {
	dir := filepath.Dir(s.path)
	for {
		var owner string
		var foreign []string
		err := s.viewIfExists(func(tx *bolt.Tx) error {
			m := tx.Bucket(bucketMeta)
			if m != nil && tx.Bucket(bucketSessions) != nil {
				owner = string(m.Get(keyOwner))
			}
			if m == nil {
				return tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
					foreign = append(foreign, strconv.Quote(string(name)))
					return nil
				})
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		if len(foreign) > 0 {
			return "", badStore(s.path, "is not berth's", fmt.Sprintf("it is a bbolt database with bucket(s) %s and no %q bucket", strings.Join(foreign, ", "), bucketMeta))
		}
		if owner == "" {
			keep, _ := readOwnerCopy(dir)
			if fileExists(s.path) {
				// A bbolt file without our buckets (or without any): complete it in place.
				owner, err = s.initIn(s.path, keep)
			} else {
				tmp := s.path + ".new-" + randomHex(8)
				if _, err := s.initIn(tmp, keep); err != nil {
					os.Remove(tmp)
					return "", err
				}
				err = os.Link(tmp, s.path)
				os.Remove(tmp)
				if err != nil && !errors.Is(err, os.ErrExist) {
					return "", fmt.Errorf("initialising state store %s: %w", s.path, err)
				}
				// Ours or a concurrent process's store is in place now: read its owner.
				continue
			}
			if err != nil {
				return "", err
			}
		}
		// The copy is a convenience for recovery: failing to write it fails nothing
		// (a damaged store's message then says that a new store means a new owner).
		writeOwnerCopy(dir, owner)
		return owner, nil
	}
}

// initIn creates the buckets, schema version and owner id in the bbolt file at path
// where they are missing, and returns the owner id. A missing owner id is keep when
// that is a valid one, a new random one otherwise.
func (s *store) initIn(path, keep string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var owner string
	err := s.withDB(path, bolt.Options{}, func(db *bolt.DB) error {
		return db.Update(func(tx *bolt.Tx) error {
			meta, err := tx.CreateBucketIfNotExists(bucketMeta)
			if err != nil {
				return err
			}
			if meta.Get(keySchema) == nil {
				if err := meta.Put(keySchema, []byte(strconv.Itoa(baseSchema))); err != nil {
					return err
				}
			}
			if err := checkSchema(tx); err != nil {
				return err
			}
			if _, err := tx.CreateBucketIfNotExists(bucketSessions); err != nil {
				return err
			}
			owner = string(meta.Get(keyOwner))
			if owner == "" {
				owner = keep
				if !generatedOwner(owner) {
					owner = randomHex(16)
				}
				return meta.Put(keyOwner, []byte(owner))
			}
			return nil
		})
	})
	if err != nil {
		if backend.KindOf(err) != nil {
			return "", err
		}
		return "", fmt.Errorf("initialising state store %s: %w", s.path, err)
	}
	return owner, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("registry: crypto/rand: " + err.Error())
	}
	return hex.EncodeToString(b)
}

// viewIfExists is view without the schema check (when the meta bucket is absent),
// and a no-op when the file is absent.
func (s *store) viewIfExists(fn func(tx *bolt.Tx) error) error {
	if _, err := os.Stat(s.path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.withDB(s.path, bolt.Options{ReadOnly: true}, func(db *bolt.DB) error {
		return db.View(func(tx *bolt.Tx) error {
			if tx.Bucket(bucketMeta) != nil {
				if err := checkSchema(tx); err != nil {
					return err
				}
			}
			return fn(tx)
		})
	})
}

func getRecord(tx *bolt.Tx, session string) (record, bool, error) {
	v := tx.Bucket(bucketSessions).Get([]byte(session))
	if v == nil {
		return record{}, false, nil
	}
	var r record
	if err := json.Unmarshal(v, &r); err != nil {
		return record{}, false, fmt.Errorf("state store: record of session %q is corrupt: %w", session, err)
	}
	return r, true, nil
}

func putRecord(tx *bolt.Tx, r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketSessions).Put([]byte(r.Session), b)
}

// ownerAndGet reads the owner id and session's record in one read transaction (a
// command on a running sandbox needs both, and nothing else of the store). owner is
// "" when the store does not exist or is not complete yet (init makes it).
func (s *store) ownerAndGet(session string) (owner string, r record, ok bool, err error) {
	err = s.viewIfExists(func(tx *bolt.Tx) error {
		m, b := tx.Bucket(bucketMeta), tx.Bucket(bucketSessions)
		if m == nil || b == nil {
			return nil
		}
		owner = string(m.Get(keyOwner))
		r, ok, err = getRecord(tx, session)
		return err
	})
	if ok {
		r = s.withLastUse(r)
	}
	return owner, r, ok, err
}

// get returns session's record, with its last use (touch) merged in. The record
// comes from the store's read cache when the store has not changed since it was
// read (see readCache); else from a read transaction, which fills the cache.
func (s *store) get(session string) (r record, ok bool, err error) {
	if r, ok, err = s.record(session); ok {
		r = s.withLastUse(r)
	}
	return r, ok, err
}

// getForCall is get for a call's first look at its session (Registry.open), whose
// LastUsed only has to be a lower bound: it decides whether idle_ttl is due, and a
// due one takes the slow path, which reads everything again under the sandbox's
// lock. When this store has touched (or read) the session's last use on the
// record's sandbox, that time stands in for the last-use file, whose read is four
// system calls per call; the file can only hold a later time. Else it reads the
// file as get does.
func (s *store) getForCall(session string) (r record, ok bool, err error) {
	if r, ok, err = s.record(session); !ok || err != nil {
		return r, ok, err
	}
	s.touchMu.Lock()
	m, seen := s.touched[session]
	s.touchMu.Unlock()
	if !seen || m.sandbox != r.Sandbox {
		return s.withLastUse(r), true, nil
	}
	if m.t.After(r.LastUsed) {
		r.LastUsed = m.t
	}
	return r, true, nil
}

// record returns session's record as the store holds it (no last-use file merged
// in): from the read cache when the store has not changed since it was read (see
// readCache), else from a read transaction, which fills the cache.
func (s *store) record(session string) (r record, ok bool, err error) {
	v, err := checkStore(s.path)
	if err != nil {
		return record{}, false, err
	}
	var hit bool
	if r, ok, hit = s.cache.lookup(v, session); !hit {
		r, ok, err = s.read(session)
	}
	return r, ok, err
}

// read reads session's record in a read transaction on the store just checked, and
// caches it under the version that transaction saw.
func (s *store) read(session string) (r record, ok bool, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	err = s.withCheckedDB(s.path, bolt.Options{ReadOnly: true}, func(db *bolt.DB, f *os.File) error {
		return db.View(func(tx *bolt.Tx) error {
			if err := checkSchema(tx); err != nil {
				return err
			}
			if r, ok, err = getRecord(tx, session); err != nil {
				return err
			}
			// The version is that of the file bbolt opened, as of this transaction:
			// no writer can commit while it runs (bbolt's flock).
			if v, err := fileVersion(f, uint64(tx.ID())); err == nil {
				s.cache.put(v, session, r, ok)
			}
			return nil
		})
	})
	return r, ok, err
}

// readCache keeps the records that a store read, by session, for as long as the
// store file stays at the version they were read at (storeVersion: the same file,
// and no write transaction committed since). A long-lived registry (berth serve, a
// library user) then reads a session's record with plain reads of the store's two
// meta pages (which the check before any open makes anyway: checkStore), rather than
// opening the store with bbolt, taking its flock and mapping it for each call, and
// still sees every write of any berth process at once: a commit changes the version
// and empties the cache. bbolt has no way to ask whether a file changed without
// opening it; the meta pages are read as storecheck.go reads them for the damage
// check.
type readCache struct {
	mu      sync.Mutex
	version storeVersion
	recs    map[string]cachedRecord
}

// cachedRecord is a session's record as read, and whether there was one.
type cachedRecord struct {
	r  record
	ok bool
}

// lookup returns session's cached record when the cache holds it for version v.
func (c *readCache) lookup(v storeVersion, session string) (r record, ok, hit bool) {
	if v == (storeVersion{}) {
		return record{}, false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.version != v {
		return record{}, false, false
	}
	e, hit := c.recs[session]
	return e.r, e.ok, hit
}

// put caches session's record as read at version v, dropping what the cache held for
// another version.
func (c *readCache) put(v storeVersion, session string, r record, ok bool) {
	if v == (storeVersion{}) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.version != v {
		c.version, c.recs = v, map[string]cachedRecord{}
	}
	c.recs[session] = cachedRecord{r, ok}
}

// put writes r, unless the stored record equals it already.
func (s *store) put(r record) error {
	if old, ok, err := s.get(r.Session); err == nil && ok && old.equal(r) {
		return nil
	}
	return s.update(func(tx *bolt.Tx) error { return putRecord(tx, r) })
}

func (r record) equal(o record) bool {
	return r.Session == o.Session && r.Driver == o.Driver && r.Sandbox == o.Sandbox && r.Scope == o.Scope &&
		r.SpecHash == o.SpecHash && r.Created.Equal(o.Created) && r.LastUsed.Equal(o.LastUsed) &&
		r.Removed.Equal(o.Removed) && r.RemovedReason == o.RemovedReason && r.Agent == o.Agent && r.Pooled == o.Pooled
}

// markRemoved sets Removed and RemovedReason on every record that points at sandbox
// on driver (and is not marked yet), and returns their sessions.
func (s *store) markRemoved(driver, sandbox string, t time.Time, reason string) ([]string, error) {
	var marked []string
	err := s.update(func(tx *bolt.Tx) error {
		marked = nil
		b := tx.Bucket(bucketSessions)
		var recs []record
		err := b.ForEach(func(k, v []byte) error {
			var r record
			if json.Unmarshal(v, &r) == nil && r.Driver == driver && r.Sandbox == sandbox && r.Removed.IsZero() {
				recs = append(recs, r)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, r := range recs {
			r.Removed, r.RemovedReason = t.UTC(), reason
			if err := putRecord(tx, r); err != nil {
				return err
			}
			marked = append(marked, r.Session)
		}
		return nil
	})
	return marked, err
}

// putIfAbsent writes r unless session r.Session already has a record; it reports
// whether it wrote.
func (s *store) putIfAbsent(r record) (bool, error) {
	wrote := false
	err := s.update(func(tx *bolt.Tx) error {
		if _, ok, err := getRecord(tx, r.Session); err != nil || ok {
			return err
		}
		wrote = true
		return putRecord(tx, r)
	})
	return wrote, err
}

// forgetSandbox deletes every record that points at sandbox on driver and returns
// their sessions.
func (s *store) forgetSandbox(driver, sandbox string) ([]string, error) {
	var gone []string
	recs, err := s.all()
	if err != nil {
		return nil, err
	}
	found := false
	for _, r := range recs {
		if r.Driver == driver && r.Sandbox == sandbox {
			found = true
		}
	}
	if !found {
		return nil, nil
	}
	err = s.update(func(tx *bolt.Tx) error {
		gone = nil
		b := tx.Bucket(bucketSessions)
		c := b.Cursor()
		var keys [][]byte
		for k, v := c.First(); k != nil; k, v = c.Next() {
			var r record
			if json.Unmarshal(v, &r) == nil && r.Driver == driver && r.Sandbox == sandbox {
				keys = append(keys, append([]byte(nil), k...))
				gone = append(gone, r.Session)
			}
		}
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		s.forgetLastUse(gone)
	}
	return gone, err
}

// touch records t as session's last use of sandbox. It is not a store transaction:
// the time goes to a small file of its own (lastUsePath), written without fsync, so
// that a call's end costs no synchronous disk write. The last touch wins (a clock set
// back moves it back, as it moved the record's LastUsed before). After a crash of the
// machine the file may hold an older time, or be gone: then the record's LastUsed
// counts, which a call that created or changed the record wrote durably (and touched
// too). get and all merge it in.
//
// A touch less than touchCoalesce after the last touch of the session on the same
// sandbox that this store made or read (withLastUse) is skipped (a clock set back
// writes at once).
func (s *store) touch(session, sandbox string, t time.Time) error {
	s.touchMu.Lock()
	m, seen := s.touched[session]
	made := s.lastUseMade
	s.touchMu.Unlock()
	if seen && m.sandbox == sandbox && !t.Before(m.t) && t.Sub(m.t) < touchCoalesce {
		return nil
	}
	path := s.lastUsePath(session)
	if !made {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return err
		}
	}
	tmp := path + ".tmp-" + randomHex(4)
	data := []byte(sandbox + " " + t.UTC().Format(time.RFC3339Nano) + "\n")
	err := os.WriteFile(tmp, data, 0o600)
	if err != nil && made && errors.Is(err, fs.ErrNotExist) {
		// The directory went away (removed by hand): make it again.
		if err = os.MkdirAll(filepath.Dir(path), 0o700); err == nil {
			err = os.WriteFile(tmp, data, 0o600)
		}
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	s.touchMu.Lock()
	s.touched[session] = touchMark{sandbox, t}
	s.lastUseMade = true
	s.touchMu.Unlock()
	return nil
}

// lastUseDir is STATE/lastuse, where touch keeps each session's last use.
func (s *store) lastUseDir() string { return filepath.Join(filepath.Dir(s.path), "lastuse") }

// lastUsePath is session's last-use file: lastUseDir/HASH, HASH 32 hex digits of
// sha256(session) (a session name is never used raw as a path).
func (s *store) lastUsePath(session string) string {
	sum := sha256.Sum256([]byte(session))
	return filepath.Join(s.lastUseDir(), hex.EncodeToString(sum[:16]))
}

// withLastUse returns r with LastUsed set to the time its last-use file holds for r's
// sandbox. A missing or damaged file (a machine crash before it reached the disk), or
// one about another sandbox, changes nothing.
//
// The time read counts as a touch this store knows of, so that touch coalesces with
// it: a berth command run in a loop (one process per call) rewrites the file at most
// once a second, as a long-lived registry does.
func (s *store) withLastUse(r record) record {
	b, err := os.ReadFile(s.lastUsePath(r.Session))
	if err != nil || len(b) > 256 {
		return r
	}
	sb, ts, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
	if !ok || sb != r.Sandbox {
		return r
	}
	if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
		r.LastUsed = t
		s.touchMu.Lock()
		if m, seen := s.touched[r.Session]; !seen || m.sandbox != sb || m.t.Before(t) {
			s.touched[r.Session] = touchMark{sb, t}
		}
		s.lastUseMade = true
		s.touchMu.Unlock()
	}
	return r
}

// forgetLastUse deletes the last-use files of sessions.
func (s *store) forgetLastUse(sessions []string) {
	for _, session := range sessions {
		s.touchMu.Lock()
		delete(s.touched, session)
		s.touchMu.Unlock()
		os.Remove(s.lastUsePath(session))
	}
}

// all returns every record, sorted by session.
func (s *store) all() ([]record, error) {
	var out []record
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSessions).ForEach(func(k, v []byte) error {
			var r record
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("state store: record of session %q is corrupt: %w", k, err)
			}
			out = append(out, s.withLastUse(r))
			return nil
		})
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Session < out[j].Session })
	return out, err
}
