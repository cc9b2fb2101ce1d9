package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/agent/internal/agentpb"
	"github.com/berth-sh/berth/backend"
)

// maxDrain bounds the output read after the leader's exit before the result is
// sent, so a background child that writes without pause cannot hold the result back.
const maxDrain = 1 << 20

// defaultPath is the PATH used to find argv[0] when the exec's environment has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// past is a deadline that has expired.
var past = time.Unix(1, 0)

// execRun is one exec on the agent side.
type execRun struct {
	id        uint64
	pid       int
	marker    string // execMarkerVar=INSTANCE.ID in the exec's environment (tree.go)
	tty       bool
	wantStdin bool
	master    *os.File // TTY master: all output and all input; nil without TTY
	stdinW    *os.File // write end of the stdin pipe; nil with TTY or without stdin
	outs      []*outReader

	// stdinClosed is touched only by the goroutine that receives input.
	stdinClosed bool

	cancelCh   chan struct{}
	cancelOnce sync.Once
}

func (e *execRun) cancel() { e.cancelOnce.Do(func() { close(e.cancelCh) }) }

// execFailure is a command that could not be run: 127 (not found) or 126.
type execFailure struct {
	code   int
	reason string
}

// execPlan is a checked ExecStart.
type execPlan struct {
	name string
	path string
	argv []string
	env  []string
	dir  string
	cred *syscall.Credential
	fail *execFailure
}

// execSender serialises Send on an Exec stream and refuses sends once the handler
// is done with the stream.
type execSender struct {
	mu     sync.Mutex
	stream agentpb.Agent_ExecServer
	closed bool
}

var errStreamDone = errors.New("exec stream done")

func (s *execSender) send(m *agentpb.ExecOutput) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errStreamDone
	}
	return s.stream.Send(m)
}

func (s *execSender) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// outReader forwards one output stream (stdout, stderr or a TTY master) until the
// leader's exit, then discards the rest until EOF.
type outReader struct {
	f       *os.File
	stderr  bool
	snd     *execSender
	forward atomic.Bool
	drained chan struct{} // closed once the forwarding phase is over
}

func newOutReader(f *os.File, stderr bool, snd *execSender) *outReader {
	o := &outReader{f: f, stderr: stderr, snd: snd, drained: make(chan struct{})}
	o.forward.Store(true)
	return o
}

func (o *outReader) emit(b []byte) {
	if !o.forward.Load() {
		return
	}
	c := make([]byte, len(b))
	copy(c, b)
	m := &agentpb.ExecOutput{Msg: &agentpb.ExecOutput_Stdout{Stdout: c}}
	if o.stderr {
		m = &agentpb.ExecOutput{Msg: &agentpb.ExecOutput_Stderr{Stderr: c}}
	}
	if err := o.snd.send(m); err != nil {
		o.forward.Store(false)
	}
}

// readBufs holds the ChunkSize buffers that outReaders read into: two per exec
// would otherwise be 64 KiB of garbage per exec, a collection every few dozen
// execs (measured: 5 % of the agent's CPU per exec of `true`).
var readBufs = sync.Pool{New: func() any { b := make([]byte, ChunkSize); return &b }}

// run reads until EOF. A read deadline in the past is the handler's signal that the
// leader has exited: run then reads what is already in the pipe with non-blocking
// reads, closes drained, and keeps reading into nowhere.
func (o *outReader) run() {
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := *bp
	finished := false
	finish := func() {
		if !finished {
			finished = true
			o.forward.Store(false)
			close(o.drained)
		}
	}
	defer func() {
		finish()
		o.f.Close()
	}()
	for {
		n, err := o.f.Read(buf)
		if n > 0 {
			o.emit(buf[:n])
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if !finished {
				eof := o.drainRaw(buf)
				finish()
				if eof {
					return
				}
			}
			o.f.SetReadDeadline(time.Time{})
			continue
		}
		// io.EOF, EIO from a TTY master whose slave side is closed, or closed.
		return
	}
}

