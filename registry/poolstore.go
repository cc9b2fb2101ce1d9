package registry

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-sh/berth/backend"
)

// poolEntry is one warm pool member in the store's "pool" bucket (JSON under
// DRIVER NUL SANDBOX). It is written before the member is created, so that a crash
// leaves nothing that the store does not know of; Ready is set once its agent has
// answered. The transaction that hands it to a session writes the session's record
// and deletes the entry (poolTake). Claimed (with Session) marks an entry that a
// berth before that handed out in two transactions (claim, then record): such an
// entry is deleted once a record names its member, or the member is removed.
type poolEntry struct {
	Driver  string             `json:"driver"`
	Sandbox string             `json:"sandbox"`
	ID      string             `json:"id"`
	Scope   string             `json:"scope"`
	Hash    string             `json:"hash"`
	Agent   backend.AgentReach `json:"agent,omitempty"`
	Created time.Time          `json:"created"`
	Ready   time.Time          `json:"ready,omitzero"`
	Claimed time.Time          `json:"claimed,omitzero"`
	Session string             `json:"session,omitempty"`
	// Maker is the id of the registry that reserved the entry (makerID): while it
	// lives it holds the flock of makerLockPath(Maker), so another filler can tell
	// at once that an entry still being made was left by a berth that died.
	Maker string `json:"maker,omitempty"`
}

func poolKey(driver, sandbox string) []byte { return []byte(driver + "\x00" + sandbox) }

// samePool reports whether e and o are members of one pool: one rule's driver, scope and pool hash.
func (e poolEntry) samePool(o poolEntry) bool {
	return e.Driver == o.Driver && e.Scope == o.Scope && e.Hash == o.Hash
}

// poolBucket returns the pool bucket, creating it (and raising the schema version
// to 2) when create is set; nil when it does not exist and create is not set.
func poolBucket(tx *bolt.Tx, create bool) (*bolt.Bucket, error) {
	if b := tx.Bucket(bucketPool); b != nil || !create {
		return b, nil
	}
	meta := tx.Bucket(bucketMeta)
	if v, _ := strconv.Atoi(string(meta.Get(keySchema))); v < 2 {
		if err := meta.Put(keySchema, []byte("2")); err != nil {
			return nil, err
		}
	}
	return tx.CreateBucket(bucketPool)
}

func eachPool(b *bolt.Bucket, fn func(e poolEntry) error) error {
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		var e poolEntry
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("state store: pool entry %q is corrupt: %w", k, err)
		}
		return fn(e)
	})
}

func putPool(b *bolt.Bucket, e poolEntry) error {
	v, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return b.Put(poolKey(e.Driver, e.Sandbox), v)
}

// poolAll returns every pool entry, sorted by driver and sandbox.
func (s *store) poolAll() ([]poolEntry, error) {
	var out []poolEntry
	err := s.viewIfExists(func(tx *bolt.Tx) error {
		return eachPool(tx.Bucket(bucketPool), func(e poolEntry) error {
			out = append(out, e)
			return nil
		})
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].Driver != out[j].Driver {
			return out[i].Driver < out[j].Driver
		}
		return out[i].Sandbox < out[j].Sandbox
	})
	return out, err
}

// poolReserve writes e (a member about to be created) when e's pool holds fewer than
// size unclaimed entries (ready or being created); it reports whether it wrote. The
// count and the write are one transaction, so concurrent fillers, in any process,
// never make a pool larger than its size.
func (s *store) poolReserve(e poolEntry, size int) (bool, error) {
	wrote := false
	err := s.update(func(tx *bolt.Tx) error {
		wrote = false
		b, err := poolBucket(tx, true)
		if err != nil {
			return err
		}
		n := 0
		if err := eachPool(b, func(o poolEntry) error {
			if o.samePool(e) && o.Claimed.IsZero() {
				n++
			}
			return nil
		}); err != nil {
			return err
		}
		if n >= size {
			return nil
		}
		wrote = true
		return putPool(b, e)
	})
	return wrote, err
}

