package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/distribution/reference"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/containerutil"
	"github.com/berth-sh/berth/internal/flock"
	"github.com/berth-sh/berth/internal/hostpaths"
)

// agentStartTimeout bounds how long Create waits for the agent of a started task to
// answer.
const agentStartTimeout = 30 * time.Second

// cleanupTimeout bounds the clean-up of a failed Create.
const cleanupTimeout = 30 * time.Second

// createLease is the expiry of the lease that holds a new container's snapshot until
// the container record refers to it: a Create that dies in between leaves a snapshot
// that containerd's garbage collector removes once the lease expires.
const createLease = 10 * time.Minute

// AgentLogName is the agent's log file in the sandbox's socket directory, capped by
// the agent at 1 MiB with one rotation. The task's own stdio goes to null IO.
const AgentLogName = "agent.log"

// Create makes the sandbox's container (id = the sandbox's name) with a new snapshot
// of the image, and starts its task with the agent as PID 1; or adopts the container
// of that id when it carries the same owner label (starting a new task on its
// snapshot when it is stopped). A container of that id that is not ours is
// ErrConflict and is never touched. A failed Create of a new container deletes its
// task, container and snapshot. An image missing from the namespace is ErrNotFound
// (import or pull it first).
func (d *Driver) Create(ctx context.Context, req backend.CreateRequest) (backend.Sandbox, error) {
	spec := req.Spec
	if err := backend.ValidateSandboxName(spec.Name); err != nil {
		return backend.Sandbox{}, err
	}
	if err := containerutil.CheckAgent(Name, spec.Name, req.Agent); err != nil {
		return backend.Sandbox{}, err
	}
	build, user, err := d.specOpts(spec, req.Agent)
	if err != nil {
		return backend.Sandbox{}, err
	}
	binary, err := d.runtimeBinary(spec.Name, spec.Runtime)
	if err != nil {
		return backend.Sandbox{}, err
	}
	if err := checkRuntimeNetwork(spec, binary); err != nil {
		return backend.Sandbox{}, err
	}
	cli, nctx, err := d.api(ctx)
	if err != nil {
		return backend.Sandbox{}, err
	}
	s := d.settings()
	lk := d.creating.Lock(spec.Name) // other processes: settled by containerd (ids are unique; the loser adopts)
	lk.Lock()
	defer lk.Unlock()
	// containerd does not make two tasks of one container safely at once (the loser's
	// clean-up removes the winner's bundle): Creates in other processes wait too.
	fl, err := d.lockFile(ctx, spec.Name, req.Agent)
	if err != nil {
		return backend.Sandbox{}, err
	}
	if fl != nil {
		defer fl.Unlock(false)
	}

	unpacked := false
	for attempt := 0; ; attempt++ {
		c, err := cli.LoadContainer(nctx, spec.Name)
		if err == nil {
			sb, err := d.adopt(nctx, cli, spec, c)
			if errors.Is(err, errSnapshotGone) && attempt < 3 {
				continue // the broken container is gone: make a new one
			}
			return sb, err
		}
		if err = d.wrap("load container "+spec.Name, err); !errors.Is(err, backend.ErrNotFound) {
			return backend.Sandbox{}, err
		}
		filter, err := seccompOpt(d.seccompSetting())
		if err != nil {
			return backend.Sandbox{}, err
		}
		img, err := d.image(nctx, cli, spec.Name, spec.Image)
		if err != nil {
			return backend.Sandbox{}, err
		}
		labels := copyLabels(spec.Labels)
		if user != "" {
			labels[LabelUser] = user
		}
		lctx, done, err := cli.WithLease(nctx, leases.WithRandomID(), leases.WithExpiration(createLease))
		if err != nil {
			return backend.Sandbox{}, d.wrap("create lease", err)
		}
		c, err = cli.NewContainer(lctx, spec.Name,
			client.WithImage(img),
			client.WithSnapshotter(s.snapshotter),
			client.WithNewSnapshot(spec.Name, img),
			client.WithContainerLabels(labels),
			client.WithRuntime(s.runtime, runtimeOptions(spec.Runtime, binary)),
			client.WithNewSpec(build(img, filter)...),
		)
		if err != nil {
			done(context.WithoutCancel(nctx))
			if cerrdefs.IsNotFound(err) && !unpacked {
				// The image's layers are not in the snapshotter yet (first use with
				// this snapshotter, or an image fetched without unpacking).
				unpacked = true
				if uerr := img.Unpack(nctx, s.snapshotter); uerr != nil {
					return backend.Sandbox{}, d.wrap(fmt.Sprintf("unpack image %s into snapshotter %s", spec.Image, s.snapshotter), uerr)
				}
				continue
			}
			werr := d.wrap("create container "+spec.Name, err)
			if errors.Is(werr, backend.ErrConflict) && attempt < 3 {
				if _, lerr := cli.LoadContainer(nctx, spec.Name); lerr == nil {
					continue // another process created it meanwhile: adopt it
				}
				if _, serr := cli.SnapshotService(s.snapshotter).Stat(nctx, spec.Name); serr == nil {
					// A snapshot of this sandbox's name without a container: left by a
					// Create, a failed Create's clean-up or a Remove that was killed
					// between its steps (the container record goes first, so its
					// snapshot may stay). No other Create of this name runs (this
					// one holds the name's lock), so nothing uses it: remove it.
					if rerr := cli.SnapshotService(s.snapshotter).Remove(nctx, spec.Name); rerr != nil && !cerrdefs.IsNotFound(rerr) {
						return backend.Sandbox{}, backend.Errorf(backend.ErrConflict, "containerd sandbox %s: a snapshot %q exists in namespace %s without a container (an interrupted Create or Remove) and cannot be removed: %w; remove it with `ctr -n %s snapshots --snapshotter %s rm %s`", spec.Name, spec.Name, s.namespace, rerr, s.namespace, s.snapshotter, spec.Name)
					}
					continue
				}
			}
			if errors.Is(werr, backend.ErrUnavailable) || errors.Is(werr, backend.ErrConflict) {
				return backend.Sandbox{}, werr
			}
			d.removeSnapshot(nctx, cli, spec.Name)
			return backend.Sandbox{}, backend.Errorf(backend.ErrInvalid, "containerd sandbox %s: containerd refused the container: %w", spec.Name, err)
		}
		done(context.WithoutCancel(nctx))
		info, err := c.Info(nctx, client.WithoutRefreshedMetadata)
		if err == nil {
			var sb backend.Sandbox
			if sb, err = d.start(nctx, cli, c, info, user, true); err == nil {
				return sb, nil
			}
		}
		d.destroy(nctx, cli, c)
		return backend.Sandbox{}, d.wrap("start container "+spec.Name, err)
	}
}

