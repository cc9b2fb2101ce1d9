package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

// The audit log is bounded: past its size it is rotated, and only keep rotated files
// stay, each of mode 0600 and each no larger than the limit.
func TestAuditRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, apiv1.AuditFile)
	if err := OpenAudit(path); err != nil {
		t.Fatal(err)
	}
	s := &Server{}
	WithAudit(path, 1, 2)(s)
	defer s.audit.close()
	e := &apiv1.AuditEntry{Method: "POST", Route: "/v1/sessions/{name}/exec", Path: "/v1/sessions/" + strings.Repeat("x", 4000) + "/exec"}
	const lines = 1200 // about 4.9 MB: four rotations
	for i := 0; i < lines; i++ {
		if err := s.audit.write(e); err != nil {
			t.Fatal(err)
		}
	}
	files := func() []string {
		m, _ := filepath.Glob(filepath.Join(dir, "audit*.log"))
		return m
	}
	testwait.Until(t, "the rotated files beyond 2 to be deleted", func() bool { return len(files()) == 3 })
	for _, f := range files() {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 || st.Size() > 1<<20 {
			t.Errorf("%s: mode %v, %d bytes (limit 1 MiB)", f, st.Mode(), st.Size())
		}
	}
}

// An audit log that others may read is refused, naming the fix; so is a link.
func TestOpenAuditRefuses(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open.log")
	os.WriteFile(open, nil, 0o644)
	if err := OpenAudit(open); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("mode 0644: %v", err)
	}
	link := filepath.Join(dir, "link.log")
	os.Symlink(open, link)
	if err := OpenAudit(link); err == nil {
		t.Errorf("a symlink was accepted")
	}
}

// A crashed driver's error is kind driver_crashed (503) and says whether the call
// was retried.
func TestDriverCrashedKind(t *testing.T) {
	for _, retried := range []bool{false, true} {
		err := fmt.Errorf("session %q: %w", "a", &registry.DriverCrashedError{Driver: "local", Op: "create sandbox x", Retried: retried, Err: backend.Errorf(backend.ErrUnavailable, "gone")})
		info := errorInfo(err, "a")
		if info.Kind != apiv1.KindDriverCrashed || statusOf(info.Kind) != 503 || info.Retried == nil || *info.Retried != retried || !errors.Is(err, backend.ErrUnavailable) {
			t.Errorf("retried=%v: %+v", retried, info)
		}
	}
}
