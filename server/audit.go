package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/berth-sh/berth/server/apiv1"
	"golang.org/x/sys/unix"
	"gopkg.in/natefinch/lumberjack.v2"
)

// auditLog writes AuditEntry lines to a size-rotated file (lumberjack: the file is
// renamed to NAME-TIMESTAMP.log when it would pass its size, and the oldest beyond
// keep are deleted).
type auditLog struct {
	mu sync.Mutex
	lj *lumberjack.Logger
}

// WithAudit makes the server write an audit log of its calls (every call but GET
// /metrics) to path as JSON lines (AuditEntry), rotated when it reaches maxMB MiB,
// keeping keep rotated files (0: DefaultAuditKeep; rotated files are NAME-TIME.log
// beside it). The file is created with mode 0600. An empty path writes none.
func WithAudit(path string, maxMB, keep int) Option {
	return func(s *Server) {
		if path == "" {
			return
		}
		if maxMB <= 0 {
			maxMB = apiv1.DefaultAuditMaxMB
		}
		if keep <= 0 {
			keep = apiv1.DefaultAuditKeep
		}
		s.audit = &auditLog{lj: &lumberjack.Logger{Filename: path, MaxSize: maxMB, MaxBackups: keep, LocalTime: false}}
	}
}

// OpenAudit checks that the audit log at path can be written, creating it (mode
// 0600, and its directory 0700) when missing; an existing file of a mode that lets
// others read it is refused, naming the fix. berth serve calls it before it serves.
func OpenAudit(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("audit log %s: %v", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("audit log %s: %v", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("audit log %s: %v", path, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("audit log %s is not a regular file", path)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("audit log %s: mode %04o lets others read it; chmod 600 %s", path, st.Mode().Perm(), path)
	}
	return nil
}

// write appends e as one JSON line; a failure is logged by the caller.
func (a *auditLog) write(e *apiv1.AuditEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	_, err = a.lj.Write(append(b, '\n'))
	return err
}

func (a *auditLog) close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lj.Close()
}

// auditKey is the context key of a call's *AuditEntry.
type auditKey struct{}

// auditOf returns r's audit entry, for a handler to add to; nil without an audit log.
func auditOf(r *http.Request) *apiv1.AuditEntry {
	e, _ := r.Context().Value(auditKey{}).(*apiv1.AuditEntry)
	return e
}

// auditCommand records an exec's command (never its text) in r's audit entry.
func auditCommand(r *http.Request, c *execCall) {
	e := auditOf(r)
	if e == nil {
		return
	}
	text := c.command
	if !c.shell {
		text = strings.Join(c.argv, "\x00")
	}
	sum := sha256.Sum256([]byte(text))
	n := len(text)
	e.CommandBytes, e.CommandSHA256 = &n, hex.EncodeToString(sum[:])
}

// auditResult records an exec's exit code in r's audit entry.
func auditResult(r *http.Request, res apiv1.ExecResult, err error) {
	if e := auditOf(r); e != nil && err == nil {
		code := res.ExitCode
		e.ExitCode = &code
	}
}

// auditError records the kind of the error r was answered with.
func auditError(r *http.Request, kind string) {
	if e := auditOf(r); e != nil {
		e.ErrorKind = kind
	}
}

// peerKey is the context key of a unix connection's peer credentials.
type peerKey struct{}

// connContext is the http.Server's ConnContext: it reads a unix socket peer's
// credentials (SO_PEERCRED) once per connection.
func connContext(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) {
		cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cred == nil {
		return ctx
	}
	return context.WithValue(ctx, peerKey{}, *cred)
}

// callerOf says who sent r.
func callerOf(r *http.Request) apiv1.Caller {
	if cred, ok := r.Context().Value(peerKey{}).(unix.Ucred); ok {
		return apiv1.Caller{UID: &cred.Uid, GID: &cred.Gid, PID: &cred.Pid}
	}
	return apiv1.Caller{Addr: r.RemoteAddr}
}

// startAudit returns r with a new audit entry in its context, or r unchanged (and
// nil) when there is no audit log or r is a metrics scrape.
func (s *Server) startAudit(r *http.Request, start time.Time) (*http.Request, *apiv1.AuditEntry) {
	if s.audit == nil || r.URL.Path == "/metrics" {
		return r, nil
	}
	e := &apiv1.AuditEntry{Time: start.UTC(), Caller: callerOf(r), Method: r.Method, Path: r.URL.EscapedPath()}
	return r.WithContext(context.WithValue(r.Context(), auditKey{}, e)), e
}

// endAudit completes e, once r's answer has ended with status, and writes it.
func (s *Server) endAudit(r *http.Request, e *apiv1.AuditEntry, status int, start time.Time) {
	if e == nil {
		return
	}
	e.Route, e.Session, e.Status = r.Pattern, r.PathValue("name"), status
	if e.Route == "/" {
		e.Route = "" // no route serves the path
	}
	e.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	if err := s.audit.write(e); err != nil {
		s.log.Error("writing the audit log", "error", err)
	}
}