// drainRaw reads with non-blocking reads until the pipe is empty (EAGAIN), at EOF, or
// maxDrain bytes have been read. It reports whether the stream has ended.
func (o *outReader) drainRaw(buf []byte) (ended bool) { return drainNonBlocking(o.f, buf, o.emit) }

// drainNonBlocking reads f with non-blocking reads, passing what it reads to emit,
// until f is empty (EAGAIN), at EOF, or maxDrain bytes have been read. It reports
// whether the stream has ended.
func drainNonBlocking(f *os.File, buf []byte, emit func([]byte)) (ended bool) {
	rc, err := f.SyscallConn()
	if err != nil {
		return true
	}
	for total := 0; total < maxDrain; {
		var n int
		var rerr error
		cerr := rc.Control(func(fd uintptr) {
			for {
				n, rerr = unix.Read(int(fd), buf)
				if rerr != unix.EINTR {
					return
				}
			}
		})
		if cerr != nil {
			return true
		}
		if n > 0 {
			emit(buf[:n])
			total += n
			continue
		}
		if rerr == nil {
			return true // EOF
		}
		return rerr != unix.EAGAIN // EIO: TTY slave side closed
	}
	return false
}

// Exec implements the Exec RPC; see agent.proto.
func (s *server) Exec(stream agentpb.Agent_ExecServer) error {
	in, err := stream.Recv()
	if err != nil {
		return err
	}
	st := in.GetStart()
	if st == nil {
		return backend.Errorf(backend.ErrInvalid, "exec: the first message must be start")
	}
	if s.closing.Load() {
		return backend.Errorf(backend.ErrUnavailable, "the agent is shutting down")
	}
	return s.runExec(stream, st, nil)
}

// Shell implements the Shell RPC: the call starts from its session's last recorded
// state, runs through the shell wrapper, and records the state the wrapper reported;
// calls of one session run side by side (shells.snapshot), none waits for another.
func (s *server) Shell(stream agentpb.Agent_ShellServer) error {
	in, err := stream.Recv()
	if err != nil {
		return err
	}
	sh := in.GetShell()
	if sh == nil {
		return backend.Errorf(backend.ErrInvalid, "shell: the first message must be shell")
	}
	if sh.Session == "" || sh.Command == "" {
		return backend.Errorf(backend.ErrInvalid, "shell: a command and a session are required")
	}
	if s.closing.Load() {
		return backend.Errorf(backend.ErrUnavailable, "the agent is shutting down")
	}
	k, state := s.shells.snapshot(sh.Session)
	st, sf, err := s.shellStart(sh, state)
	if err != nil {
		return err
	}
	return s.runExec(stream, st, &shellCall{key: k, session: sh.Session, file: sf, start: state})
}

// shellCall is what runExec needs of a shell-mode call: its session's entry, the
// session's name, the call's state file and the state it started from.
type shellCall struct {
	key     *shellKey
	session string
	file    *shellFile
	start   shellState
}

