package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/berth-sh/berth/agent/internal/agentpb"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/rpcerr"
)

// ServeOptions configures Serve.
type ServeOptions struct {
	// SocketDir is the directory in which the agent creates its socket
	// (backend.AgentSocketName). The agent binds through /proc/self/fd/N of an O_PATH
	// descriptor of the directory, so the directory's path may be of any length. A
	// stale socket left by a dead agent is replaced; a live one is an error.
	SocketDir string
	// ReadyFD, when > 0, is a file descriptor to which the agent writes "ready\n" and
	// which it then closes, once it accepts connections.
	ReadyFD int
	// LogPath, when set, is the agent's log file, capped at 1 MiB with one rotation
	// (LogPath + ".1"); otherwise the agent logs to stderr.
	LogPath string
	// StateDir, when set, is where the agent keeps state that should outlive it (the
	// shell-mode state of each key), in files only root (the agent's user) can read;
	// it is created when needed. Without it that state lives in memory only, and a
	// shell-mode call's state file in a directory that the agent makes under the
	// system's temporary directory (berth-agent-shell-RANDOM) and removes when it
	// shuts down.
	StateDir string
	// Subreaper makes the agent a child subreaper (PR_SET_CHILD_SUBREAPER), so the
	// background processes of its execs stay its descendants and are reaped and
	// killed by it. Use it on the host; PID 1 of a container is a reaper anyway.
	Subreaper bool
	// Token, when set, is the token (see TokenFileName) that every connection must
	// present in berth's handshake; without one any client that reaches the socket
	// may use the agent. Either way a connection from a process of the sandbox that
	// runs as a user other than root and the agent's own is refused (the peer check,
	// see docs/security.md): the agent runs commands as any user a request names.
	Token []byte
	// ExecUser is the default user of execs, shell calls and jobs that name none
	// ("UID", "UID:GID" or a name); "" is the agent's own user.
	ExecUser string
	// OOMCounter is the OOM-kill counter the agent reads around each exec to report
	// OOM kills: OOMCounterAuto (its own memory cgroup's), a counter file's path, or
	// "" for none (results never say OOMKilled).
	OOMCounter string
	// HandshakeTimeout bounds a new connection's handshake; 0 means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// ListenTCP, when set, is a loopback TCP address ("127.0.0.1:PORT") on which the
	// agent serves too, besides its socket: the port a Kubernetes port-forward
	// reaches inside a Pod's network namespace. It needs Token (every process in that
	// network namespace can connect), and a non-loopback address is refused.
	ListenTCP string
	// OwnDir, when set with an ExecUser that is not root, is a directory (a
	// volume's mount point: a Kubernetes sandbox's workdir) that the agent gives to
	// that user and their group before it serves (lchown of the directory itself,
	// not of what it holds), so that a non-root user can write a volume that its
	// provisioner made root-owned (Kubernetes' host-path provisioner makes 0750
	// root directories, and fsGroup does not apply to host-path volumes). Needs
	// CAP_CHOWN, which berth's containers keep.
	OwnDir string
}

// maxBlocking caps the system calls that block an OS thread (fork, /proc scans,
// stat) the agent makes at the same time; maxCopies caps the copy operations (whose
// file I/O blocks a thread each).
//
// Together they fix the agent's threads, which it makes in advance (prestartThreads)
// and which count against the sandbox's pids limit and, with a thousand sandboxes on
// one host, against the host's kernel.pid_max: GOMAXPROCS (maxProcs) threads that run
// Go code, one per capped blocking call, spareThreads for the reaper's wait4 and the
// short calls that are not capped (log writes, reads of /etc/passwd), plus the Go
// runtime's own (sysmon, the template thread, os/signal's locked thread, and the one
// that runs the P while the others are made): 15 in all on Linux, where 26 were made
// before (docs/performance.md, "Density").
const (
	maxBlocking = 4
	maxCopies   = 2
	// maxProcs caps GOMAXPROCS: the agent waits on processes and pipes, and one P
	// streams output far faster than a sandbox's commands make it.
	maxProcs = 1
	// spareThreads are the threads made in advance beyond one per P and per capped
	// call.
	spareThreads = 3
	// sidPruneAt is the number of remembered exec sessions at which the ones without
	// a live process are forgotten.
	sidPruneAt = 1024
	// streamWorkers is the number of goroutines kept to run calls (goroutines, not
	// threads: they add nothing to the thread count above).
	streamWorkers = 2
)

