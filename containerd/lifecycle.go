package containerd

import (
	"context"
	"errors"
	"fmt"
	"time"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
)

// DefaultStopGrace is Stop's grace when the caller passes 0.
const DefaultStopGrace = time.Second

// connTimeout bounds connecting to the agent of a running task.
const connTimeout = 10 * time.Second

// killTimeout bounds waiting for a task to exit after SIGKILL. The kernel ends a
// killed tree at once, but containerd and its shim report it only when they run: on a
// machine with tens of runnable threads per CPU that took more than 10 s. A task
// still there after a minute is stuck (a process in uninterruptible sleep), and the
// error says so.
const killTimeout = time.Minute

// load returns the container record of sandbox name.
func (d *Driver) load(ctx context.Context, name string) (*client.Client, context.Context, client.Container, containers.Container, error) {
	if err := backend.ValidateSandboxName(name); err != nil {
		return nil, ctx, nil, containers.Container{}, err
	}
	cli, nctx, err := d.api(ctx)
	if err != nil {
		return nil, ctx, nil, containers.Container{}, err
	}
	c, err := cli.LoadContainer(nctx, name)
	if err != nil {
		return cli, nctx, nil, containers.Container{}, d.wrap("load container "+name, err)
	}
	info, err := c.Info(nctx, client.WithoutRefreshedMetadata)
	if err != nil {
		return cli, nctx, nil, containers.Container{}, d.wrap("load container "+name, err)
	}
	return cli, nctx, c, info, nil
}

// ours reports an error unless the container carries a berth owner label: the driver
// never stops or removes anything else.
func (d *Driver) ours(name string, info containers.Container) error {
	if _, ok := info.Labels[backend.LabelOwner]; ok {
		return nil
	}
	return backend.Errorf(backend.ErrConflict, "containerd sandbox %s: the container of that id in namespace %s has no berth.owner label (not made by berth); berth leaves it alone", name, d.settings().namespace)
}

// stateOf maps a task status to a sandbox state; no task is stopped.
func stateOf(p *tasktypes.Process) backend.State {
	if p == nil {
		return backend.StateStopped
	}
	switch p.Status {
	case tasktypes.Status_RUNNING, tasktypes.Status_PAUSED, tasktypes.Status_PAUSING:
		return backend.StateRunning
	case tasktypes.Status_CREATED:
		return backend.StateCreated
	}
	return backend.StateStopped
}

// endOf says why the task p ended, as backend.Sandbox's EndReason and EndMessage:
// Stop deletes the task it ends, so a task that is there and stopped ended without
// berth (its agent exited or was killed: exit status 137 is SIGKILL, also the OOM
// killer's, which the task's status does not tell apart). Empty for no task or one
// that runs.
func endOf(p *tasktypes.Process) (reason, message string) {
	if p == nil || p.Status != tasktypes.Status_STOPPED {
		return "", ""
	}
	if p.ExitStatus == 0 {
		return backend.EndCompleted, "the sandbox's agent exited with status 0"
	}
	msg := fmt.Sprintf("the sandbox's agent exited with status %d", p.ExitStatus)
	if p.ExitStatus > 128 && p.ExitStatus < 128+65 {
		msg = fmt.Sprintf("the sandbox's agent was killed by signal %d (exit status %d; SIGKILL may be the OOM killer's)", p.ExitStatus-128, p.ExitStatus)
	}
	return backend.EndError, msg
}

// taskSandbox converts a container record and its task (nil for none).
func taskSandbox(info containers.Container, p *tasktypes.Process) backend.Sandbox {
	sb := toSandbox(info, stateOf(p))
	sb.EndReason, sb.EndMessage = endOf(p)
	return sb
}

// taskOf returns the task of container id, nil when it has none.
func (d *Driver) taskOf(ctx context.Context, cli *client.Client, id string) (*tasktypes.Process, error) {
	r, err := cli.TaskService().Get(ctx, &tasksapi.GetRequest{ContainerID: id})
	if err != nil {
		if err = errgrpc.ToNative(err); cerrdefs.IsNotFound(err) {
			return nil, nil
		}
		return nil, d.wrap("get task "+id, err)
	}
	return r.GetProcess(), nil
}