// runExec runs st on stream: prepare, spawn, forward input and output until the
// leader exits (or the timeout, a cancel or the client's departure kills the tree),
// then send the result. sh is set for shell-mode calls.
func (s *server) runExec(stream agentpb.Agent_ExecServer, st *agentpb.ExecStart, sh *shellCall) error {
	if st.User == "" {
		st.User = s.execUser
	}
	plan, err := s.prepare(st)
	if err != nil {
		return err
	}
	if sh != nil && plan.fail == nil {
		if err := sh.file.create(plan.cred); err != nil {
			return backend.Errorf(backend.ErrUnavailable, "shell mode: state file: %w", err)
		}
		defer sh.file.remove() // on every other way out too
	}
	snd := &execSender{stream: stream}
	defer snd.close()
	id := s.nextID.Add(1)
	if plan.fail != nil {
		return s.sendFailure(snd, id, plan.name, plan.fail)
	}
	oomBefore := s.oom.count()
	startTime := time.Now()
	run, exitCh, fail, err := s.spawn(plan, st, snd, s.treeMarker(execMarkerVar, id))
	if err != nil {
		return err
	}
	if fail != nil {
		return s.sendFailure(snd, id, plan.name, fail)
	}
	run.id = id
	s.track(run)
	defer s.untrack(id)

	ctx := stream.Context()
	started := snd.send(&agentpb.ExecOutput{Msg: &agentpb.ExecOutput_Started{Started: &agentpb.ExecStarted{ExecId: id, Pid: int32(run.pid)}}})
	for _, o := range run.outs {
		go o.run()
	}
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		run.receive(stream)
	}()
	ex, end := s.awaitLeader(ctx, run, exitCh, started != nil, time.Duration(st.TimeoutNs))
	if end == endGone {
		for _, o := range run.outs {
			o.forward.Store(false)
			o.f.SetReadDeadline(past)
		}
		run.stopStdin()
		s.log.Printf("exec %d (%s, pid %d): client gone, process tree killed", id, plan.name, run.pid)
		<-recvDone
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return backend.Errorf(backend.ErrUnavailable, "exec stream broken")
	}
	for _, o := range run.outs {
		o.f.SetReadDeadline(past)
	}
	for _, o := range run.outs {
		select {
		case <-o.drained:
		case <-ctx.Done():
		}
	}
	code, sig := exitCode(ex.status)
	res := &agentpb.ExecResult{
		ExitCode:   int32(code),
		Signal:     int32(sig),
		TimedOut:   end == endTimeout,
		Canceled:   end == endCanceled,
		OomKilled:  s.oom.grew(oomBefore),
		DurationNs: int64(ex.at.Sub(startTime)),
	}
	if sh != nil {
		res.Cwd = s.recordShell(id, sh, end == endExited)
	}
	err = snd.send(&agentpb.ExecOutput{Msg: &agentpb.ExecOutput_Result{Result: res}})
	run.stopStdin()
	if err != nil {
		<-recvDone
		return err
	}
	// The client closes its side when it has the result; do not wait long for a client
	// that does not.
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case <-recvDone:
	case <-t.C:
	}
	return nil
}

// execEnd is how an exec's wait for its leader ended.
type execEnd int

const (
	endExited   execEnd = iota // the leader exited by itself
	endTimeout                 // the exec's timeout passed; the tree was killed
	endCanceled                // Cancel; the tree was killed
	endGone                    // the client went away; the tree was killed
)

// awaitLeader waits for run's leader to exit, or for its timeout, a Cancel or the
// client's departure (gone: the started message could not be sent), which kill the
// tree first; it returns the leader's exit and how the wait ended.
func (s *server) awaitLeader(ctx context.Context, run *execRun, exitCh <-chan exitInfo, gone bool, timeout time.Duration) (exitInfo, execEnd) {
	if gone {
		s.killTree(s.treeOf(run.pid, run.marker), s.grace)
		return <-exitCh, endGone
	}
	var timeoutC <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timeoutC = t.C
	}
	end := endExited
	select {
	case ex := <-exitCh:
		return ex, endExited
	case <-timeoutC:
		end = endTimeout
	case <-run.cancelCh:
		end = endCanceled
	case <-ctx.Done():
		end = endGone
	}
	s.killTree(s.treeOf(run.pid, run.marker), s.grace)
	return <-exitCh, end
}