// lockFile takes the cross-process lock of sandbox name: an flock on NAME.lock in the
// driver's state dir (DriverSetup.StateDir), or, before Configure gave one, on
// .containerd.lock in the directory that holds the sandbox's agent dir (host-owned,
// not mounted into the sandbox; a zero a means no such directory, and then no lock is
// taken and the returned lock is nil). It waits while another process holds it, until
// ctx ends. Release it with Unlock; Remove deletes the file as it does (waiters then
// lock the new file, see internal/flock).
func (d *Driver) lockFile(ctx context.Context, name string, a backend.AgentFiles) (*flock.Held, error) {
	d.mu.Lock()
	dir := d.stateDir
	d.mu.Unlock()
	path := filepath.Join(dir, "locks", name+".lock")
	if dir == "" {
		if a.Dir == "" {
			return nil, nil
		}
		path = filepath.Join(filepath.Dir(filepath.Clean(a.Dir)), ".containerd.lock")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("containerd sandbox %s: lock: %w", name, err)
	}
	l, err := flock.Lock(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("containerd sandbox %s: %w", name, err)
	}
	return l, nil
}

// destroy deletes container c with its task and snapshot, for a failed Create or a
// container whose snapshot is gone: the container record before the snapshot
// (deleteContainer). It runs even when ctx is cancelled.
func (d *Driver) destroy(ctx context.Context, cli *client.Client, c client.Container) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil
		}
		return d.wrap("container info "+c.ID(), err)
	}
	if t, err := c.Task(ctx, nil); err == nil {
		if err := deleteTask(ctx, t); err != nil && !cerrdefs.IsNotFound(err) {
			return d.wrap("delete the task of "+c.ID(), err)
		}
	} else if err := d.deleteStaleTask(ctx, cli, c.ID()); err != nil {
		return err
	}
	return d.deleteContainer(ctx, cli, c, info)
}