// Inspect returns the sandbox's state (running while its task runs, stopped when it
// has none or it exited), or ErrNotFound.
func (d *Driver) Inspect(ctx context.Context, name string) (backend.Sandbox, error) {
	cli, nctx, _, info, err := d.load(ctx, name)
	if err != nil {
		return backend.Sandbox{}, err
	}
	p, err := d.taskOf(nctx, cli, name)
	if err != nil {
		return backend.Sandbox{}, err
	}
	return taskSandbox(info, p), nil
}

// List returns berth's containers in the namespace (those with a berth.owner label)
// whose labels contain filter.
func (d *Driver) List(ctx context.Context, filter map[string]string) ([]backend.Sandbox, error) {
	cli, nctx, err := d.api(ctx)
	if err != nil {
		return nil, err
	}
	list, err := cli.ContainerService().List(nctx, `labels."`+backend.LabelOwner+`"`)
	if err != nil {
		return nil, d.wrap("list containers", err)
	}
	r, err := cli.TaskService().List(nctx, &tasksapi.ListTasksRequest{})
	if err != nil {
		return nil, d.wrap("list tasks", errgrpc.ToNative(err))
	}
	tasks := map[string]*tasktypes.Process{}
	for _, p := range r.GetTasks() {
		// A task's id is its container's; ContainerID is empty in some versions.
		id := p.GetContainerID()
		if id == "" {
			id = p.GetID()
		}
		tasks[id] = p
	}
	var out []backend.Sandbox
	for _, c := range list {
		if !backend.MatchLabels(c.Labels, filter) {
			continue
		}
		out = append(out, taskSandbox(c, tasks[c.ID]))
	}
	return out, nil
}

// Stop asks the agent to end every process (SIGTERM, SIGKILL after grace) and exit,
// kills the task if it still runs, and deletes the task. The container and its
// snapshot stay. A missing or stopped sandbox succeeds.
func (d *Driver) Stop(ctx context.Context, name string, grace time.Duration) error {
	if grace <= 0 {
		grace = DefaultStopGrace
	}
	cli, nctx, c, info, err := d.load(ctx, name)
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := d.ours(name, info); err != nil {
		return err
	}
	t, err := c.Task(nctx, nil)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			// A Stop or Remove killed while containerd deleted the task may have left
			// its shim registered (see deleteStaleTask).
			return d.deleteStaleTask(nctx, cli, name)
		}
		return d.wrap("load task "+name, err)
	}
	st, err := t.Status(nctx)
	if err != nil && !cerrdefs.IsNotFound(err) {
		return d.wrap("task status "+name, err)
	}
	if st.Status == client.Running || st.Status == client.Paused || st.Status == client.Pausing {
		sctx, cancel := context.WithTimeout(nctx, grace+3*time.Second)
		exitC, werr := t.Wait(sctx)
		if agent.Shutdown(sctx, agentFiles(info), grace) == nil && werr == nil {
			// The agent exits after answering: wait for the task to end.
			select {
			case <-exitC:
			case <-sctx.Done():
			}
		}
		cancel()
	}
	// Whatever still runs (an agent that did not answer) is killed; then the task is
	// deleted, which keeps the container and its snapshot.
	return d.killDelete(nctx, name, t)
}

// killDelete kills every process of task t, waits for it to exit and deletes it. A
// task already gone succeeds.
func (d *Driver) killDelete(ctx context.Context, name string, t client.Task) error {
	kctx, cancel := context.WithTimeout(ctx, killTimeout)
	defer cancel()
	if err := deleteTask(kctx, t); err != nil && !cerrdefs.IsNotFound(err) {
		if ctx.Err() == nil && kctx.Err() != nil {
			return backend.Errorf(backend.ErrTimeout, "containerd sandbox %s: the task did not end within %s of SIGKILL", name, killTimeout)
		}
		return d.wrap("delete task "+name, err)
	}
	return nil
}

// Remove kills and deletes the sandbox's task (or the stale task that a killed Stop or
// Remove left), then deletes its container record and then its snapshot. A missing
// sandbox succeeds.
func (d *Driver) Remove(ctx context.Context, name string) error { return d.remove(ctx, name, true) }