// recordShell records the state that a shell call's wrapper reported, when the call
// ended by itself (a call killed at its timeout or on cancel records nothing,
// whatever its shell's traps managed to write: the next call starts from the last
// state of a call that ended by itself), and returns the directory the call left
// (the session's recorded one when it recorded nothing). Calls of one session that
// end one after another record in that order: the last wins.
func (s *server) recordShell(id uint64, sh *shellCall, ended bool) string {
	ns, ok := sh.file.read()
	sh.file.remove() // before the result: a call leaves no file behind once it has its answer
	if !ok || !ended {
		return sh.key.current().cwd
	}
	if !utf8.ValidString(ns.cwd) {
		// The wire carries text: a directory whose name is not UTF-8 cannot be
		// reported, so the session stays where the call started.
		ns.cwd = sh.start.cwd
	}
	if err := s.shells.save(sh.key, sh.session, ns); err != nil {
		s.log.Printf("exec %d: recording the shell state of %q: %v", id, sh.session, err)
	}
	return ns.cwd
}

// track registers a running exec for Cancel and, when the agent remembers session
// ids, for Shutdown.
func (s *server) track(run *execRun) {
	s.mu.Lock()
	s.execs[run.id] = run
	if s.trackSessions {
		s.sids[run.pid] = struct{}{}
	}
	prune := len(s.sids) >= sidPruneAt
	s.mu.Unlock()
	if prune && s.pruning.CompareAndSwap(false, true) {
		go s.pruneSessions()
	}
}

func (s *server) untrack(id uint64) {
	s.mu.Lock()
	delete(s.execs, id)
	s.mu.Unlock()
}

// sendFailure answers an exec whose command could not be run: started without a pid,
// the reason on stderr, and the result 127 or 126.
func (s *server) sendFailure(snd *execSender, id uint64, name string, f *execFailure) error {
	msgs := []*agentpb.ExecOutput{
		{Msg: &agentpb.ExecOutput_Started{Started: &agentpb.ExecStarted{ExecId: id}}},
		{Msg: &agentpb.ExecOutput_Stderr{Stderr: []byte(fmt.Sprintf("berth: %s: %s\n", name, f.reason))}},
		{Msg: &agentpb.ExecOutput_Result{Result: &agentpb.ExecResult{ExitCode: int32(f.code)}}},
	}
	for _, m := range msgs {
		if err := snd.send(m); err != nil {
			return err
		}
	}
	return nil
}

// receive applies the client's input messages in order until the stream ends.
func (e *execRun) receive(stream agentpb.Agent_ExecServer) {
	defer e.closeStdin()
	for {
		m, err := stream.Recv()
		if err != nil {
			return
		}
		switch x := m.Msg.(type) {
		case *agentpb.ExecInput_Stdin:
			e.writeStdin(x.Stdin)
		case *agentpb.ExecInput_CloseStdin:
			e.closeStdin()
		case *agentpb.ExecInput_Resize:
			if e.master != nil && x.Resize != nil {
				setWinsize(e.master, x.Resize.Rows, x.Resize.Cols)
			}
		case *agentpb.ExecInput_Signal:
			if x.Signal > 0 && x.Signal < 65 {
				// The leader's process group; its id stays reserved while the group
				// exists, so this never hits another group.
				unix.Kill(-e.pid, unix.Signal(x.Signal))
			}
		}
	}
}

func (e *execRun) stdinFile() *os.File {
	if e.tty {
		return e.master
	}
	return e.stdinW
}

func (e *execRun) writeStdin(b []byte) {
	if e.stdinClosed || !e.wantStdin {
		return
	}
	f := e.stdinFile()
	if f == nil {
		return
	}
	if _, err := f.Write(b); err != nil {
		// The process closed its stdin, or the exec is over: drop the rest.
		e.closeStdin()
	}
}

// closeStdin gives the process EOF on stdin: closes the pipe, or for a TTY writes the
// end-of-file character (^D), which a terminal in canonical mode turns into EOF.
func (e *execRun) closeStdin() {
	if e.stdinClosed {
		return
	}
	e.stdinClosed = true
	if e.tty {
		if e.master != nil && e.wantStdin {
			e.master.Write([]byte{4})
		}
		return
	}
	if e.stdinW != nil {
		e.stdinW.Close()
	}
}