// removeSnapshot removes the snapshot key of a container that was not made.
func (d *Driver) removeSnapshot(ctx context.Context, cli *client.Client, key string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	cli.SnapshotService(d.settings().snapshotter).Remove(ctx, key)
}

// normalizeRef returns ref as containerd names images ("busybox:1" →
// "docker.io/library/busybox:1"). Errors wrap backend.ErrInvalid.
func normalizeRef(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", backend.Errorf(backend.ErrInvalid, "image %q is not an image reference: %w", ref, err)
	}
	return named.String(), nil
}

// familiar returns a containerd image name as users write it
// ("docker.io/library/busybox:1" → "busybox:1"), or name when it does not parse.
func familiar(name string) string {
	named, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return name
	}
	return reference.FamiliarString(named)
}

// image returns the image ref of sandbox name. Whether it is unpacked into the
// snapshotter is not asked (that costs several calls): Create unpacks it when the
// container's snapshot finds no parent.
func (d *Driver) image(ctx context.Context, cli *client.Client, name, ref string) (client.Image, error) {
	s := d.settings()
	full, err := normalizeRef(ref)
	if err != nil {
		return nil, backend.Errorf(backend.ErrInvalid, "containerd sandbox %s: %w", name, err)
	}
	img, err := cli.GetImage(ctx, full)
	if err != nil {
		werr := d.wrap("get image "+ref, err)
		if errors.Is(werr, backend.ErrNotFound) {
			return nil, backend.Errorf(backend.ErrNotFound, "containerd sandbox %s: image %q is not in containerd namespace %s at %s; import it with `berth image import FILE --driver containerd` or pull it (PullImage) first", name, ref, s.namespace, s.address)
		}
		return nil, werr
	}
	return img, nil
}

// errSnapshotGone is adopt's report that it removed a container of ours whose
// snapshot was gone, so that Create makes a new one.
var errSnapshotGone = errors.New("the container's snapshot is gone")

// adopt takes over an existing container of the spec's name when it is ours. One of
// ours without a running task whose snapshot is gone (a clean-up or Remove killed
// half-way by an older berth) cannot get a task again, and its filesystem is lost
// anyway: adopt deletes it and returns errSnapshotGone.
func (d *Driver) adopt(ctx context.Context, cli *client.Client, spec backend.SandboxSpec, c client.Container) (backend.Sandbox, error) {
	info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
	if err != nil {
		return backend.Sandbox{}, d.wrap("container info "+spec.Name, err)
	}
	have, ok := info.Labels[backend.LabelOwner]
	if !ok || have != spec.Labels[backend.LabelOwner] {
		who := "it has no berth.owner label (not made by berth)"
		if ok {
			who = fmt.Sprintf("it belongs to berth owner %q, not %q", have, spec.Labels[backend.LabelOwner])
		}
		return backend.Sandbox{}, backend.Errorf(backend.ErrConflict, "containerd sandbox %s: a container of that id exists in namespace %s and %s; berth leaves it alone: remove it or use another session", spec.Name, d.settings().namespace, who)
	}
	// A running sandbox whose agent answers is adopted as it is: other calls may be
	// using it (a shared sandbox's sessions).
	if t, err := c.Task(ctx, nil); err == nil {
		if st, err := t.Status(ctx); err == nil && st.Status == client.Running {
			if ac, err := d.dial(ctx, spec.Name, agentFiles(info), connTimeout); err == nil {
				ac.Close()
				sb := toSandbox(info, backend.StateRunning)
				sb.Adopted = true
				return sb, nil
			}
		}
	}
	if info.SnapshotKey != "" && info.Snapshotter != "" {
		if _, err := cli.SnapshotService(info.Snapshotter).Stat(ctx, info.SnapshotKey); cerrdefs.IsNotFound(err) {
			if err := d.destroy(ctx, cli, c); err != nil {
				return backend.Sandbox{}, fmt.Errorf("containerd sandbox %s: its snapshot %q is gone, and removing the container failed: %w", spec.Name, info.SnapshotKey, err)
			}
			return backend.Sandbox{}, errSnapshotGone
		}
	}
	// A task that ended without berth (Stop deletes the task it ends) says why:
	// the sandbox returned carries it (backend.Sandbox.EndReason).
	prev, _ := d.taskOf(ctx, cli, spec.Name)
	sb, err := d.start(ctx, cli, c, info, info.Labels[LabelUser], false)
	if err != nil {
		return backend.Sandbox{}, err
	}
	sb.Adopted = true
	sb.EndReason, sb.EndMessage = endOf(prev)
	return sb, nil
}

