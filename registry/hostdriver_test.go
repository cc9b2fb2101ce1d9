package registry

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/berth-sh/berth/backend"
)

// hostDriver is a test fixture: a TerminalBackend whose sandboxes are plain host
// directories (with a meta.json) under its DriverSetup.StateDir, and whose execs are
// os/exec processes. Every fresh Create appends a line to STATEDIR/creates.log, so
// tests can count creations across processes. A spec with Image "fail-create" makes
// Create fail with ErrUnavailable, and so does a stopped sandbox whose directory holds
// a file "fail-start" when Create would start it.
type hostDriver struct {
	root    string // DriverSetup.StateDir
	setup   backend.DriverSetup
	creates atomic.Int64
	stops   atomic.Int64 // Stop calls of an existing sandbox
	removes atomic.Int64 // Remove calls of an existing sandbox
}

type hostMeta struct {
	Labels  map[string]string
	Env     []string
	State   backend.State
	Created time.Time
}

func (d *hostDriver) Info(context.Context) (backend.Info, error) {
	return backend.Info{Name: "local", Version: "test", ProtocolVersions: []int{1},
		Capabilities: backend.Capabilities{FSIsolation: backend.FSIsolationNone}}, nil
}

func (d *hostDriver) ConfigSchema(context.Context) ([]backend.ConfigField, error) {
	return []backend.ConfigField{{Name: "note", Type: "string"}, {Name: "grace", Type: "duration"}}, nil
}

func (d *hostDriver) Configure(_ context.Context, s backend.DriverSetup) error {
	if d.root != "" {
		return errors.New("configured twice")
	}
	d.root, d.setup = s.StateDir, s
	return os.MkdirAll(filepath.Join(d.root, "sb"), 0o700)
}

func (d *hostDriver) dir(name string) string { return filepath.Join(d.root, "sb", name) }

func (d *hostDriver) read(name string) (hostMeta, error) {
	var m hostMeta
	b, err := os.ReadFile(filepath.Join(d.dir(name), "meta.json"))
	if errors.Is(err, os.ErrNotExist) {
		return m, backend.Errorf(backend.ErrNotFound, "sandbox %s: %w", name, backend.ErrNotFound)
	} else if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}

