// Command testplugin is the test fixture of package backends: a driver plugin
// (backends.Serve) whose small driver runs real host processes with os/exec,
// each in its own process group. BERTH_TESTPLUGIN_MODE changes it: "garbage"
// writes text to stdout, then hangs; "exit" exits 3 at once; "hang" never
// completes the handshake and starts a child in its process group; "future"
// speaks only protocol versions 98 and 99, or those of BERTH_TESTPLUGIN_VERSIONS
// ("1", "3,4"), and says so in describe; "full"
// serves a driver that also implements backend.Copier, backend.ImagePuller,
// backend.ImageImporter, backend.Validator and backend.AgentDialer (which dials the
// unix socket BERTH_TESTPLUGIN_DIAL names, whatever the sandbox, except sandbox
// "stopped": ErrConflict). BERTH_TESTPLUGIN_PIDFILE, when set, receives one pid
// per line of every process it starts. "testplugin write N FILE" writes N bytes
// of a fixed pattern to stdout in 4 KiB writes, recording the count written so
// far in FILE.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
)

func main() {
	if len(os.Args) == 4 && os.Args[1] == "write" {
		os.Exit(write(os.Args[2], os.Args[3]))
	}
	switch os.Getenv("BERTH_TESTPLUGIN_MODE") {
	case "garbage":
		recordPid(os.Getpid())
		fmt.Println("hello, I am not a plugin")
		time.Sleep(time.Hour)
		return
	case "exit":
		fmt.Fprintln(os.Stderr, "fatal: frobnicator missing")
		os.Exit(3)
	case "future":
		serveFuture()
		return
	case "hang":
		recordPid(os.Getpid())
		child := exec.Command("sleep", "300")
		if err := child.Start(); err == nil {
			recordPid(child.Process.Pid)
		}
		time.Sleep(time.Hour)
		return
	}
	level := hclog.LevelFromString(os.Getenv("BERTH_DRIVER_LOG_LEVEL"))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "testdriver", Output: os.Stderr, JSONFormat: true, Level: level})
	d := &driver{logger: logger, sandboxes: map[string]backend.Sandbox{}}
	if len(os.Args) == 2 && os.Args[1] == backends.DescribeCommand {
		// As a third-party driver's main answers it. (Other arguments are ignored:
		// the registry's tests run this plugin as "BINARY driver serve local".)
		os.Exit(backends.Main(d))
	}
	if os.Getenv("BERTH_TESTPLUGIN_MODE") == "full" {
		backends.Serve(&fullDriver{driver: d, files: map[string][]byte{}}, logger)
		return
	}
	backends.Serve(d, logger)
}

// futurePlugin is the go-plugin plugin of a driver from the future: it speaks
// only protocol versions 98 and 99, which no berth speaks.
type futurePlugin struct{ plugin.NetRPCUnsupportedPlugin }

func (futurePlugin) GRPCServer(*plugin.GRPCBroker, *grpc.Server) error { return nil }
func (futurePlugin) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, errors.New("not a host")
}

// serveFuture serves futurePlugin with berth's handshake and answers describe.
func serveFuture() {
	versions := []int{98, 99}
	if v := os.Getenv("BERTH_TESTPLUGIN_VERSIONS"); v != "" {
		versions = nil
		for _, f := range strings.Split(v, ",") {
			n, _ := strconv.Atoi(f)
			versions = append(versions, n)
		}
	}
	if len(os.Args) > 1 && os.Args[1] == "describe" {
		js, _ := json.Marshal(versions)
		fmt.Printf(`{"name":"future","version":"9.0.0","protocol_versions":%s,"capabilities":{},"config_schema":[]}`+"\n", js)
		return
	}
	recordPid(os.Getpid())
	sets := map[int]plugin.PluginSet{}
	for _, v := range versions {
		sets[v] = plugin.PluginSet{backends.PluginName: futurePlugin{}}
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  backends.Handshake,
		VersionedPlugins: sets,
		GRPCServer:       plugin.DefaultGRPCServer,
	})
}