// start makes sure container c has a running task whose agent answers and knows its
// default user: a running task is connected to; so is a task in created state when its
// agent answers within connTimeout (another process's Create is starting it); a
// stopped task, or a created one whose agent never comes, is deleted and a new task is
// started on the container's snapshot. When NewTask says the task exists but there is
// none, the stale task that a killed Stop or Remove left is deleted first
// (deleteStaleTask; start runs under Create's lock, so no other Create is making it). When the new task exits before its agent
// answers, the error carries its exit status and the end of the agent's log. fresh
// says c was just made (it has no task yet).
func (d *Driver) start(ctx context.Context, cli *client.Client, c client.Container, info containers.Container, user string, fresh bool) (backend.Sandbox, error) {
	name := c.ID()
	files := agentFiles(info)
	sockDir := files.SocketDir
	if sockDir == "" {
		return backend.Sandbox{}, backend.Errorf(backend.ErrConflict, "containerd sandbox %s: the container has no %s mount; it was not made by this driver: remove it", name, backend.SocketMountDir)
	}
	var t client.Task
	var err error
	for round := 0; ; round++ {
		err = cerrdefs.ErrNotFound
		if !fresh || round > 0 {
			t, err = c.Task(ctx, nil)
		}
		switch {
		case err == nil:
			st, serr := t.Status(ctx)
			running := serr == nil && (st.Status == client.Running || st.Status == client.Paused || st.Status == client.Pausing)
			if running || serr == nil && st.Status == client.Created {
				ac, cerr := d.dial(ctx, name, files, connTimeout)
				if cerr == nil {
					defer ac.Close()
					if err := containerutil.CheckUser(ctx, ac, Name, name, user); err != nil {
						return backend.Sandbox{}, err
					}
					return toSandbox(info, backend.StateRunning), nil
				}
				if running || ctx.Err() != nil {
					return backend.Sandbox{}, cerr
				}
			}
			// A task that has exited (its agent died, an OOM kill of PID 1) or that
			// was never started: a new one replaces it.
			if err := deleteTask(ctx, t); err != nil && !cerrdefs.IsNotFound(err) {
				return backend.Sandbox{}, d.wrap("delete the old task of "+name, err)
			}
		case !cerrdefs.IsNotFound(err):
			return backend.Sandbox{}, d.wrap("load task "+name, err)
		case round > 0:
			// NewTask said the task exists, yet there is none: a Stop or Remove killed
			// while containerd deleted it left its shim registered. Delete it.
			if err := d.deleteStaleTask(ctx, cli, name); err != nil {
				return backend.Sandbox{}, err
			}
		}
		// A socket left by the agent of a previous task would answer nothing; the new
		// agent replaces it, but a dial must not find the stale one first.
		os.Remove(filepath.Join(sockDir, backend.AgentSocketName))
		t, err = c.NewTask(ctx, cio.NullIO)
		if err == nil {
			break
		}
		if taskExists(err) && round < 2 {
			continue // another process made the task meanwhile: wait for its agent
		}
		werr := d.wrap("create task "+name, err)
		if !errors.Is(werr, backend.ErrUnavailable) && !errors.Is(werr, backend.ErrNotFound) {
			hint := ""
			if strings.Contains(err.Error(), filepath.Dir(sockDir)) {
				// The bind mount sources exist on this host: a daemon that cannot find
				// them does not share its filesystem.
				hint = "; if containerd runs on another machine or in a VM (a forwarded socket), it cannot see berth's agent directories on this host: use a containerd on this host"
			}
			if strings.Contains(err.Error(), "io.containerd.runtime.v2.task") && strings.Contains(err.Error(), "file exists") {
				// containerd 2.x: an interrupted task create left its bundle directory
				// without a shim; no API call removes it.
				hint = "; containerd left the task's state directory of an interrupted create behind and no API call removes it: unmount and remove that directory (umount DIR/rootfs; rm -r DIR) or restart containerd, which cleans it up"
			}
			werr = backend.Errorf(backend.ErrInvalid, "containerd sandbox %s: containerd cannot create the task: %w%s%s", name, err, hint, d.profileHint())
		}
		return backend.Sandbox{}, werr
	}
	wctx, cancel := context.WithTimeoutCause(ctx, agentStartTimeout, fmt.Errorf("the agent did not answer within %s", agentStartTimeout))
	defer cancel()
	exitC, err := t.Wait(wctx)
	if err != nil {
		d.deleteTask(ctx, t)
		return backend.Sandbox{}, d.wrap("wait for task "+name, err)
	}
	if err := t.Start(ctx); err != nil {
		d.deleteTask(ctx, t)
		werr := d.wrap("start task "+name, err)
		if !errors.Is(werr, backend.ErrUnavailable) {
			werr = backend.Errorf(backend.ErrInvalid, "containerd sandbox %s: containerd cannot start the task: %w%s", name, err, d.profileHint())
		}
		return backend.Sandbox{}, werr
	}
	exited := make(chan client.ExitStatus, 1)
	go func() {
		select {
		case st := <-exitC:
			if st.Error() == nil {
				exited <- st
				cancel()
			}
		case <-wctx.Done():
		}
	}()
	c2, err := waitAgent(wctx, files)
	if err != nil {
		if errors.Is(err, backend.ErrConflict) {
			// Something other than a socket sits where the agent makes its own: the
			// agent refuses to start over it, and its log says so once it has exited.
			select {
			case st := <-exited:
				exited <- st
			case <-wctx.Done():
			}
		}
		select {
		case st := <-exited:
			d.deleteTask(ctx, t)
			return backend.Sandbox{}, backend.Errorf(backend.ErrUnavailable, "containerd sandbox %s: the task exited with status %d before its agent answered (the agent %s did not start or died at once; containerd's log may say why)%s%s", name, st.ExitCode(), backend.AgentMountDir+"/"+backend.AgentBinaryName, d.profileHint(), agentLogTail(sockDir))
		default:
		}
		d.deleteTask(ctx, t)
		if ctx.Err() != nil {
			return backend.Sandbox{}, fmt.Errorf("containerd sandbox %s: waiting for the agent: %w", name, ctx.Err())
		}
		return backend.Sandbox{}, backend.Errorf(backend.ErrUnavailable, "containerd sandbox %s: the agent in the task did not answer on %s within %s (%w); if containerd does not share this host's filesystem, berth cannot reach its agent%s", name, sockDir, agentStartTimeout, err, agentLogTail(sockDir))
	}
	defer c2.Close()
	if err := containerutil.CheckUser(ctx, c2, Name, name, user); err != nil {
		d.deleteTask(ctx, t)
		return backend.Sandbox{}, err
	}
	return toSandbox(info, backend.StateRunning), nil
}