// Serve runs the agent until a client calls Shutdown, and then returns nil. It sets
// process-wide state (signal handling, subreaper, the reaper of every child), so a
// process calls it at most once, and it must own every child of the process: it
// reaps them all. Errors: the socket cannot be created, or the server fails.
func Serve(opts ServeOptions) error {
	if opts.SocketDir == "" {
		return backend.Errorf(backend.ErrInvalid, "agent: no socket directory given")
	}
	logw, err := openLog(opts.LogPath)
	if err != nil {
		return err
	}
	defer logw.Close()
	logger := log.New(logw, "berth-agent: ", log.LstdFlags|log.Lmicroseconds)
	// Under containerd the agent's stderr is /dev/null: a fatal error must be in the
	// log too, for the driver to report it.
	if err := serve(opts, logger); err != nil {
		logger.Printf("fatal: %v", err)
		return err
	}
	return nil
}

func serve(opts ServeOptions, logger *log.Logger) error {
	// The agent needs little CPU; every P may need a thread, and threads count
	// against the sandbox's pids limit.
	if runtime.GOMAXPROCS(0) > maxProcs {
		runtime.GOMAXPROCS(maxProcs)
	}
	catchSignals(logger)
	prestartThreads(prestartCount())
	if opts.Subreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("agent: PR_SET_CHILD_SUBREAPER: %w", err)
		}
	}

	s, err := newServer(logger)
	if err != nil {
		return err
	}
	if err := ownDir(opts.OwnDir, opts.ExecUser, logger); err != nil {
		return err
	}
	s.shells.dir = opts.StateDir
	defer s.shells.cleanup()
	s.execUser = opts.ExecUser
	s.reserved = reservedDirs(opts)
	s.oom = newOOMWatch(opts.OOMCounter)
	if opts.OOMCounter != "" && !s.oom.on() {
		logger.Printf("no OOM-kill counter found (--oom-counter %s): results will not report OOM kills", opts.OOMCounter)
	}
	// A subreaper or PID 1 finds every process it started among its descendants.
	// Otherwise orphans move to init, and Shutdown finds them by session id, which
	// is only safe while those ids are not reused: the set is pruned as sessions die.
	s.trackSessions = !opts.Subreaper && os.Getpid() != 1
	go s.reaper.run(logger)

	lis, err := listenSocketDir(opts.SocketDir)
	if err != nil {
		return err
	}
	defer lis.cleanup()
	var tcp net.Listener
	if opts.ListenTCP != "" {
		if tcp, err = listenTCP(opts.ListenTCP, opts.Token); err != nil {
			return err
		}
		defer tcp.Close()
	}

	hs := opts.HandshakeTimeout
	if hs <= 0 {
		hs = DefaultHandshakeTimeout
	}
	if opts.Token == nil {
		logger.Printf("serving without a token: any process that reaches the socket may use the agent")
	}
	gs := grpc.NewServer(append(rpcerr.ServerOptions(),
		grpc.Creds(&tokenCreds{token: opts.Token, timeout: hs, hello: s.hello, peer: newPeerCheck()}),
		grpc.InitialWindowSize(StreamWindow),
		grpc.InitialConnWindowSize(StreamWindow),
		// Calls run on goroutines kept between calls, whose stacks have already
		// grown to what an exec needs, rather than on a new goroutine each (whose
		// stack grows and is copied again: 4 % of the agent's CPU per exec of
		// `true`). Calls beyond these run on new goroutines as before.
		grpc.NumStreamWorkers(streamWorkers),
	)...)
	agentpb.RegisterAgentServer(gs, s)

	errc := make(chan error, 2)
	go func() { errc <- gs.Serve(lis) }()
	if tcp != nil {
		go func() { errc <- gs.Serve(tcp) }()
		logger.Printf("serving on %s and %s (pid %d)", opts.SocketDir, tcp.Addr(), os.Getpid())
	} else {
		logger.Printf("serving on %s (pid %d)", opts.SocketDir, os.Getpid())
	}

	if opts.ReadyFD > 0 {
		f := os.NewFile(uintptr(opts.ReadyFD), "ready-fd")
		if f == nil {
			gs.Stop()
			return fmt.Errorf("agent: ready fd %d is not open", opts.ReadyFD)
		}
		_, werr := f.WriteString("ready\n")
		f.Close()
		if werr != nil {
			gs.Stop()
			return fmt.Errorf("agent: ready fd %d: %w", opts.ReadyFD, werr)
		}
	}

	select {
	case <-s.stopCh:
		done := make(chan struct{})
		go func() { gs.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			gs.Stop()
		}
		logger.Printf("shut down")
		return nil
	case err := <-errc:
		return fmt.Errorf("agent: serve: %w", err)
	}
}