// poolReady marks the unclaimed entry of sandbox on driver ready at t, with the
// way its agent is reached; false when there is no such entry any more (drained
// meanwhile: the caller removes the member).
func (s *store) poolReady(driver, sandbox string, agent backend.AgentReach, t time.Time) (bool, error) {
	ok := false
	err := s.update(func(tx *bolt.Tx) error {
		b, e, found, err := getPool(tx, driver, sandbox)
		ok = false
		if err != nil || !found || !e.Claimed.IsZero() {
			return err
		}
		e.Ready, e.Agent, ok = t.UTC(), agent, true
		return putPool(b, e)
	})
	return ok, err
}

// getPool reads the entry of sandbox on driver in tx: its bucket, the entry, and
// whether there is one.
func getPool(tx *bolt.Tx, driver, sandbox string) (*bolt.Bucket, poolEntry, bool, error) {
	var e poolEntry
	b := tx.Bucket(bucketPool)
	if b == nil {
		return nil, e, false, nil
	}
	v := b.Get(poolKey(driver, sandbox))
	if v == nil {
		return b, e, false, nil
	}
	if err := json.Unmarshal(v, &e); err != nil {
		return b, e, false, fmt.Errorf("state store: pool entry of %s is corrupt: %w", sandbox, err)
	}
	return b, e, true, nil
}

// poolCandidate returns the oldest ready, unclaimed member of the pool (driver,
// scope, hash) that skip does not name, in a read transaction; ok is false when the
// pool has none (a miss). It claims nothing: poolTake does, once the caller holds the
// member's lock and has its agent.
func (s *store) poolCandidate(driver, scope, hash string, skip map[string]bool) (poolEntry, bool, error) {
	var got poolEntry
	ok := false
	err := s.viewIfExists(func(tx *bolt.Tx) error {
		want := poolEntry{Driver: driver, Scope: scope, Hash: hash}
		return eachPool(tx.Bucket(bucketPool), func(e poolEntry) error {
			if e.samePool(want) && e.Claimed.IsZero() && !e.Ready.IsZero() && !skip[e.Sandbox] && (!ok || e.Ready.Before(got.Ready)) {
				got, ok = e, true
			}
			return nil
		})
	})
	return got, ok, err
}

// poolTake hands the member e to the session of rec, in one transaction: when e's
// entry is still there, ready and unclaimed, it writes rec (which names the member)
// and deletes the entry. took is false when the entry had been taken, drained or
// removed meanwhile: two claims, in any processes, never get the same member.
func (s *store) poolTake(e poolEntry, rec record) (took bool, err error) {
	err = s.update(func(tx *bolt.Tx) error {
		took = false
		b, cur, found, err := getPool(tx, e.Driver, e.Sandbox)
		if err != nil || !found || !cur.Claimed.IsZero() || cur.Ready.IsZero() || !cur.samePool(e) {
			return err
		}
		if err := putRecord(tx, rec); err != nil {
			return err
		}
		took = true
		return b.Delete(poolKey(e.Driver, e.Sandbox))
	})
	return took, err
}

// poolUntake undoes a poolTake whose call failed before it started anything: when
// session's record still names sandbox on driver, it becomes prev again (nil: the
// session had no record, and has none). The member's entry stays deleted: a member
// is never handed to a second session.
func (s *store) poolUntake(session, driver, sandbox string, prev *record) error {
	return s.update(func(tx *bolt.Tx) error {
		cur, ok, err := getRecord(tx, session)
		if err != nil || !ok || cur.Driver != driver || cur.Sandbox != sandbox {
			return err
		}
		if prev != nil {
			return putRecord(tx, *prev)
		}
		return tx.Bucket(bucketSessions).Delete([]byte(session))
	})
}

// poolDrop deletes the entry of sandbox on driver and returns it; with unclaimed set
// only when it is not claimed. ok says whether it deleted: the caller that deleted
// an entry is the one that removes the member.
func (s *store) poolDrop(driver, sandbox string, unclaimed bool) (poolEntry, bool, error) {
	var e poolEntry
	ok := false
	err := s.update(func(tx *bolt.Tx) error {
		var b *bolt.Bucket
		var found bool
		var err error
		b, e, found, err = getPool(tx, driver, sandbox)
		ok = false
		if err != nil || !found || (unclaimed && !e.Claimed.IsZero()) {
			return err
		}
		ok = true
		return b.Delete(poolKey(driver, sandbox))
	})
	return e, ok, err
}