// agentPoll is how often waitAgent looks for a new agent's socket.
const agentPoll = time.Millisecond

// waitAgent waits for the socket of a just-started agent in sockDir (a stat every
// agentPoll: the agent needs some 10 ms to start, and agent.WaitReady's back-off alone
// would add up to as much again), then connects with agent.WaitReady (with the
// sandbox's token).
func waitAgent(ctx context.Context, files backend.AgentFiles) (*agent.Client, error) {
	sock := filepath.Join(files.SocketDir, backend.AgentSocketName)
	tick := time.NewTicker(agentPoll)
	defer tick.Stop()
	for {
		if _, err := os.Lstat(sock); err == nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
			continue
		}
		break
	}
	return agent.WaitReady(ctx, agent.DialSocketDir(files.SocketDir), agent.WithTokenFrom(files.Dir))
}

// taskExists reports whether NewTask failed because a task of that id is being made
// or exists: AlreadyExists from containerd 2.x; containerd 1.6 reports the shim's
// state directory ("failed to start shim: mkdir .../ID: file exists").
func taskExists(err error) bool {
	msg := err.Error()
	return cerrdefs.IsAlreadyExists(err) || strings.Contains(msg, "already exists") ||
		strings.Contains(msg, "failed to start shim") && strings.Contains(msg, "file exists")
}