// Main runs the agent's command line and returns the process exit status: 0 after a
// Shutdown, 1 when serving failed, 2 for a usage error. args are the arguments after
// the program name, optionally starting with the word "agent":
//
//	[agent] serve --socket-dir DIR [--state-dir DIR] [--ready-fd N] [--log FILE] [--subreaper]
//	        [--token-file FILE] [--exec-user USER] [--oom-counter auto|FILE] [--listen-tcp ADDR]
//	        [--own-dir DIR] [--token-fd N]
//	[agent] install DIR
//	[agent] net-none
//	[agent] probe [--token-stdin] [--user USER] [--socket-dir DIR] [--tcp ADDR] -- COMMAND [ARG...]
//
// install copies the executable into DIR (InstallSelf): the agent image's
// entrypoint. net-none deletes every network interface of the process's network
// namespace but lo (NetNone): the init container of a Kubernetes sandbox with
// network "none". probe is what a process of a sandbox can do with its agents
// (the conformance suite runs it as a sandbox's user, expecting every attempt to be
// refused; see probe).
//
// Without --token-file the agent takes its token from the environment variable
// TokenEnv (how container drivers hand it over: a file in the sandbox would be
// readable by the sandbox's root), then starts itself again without it, the token
// on a pipe named by --token-fd, so that its /proc/PID/environ never shows it; with
// the token in its environment, or as PID 1, it makes itself non-dumpable first
// (see reexecWithoutToken and hideSelf). Else, run as backend.AgentBinaryName (the
// hard link that PrepareSandbox makes), from its sandbox's token file (ReadToken of
// the directory it is in; found on the host, as by the local driver's agents). See
// serveToken.
func Main(args []string) int {
	given := args
	if len(args) > 0 && args[0] == "agent" {
		args = args[1:]
	}
	const synopsis = "usage: berth agent serve --socket-dir DIR [--state-dir DIR] [--ready-fd N] [--log FILE] [--subreaper] [--token-file FILE] [--exec-user USER] [--oom-counter auto|FILE] [--listen-tcp ADDR] [--own-dir DIR] [--token-fd N]\n       berth agent install DIR\n       berth agent net-none\n       berth agent probe [--token-stdin] [--user USER] [--socket-dir DIR] [--tcp ADDR] -- COMMAND [ARG...]"
	if len(args) == 2 && args[0] == "install" {
		if err := InstallSelf(args[1]); err != nil {
			fmt.Fprintf(os.Stderr, "berth agent: %v\n", err)
			return 1
		}
		return 0
	}
	if len(args) == 1 && args[0] == "net-none" {
		if err := NetNone(); err != nil {
			fmt.Fprintf(os.Stderr, "berth agent: %v\n", err)
			return 1
		}
		return 0
	}
	if len(args) > 0 && args[0] == "probe" {
		return probe(args[1:], os.Stdin, os.Stdout, os.Stderr)
	}
	if len(args) == 0 || args[0] != "serve" {
		fmt.Fprintln(os.Stderr, synopsis)
		return 2
	}
	fs := flag.NewFlagSet("berth agent serve", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	socketDir := fs.String("socket-dir", "", "directory in which to create the agent socket "+backend.AgentSocketName)
	stateDir := fs.String("state-dir", "", "directory for state that outlives the agent (shell-mode state); default: memory only")
	readyFD := fs.Int("ready-fd", 0, "file descriptor to write \"ready\\n\" to once serving")
	logPath := fs.String("log", "", "log file (size-capped); default stderr")
	subreaper := fs.Bool("subreaper", false, "become a child subreaper (host sandboxes)")
	tokenFile := fs.String("token-file", "", "the token connections must present (default: $"+TokenEnv+", else the sandbox's "+TokenFileName+" when the executable is "+backend.AgentBinaryName+")")
	execUser := fs.String("exec-user", "", "default user of execs that name none")
	oomCounter := fs.String("oom-counter", "", "OOM-kill counter to report OOM kills from: auto (the agent's memory cgroup) or a file")
	listenTCPAddr := fs.String("listen-tcp", "", "loopback TCP address to serve on too (127.0.0.1:PORT; needs a token)")
	ownDirFlag := fs.String("own-dir", "", "directory to give to the exec user before serving (a volume's mount point)")
	tokenFD := fs.Int(tokenFDFlag[2:], -1, "file descriptor to read the token from (how the agent hands $"+TokenEnv+" to itself when it starts again without it)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *socketDir == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, synopsis)
		return 2
	}
	_, inEnv := os.LookupEnv(TokenEnv)
	// In a container (the token in the environment, or PID 1), before anything
	// else: nothing of the sandbox may read the agent's memory.
	if *tokenFD >= 0 || inEnv || os.Getpid() == 1 {
		if err := hideSelf(); err != nil {
			fmt.Fprintf(os.Stderr, "berth agent: %v\n", err)
			return 1
		}
	}
	token, err := serveToken(*tokenFile, *tokenFD)
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth agent: %v\n", err)
		return 1
	}
	if inEnv && *tokenFD < 0 {
		// Returns only when it could not; the agent then serves as it is (its
		// environment block unreadable in the sandbox all the same: hideSelf).
		err := reexecWithoutToken(append([]string{os.Args[0]}, given...), token)
		fmt.Fprintf(os.Stderr, "berth agent: %v; serving with the token still in /proc/%d/environ (readable only with CAP_SYS_PTRACE)\n", err, os.Getpid())
	}
	err = Serve(ServeOptions{
		SocketDir: *socketDir, StateDir: *stateDir, ReadyFD: *readyFD, LogPath: *logPath, Subreaper: *subreaper,
		Token: token, ExecUser: *execUser, OOMCounter: *oomCounter, ListenTCP: *listenTCPAddr, OwnDir: *ownDirFlag,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth agent: %v\n", err)
		return 1
	}
	return 0
}

// serveToken returns the token the agent checks, from the first of: --token-file
// (file); --token-fd (fd >= 0: the pipe reexecWithoutToken made, read and closed
// whatever else is given); the environment variable TokenEnv, which it removes from
// the process's environment so that no exec inherits it (Main then starts the agent
// again without it: see reexecWithoutToken); and, when the executable is
// backend.AgentBinaryName in an agent directory, that sandbox's token file
// (ReadToken: TokenPath, or the token an earlier berth left beside the executable).
// nil for none. Errors: a token that is given but damaged (ErrInvalid).
func serveToken(file string, fd int) ([]byte, error) {
	env, inEnv := os.LookupEnv(TokenEnv)
	os.Unsetenv(TokenEnv)
	if fd >= 0 {
		// Read (and closed, so that no exec inherits it) even when a file is given.
		tok, err := readTokenFD(fd)
		if err != nil || file == "" {
			return tok, err
		}
	}
	if file != "" {
		return readTokenFile(file)
	}
	if inEnv {
		return parseToken("in $"+TokenEnv, env)
	}
	self, err := os.Executable()
	if err != nil || filepath.Base(self) != backend.AgentBinaryName {
		return nil, nil
	}
	tok, err := ReadToken(filepath.Dir(self))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return tok, err
}

// caughtSignals are caught and dropped. They are caught with a handler rather than
// set to SIG_IGN because an ignored disposition is inherited across execve: every
// command would run with SIGINT, SIGTERM and SIGPIPE ignored. A caught one is reset to
// the default in the child. Faults raised by the agent's own code (SIGSEGV, ...) still
// crash it; only those sent with kill(2) are dropped.
var caughtSignals = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM,
	syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGXCPU,
	syscall.SIGXFSZ, syscall.SIGVTALRM, syscall.SIGIO, syscall.SIGPWR,
	syscall.SIGSYS, syscall.SIGABRT, syscall.SIGTRAP, syscall.SIGILL,
	syscall.SIGBUS, syscall.SIGFPE, syscall.SIGSEGV, syscall.SIGSTKFLT,
}