// stopStdin makes pending and later writes to the process's stdin fail at once.
func (e *execRun) stopStdin() {
	if f := e.stdinFile(); f != nil {
		f.SetWriteDeadline(past)
	}
}

func exitCode(ws syscall.WaitStatus) (code, sig int) {
	switch {
	case ws.Exited():
		return ws.ExitStatus(), 0
	case ws.Signaled():
		return 128 + int(ws.Signal()), int(ws.Signal())
	}
	return 255, 0
}

// prepare checks an ExecStart: argv, environment, working directory, user, and finds
// the executable. Errors are gRPC statuses; a command that cannot be found or run is
// plan.fail, not an error.
func (s *server) prepare(st *agentpb.ExecStart) (*execPlan, error) {
	if len(st.Argv) == 0 || st.Argv[0] == "" {
		return nil, backend.Errorf(backend.ErrInvalid, "exec: empty argv")
	}
	env, err := mergeEnv(os.Environ(), st.Env)
	if err != nil {
		return nil, backend.Errorf(backend.ErrInvalid, "%s", err.Error())
	}
	dir := st.Dir
	switch {
	case dir == "":
		dir = s.cwd
	case !filepath.IsAbs(dir):
		dir = filepath.Join(s.cwd, dir)
	}
	s.blk.enter()
	fi, err := os.Stat(dir)
	s.blk.leave()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, backend.Errorf(backend.ErrInvalid, "working directory %q does not exist", dir)
	case err != nil:
		return nil, backend.Errorf(backend.ErrInvalid, "working directory %q: %w", dir, err)
	case !fi.IsDir():
		return nil, backend.Errorf(backend.ErrInvalid, "working directory %q is not a directory", dir)
	}
	cred, home, err := lookupCredential(st.User)
	if err != nil {
		return nil, backend.Errorf(backend.ErrInvalid, "user %q: %w", st.User, err)
	}
	keepOwnGroups(cred)
	if _, own := envGet(st.Env, "HOME"); cred != nil && !own {
		// Another user's HOME is theirs (from the sandbox's /etc/passwd), not the
		// agent's: "/" for a uid the sandbox does not know, as Docker does.
		env, _ = mergeEnv(env, []string{"HOME=" + home})
	}
	plan := &execPlan{name: st.Argv[0], argv: st.Argv, env: env, dir: dir, cred: cred}
	pathEnv, ok := envGet(env, "PATH")
	if !ok {
		pathEnv = defaultPath
	}
	s.blk.enter()
	plan.path, plan.fail = findExecutable(plan.name, pathEnv, dir)
	s.blk.leave()
	return plan, nil
}