func (d *hostDriver) write(name string, m hostMeta) error {
	b, _ := json.Marshal(m)
	tmp := filepath.Join(d.dir(name), "meta.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(d.dir(name), "meta.json"))
}

func (d *hostDriver) sandbox(name string, m hostMeta) backend.Sandbox {
	return backend.Sandbox{Name: name, ID: d.dir(name), State: m.State, Labels: m.Labels, CreatedAt: m.Created}
}

func (d *hostDriver) Create(_ context.Context, req backend.CreateRequest) (backend.Sandbox, error) {
	name := req.Spec.Name
	if err := backend.ValidateSandboxName(name); err != nil {
		return backend.Sandbox{}, err
	}
	if m, err := d.read(name); err == nil {
		if m.Labels[backend.LabelOwner] != req.Spec.Labels[backend.LabelOwner] {
			return backend.Sandbox{}, backend.Errorf(backend.ErrConflict, "sandbox %s belongs to another owner", name)
		}
		if _, err := os.Stat(filepath.Join(d.dir(name), "fail-start")); err == nil && m.State != backend.StateRunning {
			return backend.Sandbox{}, backend.Errorf(backend.ErrUnavailable, "runtime cannot start sandbox %s", name)
		}
		m.State = backend.StateRunning
		if err := d.write(name, m); err != nil {
			return backend.Sandbox{}, err
		}
		sb := d.sandbox(name, m)
		sb.Adopted = true
		return sb, nil
	}
	if req.Spec.Image == "fail-create" {
		return backend.Sandbox{}, backend.Errorf(backend.ErrUnavailable, "runtime refuses image fail-create")
	}
	if err := os.Mkdir(d.dir(name), 0o700); err != nil {
		return backend.Sandbox{}, backend.Errorf(backend.ErrConflict, "sandbox dir %s: %w", name, err)
	}
	m := hostMeta{Labels: req.Spec.Labels, Env: req.Spec.Env, State: backend.StateRunning, Created: time.Now().UTC()}
	if err := d.write(name, m); err != nil {
		os.RemoveAll(d.dir(name))
		return backend.Sandbox{}, err
	}
	d.creates.Add(1)
	f, err := os.OpenFile(filepath.Join(d.root, "creates.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err == nil {
		f.WriteString(name + "\n")
		f.Close()
	}
	return d.sandbox(name, m), nil
}

func (d *hostDriver) Inspect(_ context.Context, name string) (backend.Sandbox, error) {
	m, err := d.read(name)
	return d.sandbox(name, m), err
}

func (d *hostDriver) List(_ context.Context, filter map[string]string) ([]backend.Sandbox, error) {
	ents, _ := os.ReadDir(filepath.Join(d.root, "sb"))
	var out []backend.Sandbox
	for _, e := range ents {
		if m, err := d.read(e.Name()); err == nil && backend.MatchLabels(m.Labels, filter) {
			out = append(out, d.sandbox(e.Name(), m))
		}
	}
	return out, nil
}

func (d *hostDriver) Stop(_ context.Context, name string, _ time.Duration) error {
	m, err := d.read(name)
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	d.stops.Add(1)
	m.State = backend.StateStopped
	return d.write(name, m)
}

func (d *hostDriver) Remove(_ context.Context, name string) error {
	if _, err := os.Stat(d.dir(name)); err == nil {
		d.removes.Add(1)
	}
	return os.RemoveAll(d.dir(name))
}

func (d *hostDriver) Exec(ctx context.Context, name string, req backend.ExecRequest) (backend.Process, error) {
	m, err := d.read(name)
	if err != nil {
		return nil, err
	}
	if m.State != backend.StateRunning {
		return nil, backend.Errorf(backend.ErrConflict, "sandbox %s is %s", name, m.State)
	}
	if len(req.Argv) == 0 {
		return nil, backend.Errorf(backend.ErrInvalid, "empty argv")
	}
	dir := req.Dir
	if dir == "" {
		dir = d.dir(name)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, backend.Errorf(backend.ErrInvalid, "working directory %s does not exist", dir)
	}
	cmd := exec.CommandContext(ctx, req.Argv[0], req.Argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(append([]string{"PATH=" + os.Getenv("PATH")}, m.Env...), req.Env...)
	cmd.Stdout, cmd.Stderr = req.Stdout, req.Stderr
	p := &hostProc{cmd: cmd, start: time.Now()}
	if req.Stdin {
		if p.stdin, err = cmd.StdinPipe(); err != nil {
			return nil, err
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return p, nil
}

func (d *hostDriver) Close() error { return nil }

type hostProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	start time.Time
}

func (p *hostProc) Write(b []byte) (int, error) {
	if p.stdin == nil {
		return 0, backend.Errorf(backend.ErrInvalid, "no stdin")
	}
	return p.stdin.Write(b)
}

func (p *hostProc) CloseStdin() error {
	if p.stdin == nil {
		return nil
	}
	return p.stdin.Close()
}

func (p *hostProc) Resize(backend.WindowSize) error {
	return backend.Errorf(backend.ErrInvalid, "no tty")
}

func (p *hostProc) Signal(sig int) error { return p.cmd.Process.Signal(syscall.Signal(sig)) }

func (p *hostProc) Wait() (backend.ExecResult, error) {
	err := p.cmd.Wait()
	res := backend.ExecResult{Duration: time.Since(p.start)}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		err = nil
	}
	st := p.cmd.ProcessState
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.Signal = int(ws.Signal())
		res.ExitCode = 128 + res.Signal
	} else {
		res.ExitCode = st.ExitCode()
	}
	return res, err
}

// prepareFixture is the test's WithAgentPreparer: it makes the sandbox's agent and
// run dirs as agent.PrepareSandbox would, with /bin/true as the binary.
func prepareFixture(sandboxDir string) (backend.AgentFiles, error) {
	f := backend.AgentFiles{Binary: filepath.Join(sandboxDir, "agent", backend.AgentBinaryName),
		Dir: filepath.Join(sandboxDir, "agent"), SocketDir: filepath.Join(sandboxDir, "run")}
	for _, d := range []string{f.Dir, f.SocketDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return f, err
		}
	}
	return f, os.WriteFile(f.Binary, []byte("#!/bin/true\n"), 0o755)
}