// deleteTask kills and deletes t, for a start that failed. It runs even when ctx is
// cancelled.
func (d *Driver) deleteTask(ctx context.Context, t client.Task) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	t.Kill(ctx, syscall.SIGKILL, client.WithKillAll)
	deleteTask(ctx, t)
}

// deleteTask deletes task t, killing what is left of it first (WithProcessKill).
// When that kill fails and the task has stopped, it deletes it without: gVisor's
// runsc refuses to kill a sandbox whose Sentry is gone ("sandbox is not running"),
// which a fork bomb or the host's OOM killer leaves behind, and the task must still
// go so that a new one can start.
func deleteTask(ctx context.Context, t client.Task) error {
	_, err := t.Delete(ctx, client.WithProcessKill)
	if err == nil || cerrdefs.IsNotFound(err) {
		return err
	}
	if st, serr := t.Status(ctx); serr == nil && st.Status == client.Stopped {
		if _, derr := t.Delete(ctx); derr == nil || cerrdefs.IsNotFound(derr) {
			return derr
		}
	}
	return err
}

// agentLogTail returns "; agent log: " and the end of the agent's log in sockDir, or
// "". The directory is the sandbox's to write, so the file is opened without following
// links, must be a regular file, and only its last 64 KiB are read. At most some 2 KiB
// are shown: the log's last lines, or, when the agent's Go runtime crashed (its report
// is copied into the log), the lines before the report and the report's start.
func agentLogTail(sockDir string) string {
	f, err := os.OpenFile(filepath.Join(sockDir, AgentLogName), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	const limit = 64 << 10
	off := max(fi.Size()-limit, 0)
	b := make([]byte, limit)
	n, _ := f.ReadAt(b, off)
	return formatAgentLog(string(b[:n]))
}

// formatAgentLog shortens the end of an agent's log for an error (see agentLogTail).
func formatAgentLog(log string) string {
	const show = 2048
	log = strings.ToValidUTF8(log, "?")
	var s string
	if i := crashStart(log); i >= 0 {
		report := log[i:]
		if len(report) > show*3/4 {
			report = report[:show*3/4]
			if j := strings.LastIndexByte(report, '\n'); j > 0 {
				report = report[:j]
			}
			report += "\n..."
		}
		before := strings.TrimSpace(log[:i])
		if len(before) > show/4 {
			before = before[len(before)-show/4:]
		}
		s = strings.TrimSpace(before + "\n" + strings.TrimSpace(report))
		if strings.Contains(report, "runtime.newosproc") {
			s = "the agent's Go runtime could not make a thread (is the sandbox's pids limit too low? the agent needs some 15 to 20 of its own): " + s
		}
	} else {
		s = strings.TrimSpace(log[max(len(log)-show, 0):])
	}
	if s == "" {
		return ""
	}
	return "; agent log: " + s
}

// crashStart returns where the last Go runtime crash report in log starts ("panic: ",
// "fatal error: " or, as the runtime copies it to its crash output, "runtime stack:" or
// "goroutine N [...]:" at the start of a line), or -1.
func crashStart(log string) int {
	i := strings.LastIndex(log, "\nruntime stack:\n")
	if i < 0 {
		i = strings.LastIndex(log, "\npanic: ")
	}
	if i < 0 {
		if strings.HasPrefix(log, "panic: ") || strings.HasPrefix(log, "runtime stack:\n") {
			return 0
		}
		return -1
	}
	if j := strings.LastIndex(log[:i], "\nfatal error: "); j >= 0 && i-j < 512 {
		i = j
	} else if strings.HasPrefix(log, "fatal error: ") && i < 512 {
		return 0
	}
	return i + 1
}

// agentFiles returns the host directories bind-mounted at backend.AgentMountDir (Dir)
// and backend.SocketMountDir (SocketDir) in the
// container's spec, or "".
func agentFiles(info containers.Container) backend.AgentFiles {
	var f backend.AgentFiles
	if info.Spec == nil {
		return f
	}
	var s specs.Spec
	if err := json.Unmarshal(info.Spec.GetValue(), &s); err != nil {
		return f
	}
	for _, m := range s.Mounts {
		if m.Type != "bind" {
			continue
		}
		switch m.Destination {
		case backend.SocketMountDir:
			f.SocketDir = m.Source
		case backend.AgentMountDir:
			f.Dir = m.Source
		}
	}
	return f
}

// toSandbox converts a container record.
func toSandbox(info containers.Container, state backend.State) backend.Sandbox {
	return backend.Sandbox{Name: info.ID, ID: info.ID, State: state, Labels: copyLabels(info.Labels), CreatedAt: info.CreatedAt.UTC()}
}

func copyLabels(in map[string]string) map[string]string {
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

// specOpts checks a spec and returns a function that makes the container's OCI spec
// options for its image and seccomp option (seccompOpt; nil for none), and the
// resolved default exec user. Every check that needs no daemon happens here, before
// anything is made, except reading a seccomp profile file (Create does that when it
// makes a new container).
func (d *Driver) specOpts(spec backend.SandboxSpec, a backend.AgentFiles) (func(client.Image, oci.SpecOpts) []oci.SpecOpts, string, error) {
	bad := func(format string, args ...any) (func(client.Image, oci.SpecOpts) []oci.SpecOpts, string, error) {
		return nil, "", backend.Errorf(backend.ErrInvalid, "containerd sandbox %s: "+format, append([]any{spec.Name}, args...)...)
	}
	if spec.Image == "" {
		return bad("no image: set image in the scope rule (e.g. image = \"debian:bookworm\")")
	}
	if _, err := normalizeRef(spec.Image); err != nil {
		return bad("%v", err)
	}
	if err := containerutil.CheckEnv("containerd sandbox "+spec.Name, spec.Env); err != nil {
		return nil, "", err
	}
	if spec.Workdir != "" && !filepath.IsAbs(spec.Workdir) {
		return bad("workdir %q is not an absolute path", spec.Workdir)
	}
	network := spec.Network
	switch network {
	case "":
		network = "none"
	case "none", "host":
	default:
		return nil, "", backend.Errorf(backend.ErrUnsupported, "containerd sandbox %s: network %q: the containerd driver supports %s (containerd has no network set-up of its own)", spec.Name, spec.Network, strings.Join(NetworkModes, ", "))
	}
	limits, err := containerutil.ResolveLimits(spec.Resources)
	if err != nil {
		return bad("%v", err)
	}
	user, err := containerutil.ResolveUser(spec.User)
	if err != nil {
		return bad("%v", err)
	}
	mounts := []specs.Mount{
		{Type: "bind", Source: a.Dir, Destination: backend.AgentMountDir, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		{Type: "bind", Source: a.SocketDir, Destination: backend.SocketMountDir, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		// The sandbox's own cgroups, read-only, as Docker mounts them: the agent reads
		// its memory cgroup's OOM-kill counter there (--oom-counter auto).
		{Type: "cgroup", Source: "cgroup", Destination: "/sys/fs/cgroup", Options: []string{"ro", "nosuid", "noexec", "nodev", "relatime"}},
	}
	socks := d.runtimeSockets()
	var berth []hostpaths.Dir
	if len(spec.Mounts) > 0 && !spec.AllowHostPaths {
		d.mu.Lock()
		stateDir := d.stateDir
		d.mu.Unlock()
		berth = containerutil.BerthDirs(stateDir, a)
	}
	for _, m := range spec.Mounts {
		if err := containerutil.CheckMount(m, spec.AllowHostPaths, socks, berth); err != nil {
			return bad("%v", err)
		}
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		mounts = append(mounts, specs.Mount{Type: "bind", Source: m.Source, Destination: m.Target, Options: []string{"rbind", mode}})
	}
	caps := make([]string, len(containerutil.DefaultCapabilities))
	for i, c := range containerutil.DefaultCapabilities {
		caps[i] = "CAP_" + c
	}
	// The shape of the seccomp setting is checked now; a profile file is read only
	// when a new container needs it (Create), so that a file gone missing does not
	// stop running sandboxes from being adopted.
	if err := checkSeccomp(d.seccompSetting()); err != nil {
		return nil, "", err
	}
	// The agent's token goes in its environment, never in a file of the sandbox:
	// read last, after every check of the spec and settings.
	env, err := containerutil.AgentEnv(spec.Env, a)
	if err != nil {
		return nil, "", fmt.Errorf("containerd sandbox %s: %w", spec.Name, err)
	}
	build := func(img client.Image, filter oci.SpecOpts) []oci.SpecOpts {
		opts := []oci.SpecOpts{
			oci.WithImageConfig(img),
			// The agent: root, from its read-only mount; execs run as the sandbox's
			// user (--exec-user, also in LabelUser).
			oci.WithProcessArgs(append([]string{backend.AgentMountDir + "/" + backend.AgentBinaryName}, containerutil.AgentArgs(user, "--log", backend.SocketMountDir+"/"+AgentLogName)...)...),
			oci.WithUIDGID(0, 0),
			oci.WithEnv(env),
			oci.WithHostname(spec.Name),
			oci.WithMounts(mounts),
			oci.WithCapabilities(caps),
			oci.WithNoNewPrivileges,
			oci.WithPidsLimit(limits.Pids),
			oci.WithCPUShares(uint64(limits.CPUShares)),
		}
		if spec.Workdir != "" {
			opts = append(opts, oci.WithProcessCwd(spec.Workdir))
		}
		if limits.MemoryBytes > 0 {
			opts = append(opts, oci.WithMemoryLimit(uint64(limits.MemoryBytes)), oci.WithMemorySwap(limits.MemoryBytes))
		}
		if limits.NanoCPUs > 0 {
			const period = 100000 // µs, the kernel's default CFS period
			opts = append(opts, oci.WithCPUCFS(limits.NanoCPUs*period/1e9, period))
		}
		if network == "host" {
			opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostHostsFile, oci.WithHostResolvconf)
		}
		// Last: the default profiles allow the syscalls that the capabilities above need.
		if filter != nil {
			opts = append(opts, filter)
		}
		return opts
	}
	return build, user, nil
}

// checkRuntimeNetwork refuses a network mode the spec's runtime lacks
// (GVisorNetworkModes for gVisor). Error: ErrUnsupported naming both.
func checkRuntimeNetwork(spec backend.SandboxSpec, binary string) error {
	if spec.Runtime == "" || !containerutil.IsGVisor(spec.Runtime, binary) || spec.Network == "" || slices.Contains(GVisorNetworkModes, spec.Network) {
		return nil
	}
	return backend.Errorf(backend.ErrUnsupported, "containerd sandbox %s: network %q: under runtime %s (gVisor) the containerd driver supports %s; remove network from the rule, or use the docker driver, whose runsc has docker's network modes", spec.Name, spec.Network, spec.Runtime, strings.Join(GVisorNetworkModes, ", "))
}

// runtimeOptions returns the runc shim's options for OCI runtime name, whose binary
// is binary: nil for the default (runc), else the shim runs binary in runc's place
// (BinaryName) with its state under /run/containerd/NAME rather than runc's
// /run/containerd/runc, as Docker Engine does for a runtime added with
// --add-runtime. The runsc shim (containerd-shim-runsc-v1) is not used: containerd
// 1.6 cannot start it, and it sets its own oom_score_adj, which needs
// CAP_SYS_RESOURCE (docs/gvisor.md).
func runtimeOptions(name, binary string) any {
	if name == "" {
		return nil
	}
	return &options.Options{BinaryName: binary, Root: "/run/containerd/" + name}
}

// runtimeSockets lists the runtime sockets a mount must not expose
// (containerutil.RuntimeSockets): the daemon in use and the well-known ones.
func (d *Driver) runtimeSockets() []containerutil.Socket {
	var inUse []containerutil.Socket
	if p, err := socketPath(d.settings().address); err == nil {
		inUse = append(inUse, containerutil.Socket{Path: p, What: "containerd socket"})
	}
	return containerutil.RuntimeSockets(inUse...)
}