// spawn starts the process of plan in a new session with its stdio set up and
// marker in its environment. A command that the kernel refuses to execute is
// returned as an execFailure.
func (s *server) spawn(plan *execPlan, st *agentpb.ExecStart, snd *execSender, marker string) (run *execRun, exitCh <-chan exitInfo, fail *execFailure, err error) {
	run = &execRun{tty: st.Tty, wantStdin: st.Stdin, marker: marker, cancelCh: make(chan struct{})}
	var childFDs []int // closed in the parent after the fork
	var parentFiles []*os.File
	defer func() {
		for _, fd := range childFDs {
			unix.Close(fd)
		}
		if err != nil || fail != nil {
			for _, f := range parentFiles {
				f.Close()
			}
		}
	}()
	var stdio [3]int
	if st.Tty {
		var rows, cols uint32
		if st.Size != nil {
			rows, cols = st.Size.Rows, st.Size.Cols
		}
		s.blk.enter()
		master, slave, perr := openPTY(rows, cols)
		s.blk.leave()
		if perr != nil {
			return nil, nil, nil, backend.Errorf(backend.ErrUnavailable, "allocating a terminal: %w", perr)
		}
		parentFiles = append(parentFiles, master)
		childFDs = append(childFDs, slave)
		stdio = [3]int{slave, slave, slave}
		run.master = master
		run.outs = []*outReader{newOutReader(master, false, snd)}
	} else {
		if st.Stdin {
			w, r, perr := pipe(false, "stdin")
			if perr != nil {
				return nil, nil, nil, backend.Errorf(backend.ErrUnavailable, "stdin pipe: %w", perr)
			}
			parentFiles = append(parentFiles, w)
			childFDs = append(childFDs, r)
			stdio[0] = r
			run.stdinW = w
		} else {
			fd, oerr := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if oerr != nil {
				return nil, nil, nil, backend.Errorf(backend.ErrUnavailable, "opening /dev/null: %w", oerr)
			}
			childFDs = append(childFDs, fd)
			stdio[0] = fd
		}
		for i, name := range []string{"stdout", "stderr"} {
			r, w, perr := pipe(true, name)
			if perr != nil {
				return nil, nil, nil, backend.Errorf(backend.ErrUnavailable, "%s pipe: %w", name, perr)
			}
			parentFiles = append(parentFiles, r)
			childFDs = append(childFDs, w)
			stdio[i+1] = w
			run.outs = append(run.outs, newOutReader(r, i == 1, snd))
		}
	}
	files := []uintptr{uintptr(stdio[0]), uintptr(stdio[1]), uintptr(stdio[2])}
	attr := &syscall.ProcAttr{
		Dir:   plan.dir,
		Env:   withMarker(plan.env, marker),
		Files: files,
		Sys: &syscall.SysProcAttr{
			Setsid:     true,
			Setctty:    st.Tty,
			Ctty:       0,
			Credential: plan.cred,
		},
	}
	for attempt := 1; ; attempt++ {
		s.blk.enter()
		pid, ch, ferr := s.reaper.start(func() (int, error) {
			return syscall.ForkExec(plan.path, plan.argv, attr)
		})
		s.blk.leave()
		if ferr == nil {
			run.pid, exitCh = pid, ch
			break
		}
		if errors.Is(ferr, syscall.ETXTBSY) && attempt < 5 {
			// Someone still holds the file open for writing; it is being installed.
			time.Sleep(time.Duration(attempt) * 10 * time.Millisecond)
			continue
		}
		if f := failureOf(ferr); f != nil {
			return nil, nil, f, nil
		}
		return nil, nil, nil, forkFailed(plan.name, ferr)
	}
	if st.Tty && !st.Stdin {
		// No stdin: the terminal reads EOF from the start.
		run.master.Write([]byte{4})
		run.stdinClosed = true
	}
	return run, exitCh, nil, nil
}

// failureOf maps an execve error to 127 or 126, or nil for errors that are the
// agent's (fork failed: no memory, no pids).
func failureOf(err error) *execFailure {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return nil
	}
	switch errno {
	case syscall.ENOENT, syscall.ENOTDIR, syscall.ELOOP, syscall.ENAMETOOLONG:
		return &execFailure{127, errno.Error()}
	case syscall.EACCES, syscall.EPERM, syscall.ENOEXEC, syscall.EISDIR, syscall.ETXTBSY, syscall.E2BIG, syscall.ELIBBAD:
		return &execFailure{126, errno.Error()}
	}
	return nil
}

// findExecutable resolves name as a shell would: a name with a slash is a path
// (relative to dir), any other is looked up in pathEnv. It returns the path, or 127
// (not found) or 126 (found but not executable) with the reason.
func findExecutable(name, pathEnv, dir string) (string, *execFailure) {
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	if strings.Contains(name, "/") {
		p := abs(name)
		fi, err := os.Stat(p)
		if err != nil {
			var errno syscall.Errno
			if errors.As(err, &errno) {
				if f := failureOf(errno); f != nil {
					return "", f
				}
			}
			return "", &execFailure{127, "no such file or directory"}
		}
		if fi.IsDir() {
			return "", &execFailure{126, "is a directory"}
		}
		if !isExecutable(p, fi) {
			return "", &execFailure{126, "permission denied"}
		}
		return p, nil
	}
	var denied bool
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		p := abs(filepath.Join(d, name))
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			continue
		}
		if isExecutable(p, fi) {
			return p, nil
		}
		denied = true
	}
	if denied {
		return "", &execFailure{126, "permission denied"}
	}
	return "", &execFailure{127, "command not found"}
}