// RemoveUnowned removes container name of the driver's namespace with its task and
// snapshot whatever its labels, as Remove does berth's own; a missing container
// succeeds. berth never calls it: it is for the conformance suite's
// Options.RemoveUnowned, which cleans up the sandbox without an owner label that
// retention/reconcile-leaves-others plants (containerd drops empty label values, so
// that sandbox has no owner label at all, and Remove rightly refuses it).
func (d *Driver) RemoveUnowned(ctx context.Context, name string) error {
	return d.remove(ctx, name, false)
}

// remove is Remove; with owned it refuses a container without our owner label. It
// holds the sandbox's cross-process lock (lockFile) while it works, so it never
// deletes a container that a Create in another process is making or starting, and
// when it succeeds it deletes the lock file as it lets go of it: a driver state dir
// keeps no lock file per sandbox ever made.
func (d *Driver) remove(ctx context.Context, name string, owned bool) (err error) {
	if err := backend.ValidateSandboxName(name); err != nil {
		return err // before the name makes a lock path
	}
	fl, err := d.lockFile(ctx, name, backend.AgentFiles{})
	if err != nil {
		return err
	}
	if fl != nil {
		defer func() { fl.Unlock(err == nil) }()
	}
	cli, nctx, c, info, err := d.load(ctx, name)
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if owned {
		if err := d.ours(name, info); err != nil {
			return err
		}
	}
	t, err := c.Task(nctx, nil)
	switch {
	case err == nil:
		if err := d.killDelete(nctx, name, t); err != nil {
			return err
		}
	case cerrdefs.IsNotFound(err):
		if err := d.deleteStaleTask(nctx, cli, name); err != nil {
			return err
		}
	default:
		return d.wrap("load task "+name, err)
	}
	return d.deleteContainer(nctx, cli, c, info)
}

// deleteContainer deletes the record of container c (which has no task), then its
// snapshot: in that order, so that a call killed in between leaves a snapshot without
// a container (which containerd's garbage collector removes, and Create removes under
// its lock), never a container without its snapshot.
func (d *Driver) deleteContainer(ctx context.Context, cli *client.Client, c client.Container, info containers.Container) error {
	if err := c.Delete(ctx); err != nil && !cerrdefs.IsNotFound(err) {
		return d.wrap("delete container "+c.ID(), err)
	}
	if info.SnapshotKey == "" || info.Snapshotter == "" {
		return nil
	}
	if err := cli.SnapshotService(info.Snapshotter).Remove(ctx, info.SnapshotKey); err != nil && !cerrdefs.IsNotFound(err) {
		return d.wrap("remove snapshot "+info.SnapshotKey, err)
	}
	return nil
}

// deleteStaleTask deletes, through the tasks service, a task of container id that
// containerd no longer reports but whose shim it still holds: what a client killed
// while containerd deleted the task leaves (the daemon stops the delete half-way when
// the call is cancelled). Such a task is not found by Get or List, yet NewTask says it
// "already exists" and its shim process lives on. The client's Task never gets that
// far (it loads the task first), so the service's Delete is called directly; it
// reports not found even when it cleaned up, and not found is success.
func (d *Driver) deleteStaleTask(ctx context.Context, cli *client.Client, id string) error {
	kctx, cancel := context.WithTimeout(ctx, killTimeout)
	defer cancel()
	_, err := cli.TaskService().Delete(kctx, &tasksapi.DeleteTaskRequest{ContainerID: id})
	if err = errgrpc.ToNative(err); err != nil && !cerrdefs.IsNotFound(err) {
		return d.wrap("delete the stale task of "+id, err)
	}
	return nil
}

// dial connects to the agent of files (a running task's), with the sandbox's token,
// waiting up to timeout for it to answer.
func (d *Driver) dial(ctx context.Context, name string, files backend.AgentFiles, timeout time.Duration) (*agent.Client, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := agent.WaitReady(cctx, agent.DialSocketDir(files.SocketDir), agent.WithTokenFrom(files.Dir))
	if err != nil {
		return nil, fmt.Errorf("containerd sandbox %s: %w", name, err)
	}
	return c, nil
}