// DialAgent dials the unix socket of BERTH_TESTPLUGIN_DIAL.
func (f *fullDriver) DialAgent(ctx context.Context, name string) (net.Conn, error) {
	if name == "stopped" {
		return nil, backend.Errorf(backend.ErrConflict, "sandbox %s is stopped", name)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", os.Getenv("BERTH_TESTPLUGIN_DIAL"))
}

// Validate refuses a spec without an image.
func (f *fullDriver) Validate(_ context.Context, spec backend.SandboxSpec) error {
	if spec.Image == "" {
		return backend.Errorf(backend.ErrInvalid, "sandbox %s: no image", spec.Name)
	}
	return nil
}

// fullDriver adds the optional interfaces: CopyIn stores the stream under
// name:dir, CopyOut returns what is stored under name:path, PullImage reports
// three events, ImportImage returns one ref naming the archive's size.
type fullDriver struct {
	*driver
	mu    sync.Mutex
	files map[string][]byte
}

func (f *fullDriver) CopyIn(_ context.Context, name, dir string, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.files[name+":"+dir] = b
	f.mu.Unlock()
	return nil
}

func (f *fullDriver) CopyOut(_ context.Context, name, path string, w io.Writer) error {
	f.mu.Lock()
	b, ok := f.files[name+":"+path]
	f.mu.Unlock()
	if !ok {
		// The cause as a runtime reports it, wrapped (%w): across the plugin the kind
		// survives and the text names the cause.
		return backend.Errorf(backend.ErrNotFound, "copy out of sandbox %s: %w", name, &fs.PathError{Op: "open", Path: path, Err: syscall.ENOENT})
	}
	_, err := w.Write(b)
	return err
}

func (f *fullDriver) PullImage(_ context.Context, ref string, policy backend.PullPolicy, progress func(backend.PullProgress)) error {
	if policy == backend.PullNever {
		return backend.Errorf(backend.ErrNotFound, "image %s: not present and pull policy is never", ref)
	}
	for i := int64(1); i <= 3; i++ {
		progress(backend.PullProgress{Layer: "l1", Status: "Downloading", Current: i * 10, Total: 30})
	}
	return nil
}

func (f *fullDriver) ImportImage(_ context.Context, r io.Reader) ([]string, error) {
	n, err := io.Copy(io.Discard, r)
	if err != nil {
		return nil, err
	}
	return []string{fmt.Sprintf("imported:%d", n)}, nil
}

func recordPid(pid int) {
	path := os.Getenv("BERTH_TESTPLUGIN_PIDFILE")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintln(f, pid)
	_ = f.Close()
}

// Pattern is the byte at offset i of "write"'s output.
func Pattern(i int64) byte { return byte(i % 251) }

func write(nArg, progress string) int {
	n, err := strconv.ParseInt(nArg, 10, 64)
	if err != nil {
		return 2
	}
	f, err := os.OpenFile(progress, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 2
	}
	buf := make([]byte, 4096)
	var total int64
	for total < n {
		m := min(int64(len(buf)), n-total)
		for i := int64(0); i < m; i++ {
			buf[i] = Pattern(total + i)
		}
		w, err := os.Stdout.Write(buf[:m])
		total += int64(w)
		if _, perr := f.WriteAt([]byte(fmt.Sprintf("%020d", total)), 0); perr != nil {
			return 2
		}
		if err != nil {
			return 1
		}
	}
	return 0
}

type driver struct {
	logger    hclog.Logger
	mu        sync.Mutex
	sandboxes map[string]backend.Sandbox
	setup     backend.DriverSetup
}

func (d *driver) Info(context.Context) (backend.Info, error) {
	d.logger.Info("info called", "marker", "test-driver-info")
	// A stray print: after the handshake, go-plugin carries it to the host's log.
	fmt.Println("stray stdout line")
	return backend.Info{
		Name:    "test",
		Version: "0.0.1",
		Capabilities: backend.Capabilities{
			FSIsolation:  backend.FSIsolationNone,
			NetworkModes: []string{"none"},
			StopStart:    true,
		},
	}, nil
}

func (d *driver) ConfigSchema(context.Context) ([]backend.ConfigField, error) {
	return []backend.ConfigField{{Name: "root", Type: "string", Required: true, Description: "where sandboxes live"}}, nil
}

func (d *driver) Configure(_ context.Context, s backend.DriverSetup) error {
	if strings.Contains(string(s.Config), `"bad"`) {
		return backend.Errorf(backend.ErrInvalid, "attribute bad: not accepted")
	}
	d.mu.Lock()
	d.setup = s
	d.mu.Unlock()
	return nil
}

func (d *driver) Create(_ context.Context, req backend.CreateRequest) (backend.Sandbox, error) {
	if err := backend.ValidateSandboxName(req.Spec.Name); err != nil {
		return backend.Sandbox{}, err
	}
	if strings.HasPrefix(req.Spec.Name, "taken") {
		return backend.Sandbox{}, backend.Errorf(backend.ErrConflict, "sandbox %s: held by someone else", req.Spec.Name)
	}
	// BERTH_TESTPLUGIN_CRASH_CREATE=FILE: the first Create of all (FILE is missing)
	// makes FILE and crashes the plugin in the middle of the call.
	if f := os.Getenv("BERTH_TESTPLUGIN_CRASH_CREATE"); f != "" {
		if _, err := os.Stat(f); errors.Is(err, os.ErrNotExist) {
			os.WriteFile(f, nil, 0o600)
			os.Exit(3)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if sb, ok := d.sandboxes[req.Spec.Name]; ok {
		sb.State = backend.StateRunning
		d.sandboxes[sb.Name] = sb
		sb.Adopted = true
		return sb, nil
	}
	sb := backend.Sandbox{
		Name:      req.Spec.Name,
		ID:        "test/" + req.Spec.Name,
		State:     backend.StateRunning,
		Labels:    req.Spec.Labels,
		CreatedAt: time.Now().UTC(),
	}
	d.sandboxes[sb.Name] = sb
	return sb, nil
}

func (d *driver) Inspect(_ context.Context, name string) (backend.Sandbox, error) {
	if name == "crash" {
		os.Exit(7)
	}
	if k, ok := strings.CutPrefix(name, "err-"); ok {
		for _, kind := range backend.Kinds {
			if strings.ReplaceAll(kind.Error(), " ", "-") == k {
				return backend.Sandbox{}, backend.Errorf(kind, "inspect %s: the test driver says %s", name, kind)
			}
		}
		return backend.Sandbox{}, fmt.Errorf("inspect %s: an error without a kind", name)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	sb, ok := d.sandboxes[name]
	if !ok {
		return backend.Sandbox{}, backend.Errorf(backend.ErrNotFound, "sandbox %s: not found", name)
	}
	return sb, nil
}

func (d *driver) List(_ context.Context, filter map[string]string) ([]backend.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []backend.Sandbox
	for _, sb := range d.sandboxes {
		if backend.MatchLabels(sb.Labels, filter) {
			out = append(out, sb)
		}
	}
	return out, nil
}

func (d *driver) Stop(_ context.Context, name string, _ time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if sb, ok := d.sandboxes[name]; ok {
		sb.State = backend.StateStopped
		d.sandboxes[name] = sb
	}
	return nil
}

func (d *driver) Remove(_ context.Context, name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.sandboxes, name)
	return nil
}

func (d *driver) Close() error { return nil }

func (d *driver) Exec(ctx context.Context, name string, req backend.ExecRequest) (backend.Process, error) {
	d.mu.Lock()
	sb, ok := d.sandboxes[name]
	d.mu.Unlock()
	switch {
	case !ok:
		return nil, backend.Errorf(backend.ErrNotFound, "sandbox %s: not found", name)
	case sb.State != backend.StateRunning:
		return nil, backend.Errorf(backend.ErrConflict, "sandbox %s: not running", name)
	case len(req.Argv) == 0:
		return nil, backend.Errorf(backend.ErrInvalid, "exec: empty argv")
	case req.TTY:
		return nil, backend.Errorf(backend.ErrUnsupported, "exec: the test driver has no TTY")
	}
	stdout, stderr := orDiscard(req.Stdout), orDiscard(req.Stderr)
	cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
	cmd.Env = append(os.Environ(), req.Env...)
	cmd.Dir = req.Dir
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &proc{cmd: cmd, start: time.Now(), exited: make(chan struct{})}
	if req.Stdin {
		w, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		p.stdin = w
	}
	if err := cmd.Start(); err != nil {
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = 127
		}
		fmt.Fprintf(stderr, "berth: %s: %v\n", req.Argv[0], err)
		close(p.exited)
		p.fixed = &backend.ExecResult{ExitCode: code}
		return p, nil
	}
	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer func() {
			go func() { <-p.exited; t.Stop() }()
		}()
		timeout = t.C
	}
	go func() {
		select {
		case <-ctx.Done():
			p.mu.Lock()
			p.canceled = true
			p.mu.Unlock()
		case <-timeout:
			p.mu.Lock()
			p.timedOut = true
			p.mu.Unlock()
		case <-p.exited:
			return
		}
		// Logged first on purpose: when the host has died, this write to the
		// broken stderr pipe must not kill the plugin before the tree is killed.
		d.logger.Info("exec ended early; killing its process group", "pid", cmd.Process.Pid)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}()
	return p, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	start  time.Time
	exited chan struct{}
	fixed  *backend.ExecResult

	once     sync.Once
	res      backend.ExecResult
	err      error
	mu       sync.Mutex
	canceled bool
	timedOut bool
}

func (p *proc) Write(b []byte) (int, error) {
	if p.stdin == nil {
		return 0, backend.Errorf(backend.ErrInvalid, "no stdin")
	}
	return p.stdin.Write(b)
}

func (p *proc) CloseStdin() error {
	if p.stdin == nil {
		return nil
	}
	return p.stdin.Close()
}

func (p *proc) Resize(backend.WindowSize) error {
	return backend.Errorf(backend.ErrInvalid, "no TTY")
}

func (p *proc) Signal(sig int) error {
	if p.fixed != nil {
		return nil
	}
	return syscall.Kill(-p.cmd.Process.Pid, syscall.Signal(sig))
}

func (p *proc) Wait() (backend.ExecResult, error) {
	p.once.Do(func() {
		if p.fixed != nil {
			p.res = *p.fixed
			return
		}
		err := p.cmd.Wait()
		close(p.exited)
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			p.err = err
			return
		}
		ws := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.res = backend.ExecResult{ExitCode: ws.ExitStatus(), Duration: time.Since(p.start), Canceled: p.canceled, TimedOut: p.timedOut}
		if ws.Signaled() {
			p.res.Signal = int(ws.Signal())
			p.res.ExitCode = 128 + p.res.Signal
		}
	})
	return p.res, p.err
}