func isExecutable(p string, fi fs.FileInfo) bool {
	return fi.Mode()&0o111 != 0 && unix.Access(p, unix.X_OK) == nil
}

// mergeEnv returns base without the agent's own variables, with add applied over it
// (a later KEY replaces an earlier one in place).
func mergeEnv(base, add []string) ([]string, error) {
	out := make([]string, 0, len(base)+len(add))
	idx := make(map[string]int, len(base)+len(add))
	put := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			return
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	for _, kv := range base {
		if !strings.HasPrefix(kv, AgentEnvPrefix) {
			put(kv)
		}
	}
	for _, kv := range add {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("environment entry %q is not KEY=VALUE", kv)
		}
		put(kv)
	}
	return out, nil
}

func envGet(env []string, key string) (string, bool) {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// keepOwnGroups makes an exec as the agent's own uid and gid keep the agent's
// supplementary groups when the agent may not change them (no CAP_SETGID, as in a
// sandbox that dropped every capability): setgroups would fail with EPERM there,
// although the exec changes no identity at all.
func keepOwnGroups(cred *syscall.Credential) {
	if cred == nil || int(cred.Uid) != os.Getuid() || int(cred.Gid) != os.Getgid() || hasCapSetgid() {
		return
	}
	cred.Groups = nil
	cred.NoSetGroups = true
}

// hasCapSetgid reports whether CAP_SETGID (6) is in the agent's effective set.
func hasCapSetgid() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err != nil || n&(1<<6) != 0
		}
	}
	return true
}

// lookupCredential parses "UID", "UID:GID", "NAME" or "NAME:GROUP"; "" means the
// agent's own user (nil). home is the user's home directory from /etc/passwd, "/"
// when the uid has no entry.
func lookupCredential(spec string) (cred *syscall.Credential, home string, err error) {
	if spec == "" {
		return nil, "", nil
	}
	home = "/"
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	var c syscall.Credential
	var u *user.User
	if n, err := strconv.ParseUint(userPart, 10, 32); err == nil {
		c.Uid, c.Gid = uint32(n), uint32(n)
		u, _ = user.LookupId(userPart)
	} else {
		u, err = user.Lookup(userPart)
		if err != nil {
			return nil, "", err
		}
		n, err := strconv.ParseUint(u.Uid, 10, 32)
		if err != nil {
			return nil, "", fmt.Errorf("uid %q: %v", u.Uid, err)
		}
		c.Uid = uint32(n)
	}
	if u != nil {
		if u.HomeDir != "" {
			home = u.HomeDir
		}
		if n, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
			c.Gid = uint32(n)
		}
		if ids, err := u.GroupIds(); err == nil {
			for _, id := range ids {
				if n, err := strconv.ParseUint(id, 10, 32); err == nil {
					c.Groups = append(c.Groups, uint32(n))
				}
			}
		}
	}
	if hasGroup {
		if n, err := strconv.ParseUint(groupPart, 10, 32); err == nil {
			c.Gid = uint32(n)
		} else {
			g, err := user.LookupGroup(groupPart)
			if err != nil {
				return nil, "", err
			}
			n, err := strconv.ParseUint(g.Gid, 10, 32)
			if err != nil {
				return nil, "", fmt.Errorf("gid %q: %v", g.Gid, err)
			}
			c.Gid = uint32(n)
		}
	}
	return &c, home, nil
}

