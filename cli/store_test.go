package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestDamagedStore: with a damaged state.db (truncated, empty, garbage, or a bbolt
// file that is not berth's), exec and sessions print one line that names the file
// and what to do, and exit 125: no SIGBUS, no goroutine dump. Moved aside, the store
// is rebuilt with the same owner id, and the session's sandbox, files intact, is
// adopted again.
func TestDamagedStore(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must("exec", "--", "sh", "-c", "echo kept > f")
	store := filepath.Join(e.state, "state.db")
	good, err := os.ReadFile(store)
	if err != nil {
		t.Fatal(err)
	}
	owner, err := os.ReadFile(filepath.Join(e.state, "owner"))
	if err != nil {
		t.Fatalf("no owner copy: %v", err)
	}
	other := filepath.Join(e.dir, "other.db")
	db, err := bolt.Open(other, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("widgets")); return err })
	db.Close()
	otherBytes, err := os.ReadFile(other)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, want string
		data       []byte
	}{
		{"truncated", "is damaged: it is truncated (", good[:len(good)/3]},
		{"zero-length", "is damaged: it is empty (0 bytes)", nil},
		{"garbage", "is damaged: it is not a bbolt database", []byte(strings.Repeat("berth? no.\n", 2000))},
		{"other-bbolt-file", `is not berth's: it is a bbolt database with bucket(s) "widgets"`, otherBytes},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := e.with(t)
			if err := os.WriteFile(store, c.data, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"exec", "--", "true"}, {"sessions"}} {
				r := e.run(args...)
				if r.code != 125 {
					t.Errorf("berth %q: want exit 125\n%v", args, r)
				}
				lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
				if len(lines) != 1 || !strings.HasPrefix(lines[0], "berth: state store "+store+" "+c.want) ||
					!strings.Contains(lines[0], "move it aside (mv "+store+" "+store+".damaged)") ||
					!strings.Contains(lines[0], "keeps this state dir's owner id "+strings.TrimSpace(string(owner))) {
					t.Errorf("berth %q: want one line naming the store, its damage %q and what to do\n%v", args, c.want, r)
				}
				if r.stdout != "" {
					t.Errorf("berth %q: want nothing on stdout\n%v", args, r)
				}
			}
			if b, _ := os.ReadFile(store); string(b) != string(c.data) {
				t.Errorf("berth changed the damaged store")
			}
		})
	}
	// Moved aside as the message says: a new store, the same owner, the same sandbox.
	if err := os.Rename(store, store+".damaged"); err != nil {
		t.Fatal(err)
	}
	if r := e.must("exec", "--", "cat", "f"); r.stdout != "kept\n" {
		t.Errorf("after moving the store aside: %v", r)
	}
	if rows := e.sessions(); len(rows) != 1 || rows[0].Session != "main" {
		t.Errorf("sessions after moving the store aside: %+v", rows)
	}
}