func catchSignals(logger *log.Logger) {
	c := make(chan os.Signal, 16)
	signal.Notify(c, caughtSignals...)
	go func() {
		for sig := range c {
			if sig != syscall.SIGPIPE {
				logger.Printf("ignoring signal %v", sig)
			}
		}
	}()
}

// prestartCount is how many threads serve makes in advance: one per P (GOMAXPROCS,
// which serve caps at maxProcs), per capped blocking call and per copy, and
// spareThreads.
func prestartCount() int {
	return min(runtime.GOMAXPROCS(0), maxProcs) + maxBlocking + maxCopies + spareThreads
}

// prestartThreads makes the Go runtime create at least n OS threads now and keep them
// idle, so that later it never needs to create one (clone fails when the sandbox's
// pids limit is exhausted, and the runtime cannot survive that).
func prestartThreads(n int) {
	ready := make(chan struct{})
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			ready <- struct{}{}
			<-release
			runtime.UnlockOSThread()
		}()
	}
	for i := 0; i < n; i++ {
		<-ready
	}
	close(release)
	wg.Wait()
}

// socketListener is the agent's listener plus what is needed to remove its socket.
type socketListener struct {
	net.Listener
	dirfd    int
	dev, ino uint64
}

func listenSocketDir(dir string) (*socketListener, error) {
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("agent: socket directory %s: %w", dir, err)
	}
	addr := fmt.Sprintf("/proc/self/fd/%d/%s", dfd, backend.AgentSocketName)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, backend.AgentSocketName, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			unix.Close(dfd)
			return nil, fmt.Errorf("agent: %s/%s exists and is not a socket; remove it", dir, backend.AgentSocketName)
		}
		if c, err := net.DialTimeout("unix", addr, time.Second); err == nil {
			c.Close()
			unix.Close(dfd)
			return nil, fmt.Errorf("agent: another agent is serving on %s/%s", dir, backend.AgentSocketName)
		}
		if err := unix.Unlinkat(dfd, backend.AgentSocketName, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			unix.Close(dfd)
			return nil, fmt.Errorf("agent: removing stale socket %s/%s: %w", dir, backend.AgentSocketName, err)
		}
	}
	l, err := net.Listen("unix", addr)
	if err != nil {
		unix.Close(dfd)
		return nil, fmt.Errorf("agent: listening on %s/%s: %w", dir, backend.AgentSocketName, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	sl := &socketListener{Listener: l, dirfd: dfd}
	if err := unix.Fstatat(dfd, backend.AgentSocketName, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		sl.dev, sl.ino = st.Dev, st.Ino
	}
	return sl, nil
}

// cleanup closes the listener and removes the socket if it is still ours.
func (l *socketListener) cleanup() {
	l.Listener.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(l.dirfd, backend.AgentSocketName, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Dev == l.dev && st.Ino == l.ino {
		unix.Unlinkat(l.dirfd, backend.AgentSocketName, 0)
	}
	unix.Close(l.dirfd)
}

// logMax is the size at which the agent's log file is rotated.
const logMax = 1 << 20

// cappedLog is a log file that is renamed to path.1 when it reaches logMax bytes.
type cappedLog struct {
	mu   sync.Mutex
	path string
	f    *os.File
	size int64
	// crash: f is the runtime's crash output (debug.SetCrashOutput), to be moved to
	// the new file at each rotation.
	crash bool
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// openLog opens the agent's log: stderr when path is "", else the capped file at path,
// which then also receives the Go runtime's fatal error reports (unrecovered panics,
// "fatal error: newosproc" when the pids limit leaves no room for a thread), which
// otherwise go to stderr only.
func openLog(path string) (io.WriteCloser, error) {
	if path == "" {
		return nopCloser{os.Stderr}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("agent: log file: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("agent: log file: %w", err)
	}
	debug.SetCrashOutput(f, debug.CrashOptions{})
	return &cappedLog{path: path, f: f, size: fi.Size(), crash: true}, nil
}

func (l *cappedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return len(p), nil
	}
	if l.size+int64(len(p)) > logMax && l.size > 0 {
		l.f.Close()
		os.Rename(l.path, l.path+".1")
		f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
		if err != nil {
			l.f = nil
			return len(p), nil
		}
		l.f, l.size = f, 0
		if l.crash {
			debug.SetCrashOutput(f, debug.CrashOptions{})
		}
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

func (l *cappedLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	if l.crash {
		debug.SetCrashOutput(nil, debug.CrashOptions{})
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// gate is a counting semaphore for blocking system calls.
type gate chan struct{}

func (g gate) enter() { g <- struct{}{} }
func (g gate) leave() { <-g }

// server implements agentpb.AgentServer.
type server struct {
	agentpb.UnimplementedAgentServer

	log      *log.Logger
	reaper   *reaper
	blk      gate // blocking system calls
	copyGate gate // copy operations
	cwd      string
	grace    time.Duration

	nextID  atomic.Uint64
	mu      sync.Mutex
	execs   map[uint64]*execRun
	sids    map[int]struct{}
	closing atomic.Bool
	pruning atomic.Bool
	// trackSessions: remember exec session ids for Shutdown (neither subreaper nor
	// PID 1).
	trackSessions bool
	// shells holds the shell-mode state of every session; jobs the background jobs.
	shells *shells
	jobs   jobTable
	// execUser is the default exec user; oom the OOM-kill counter watch; instance a
	// random id of this agent process (Hello).
	execUser string
	oom      oomWatch
	instance string
	// reserved are the agent's own directories, which CopyIn never writes
	// (reservedDirs).
	reserved []string

	stopCh   chan struct{}
	stopOnce sync.Once
}

func newServer(logger *log.Logger) (*server, error) {
	cwd, err := os.Getwd()
	if err != nil {
		cwd = "/"
	}
	return &server{
		log:      logger,
		reaper:   newReaper(),
		blk:      make(gate, maxBlocking),
		copyGate: make(gate, maxCopies),
		cwd:      cwd,
		grace:    DefaultGrace,
		execs:    map[uint64]*execRun{},
		sids:     map[int]struct{}{},
		stopCh:   make(chan struct{}),
		shells:   newShells("", logger),
		instance: randomID(),
	}, nil
}

// randomID returns 16 random hex digits.
func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// IsAgent reports whether this process was started as berth's agent: under the name
// backend.AgentBinaryName (the hard link that PrepareSandbox makes and drivers
// start), or with "agent" as its first argument. Any Go program can serve as the
// agent binary (config's agent_path) by calling, before anything else in main:
//
//	if agent.IsAgent() {
//		os.Exit(agent.Main(os.Args[1:]))
//	}
//
// In a container the agent is PID 1; it must be linked statically (CGO_ENABLED=0).
func IsAgent() bool {
	return filepath.Base(os.Args[0]) == backend.AgentBinaryName || len(os.Args) > 1 && os.Args[1] == "agent"
}

// ownDir gives directory dir to user (ServeOptions.OwnDir): nothing when either is
// empty or the user is root. A user the sandbox does not know is only logged (the
// driver's first exec as that user reports it); a directory that cannot be given
// is an error naming it.
func ownDir(dir, user string, logger *log.Logger) error {
	if dir == "" || user == "" {
		return nil
	}
	cred, _, err := lookupCredential(user)
	if err != nil {
		logger.Printf("--own-dir %s: user %q: %v", dir, user, err)
		return nil
	}
	if cred == nil || cred.Uid == 0 {
		return nil
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("agent: --own-dir %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return backend.Errorf(backend.ErrInvalid, "agent: --own-dir %s: not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == cred.Uid && st.Gid == cred.Gid {
		return nil
	}
	if err := os.Lchown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
		return fmt.Errorf("agent: --own-dir %s: giving it to user %q (%d:%d): %w", dir, user, cred.Uid, cred.Gid, err)
	}
	return nil
}