// pipe makes a pipe whose parent end is a non-blocking *os.File served by Go's
// poller and whose child end is a plain blocking descriptor. parentReads picks which
// end the parent keeps.
func pipe(parentReads bool, name string) (parent *os.File, child int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, -1, err
	}
	pfd, cfd := p[1], p[0]
	if parentReads {
		pfd, cfd = p[0], p[1]
	}
	// A new pipe's end has no status flags but its access mode, which F_SETFL
	// ignores: one call sets O_NONBLOCK, where unix.SetNonblock reads them first.
	if _, err := unix.FcntlInt(uintptr(pfd), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, -1, err
	}
	// NewFile sees O_NONBLOCK and registers the end with Go's poller.
	return os.NewFile(uintptr(pfd), name), cfd, nil
}

// openPTY opens a pseudo-terminal pair: the master as a pollable *os.File, the slave
// as a plain descriptor, sized rows x cols when both are set.
func openPTY(rows, cols uint32) (*os.File, int, error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, -1, err
	}
	rc, err := master.SyscallConn()
	if err != nil {
		master.Close()
		return nil, -1, err
	}
	var n uint32
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		if ierr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ierr != nil {
			return
		}
		n, ierr = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN)
	}); err != nil {
		ierr = err
	}
	if ierr != nil {
		master.Close()
		return nil, -1, ierr
	}
	slave, err := unix.Open("/dev/pts/"+strconv.FormatUint(uint64(n), 10), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, -1, err
	}
	if rows > 0 && cols > 0 {
		if err := unix.IoctlSetWinsize(slave, unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)}); err != nil {
			master.Close()
			unix.Close(slave)
			return nil, -1, err
		}
	}
	return master, slave, nil
}

func setWinsize(f *os.File, rows, cols uint32) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
	}); err != nil {
		return err
	}
	return ierr
}

// Hello implements the Hello RPC: protocol negotiation, and what the client should
// know of this agent.
func (s *server) Hello(ctx context.Context, req *agentpb.HelloRequest) (*agentpb.HelloResponse, error) {
	client := make([]int, len(req.Versions))
	for i, v := range req.Versions {
		client[i] = int(v)
	}
	if _, err := pickProtocol(client, serverVersions); err != nil {
		return nil, backend.Errorf(backend.ErrUnsupported, "%w", err)
	}
	return s.hello(client), nil
}

// hello is the answer to Hello for a client that speaks the versions client: the
// protocol chosen (0 when there is no common one; the client then names both lists
// from Versions), and what the client should know of this agent. The version-2
// handshake answer carries it too.
func (s *server) hello(client []int) *agentpb.HelloResponse {
	v, _ := pickProtocol(client, serverVersions)
	sv := make([]int32, len(serverVersions))
	for i, v := range serverVersions {
		sv[i] = int32(v)
	}
	return &agentpb.HelloResponse{
		Versions: sv, Protocol: int32(v), Pid: int32(os.Getpid()),
		Instance: s.instance, OomWatch: s.oom.on(), ExecUser: s.execUser,
	}
}

// Cancel implements the Cancel RPC.
func (s *server) Cancel(ctx context.Context, req *agentpb.CancelRequest) (*agentpb.CancelResponse, error) {
	s.mu.Lock()
	run := s.execs[req.ExecId]
	s.mu.Unlock()
	if run == nil {
		return nil, backend.Errorf(backend.ErrNotFound, "exec %d is not running", req.ExecId)
	}
	run.cancel()
	return &agentpb.CancelResponse{}, nil
}

// Shutdown implements the Shutdown RPC: kill everything, answer, then stop serving.
func (s *server) Shutdown(ctx context.Context, req *agentpb.ShutdownRequest) (*agentpb.ShutdownResponse, error) {
	grace := time.Duration(req.GraceNs)
	if grace <= 0 {
		grace = s.grace
	}
	s.closing.Store(true)
	s.log.Printf("shutdown requested (grace %v)", grace)
	s.killEverything(grace)
	s.stopOnce.Do(func() { close(s.stopCh) })
	return &agentpb.ShutdownResponse{}, nil
}
