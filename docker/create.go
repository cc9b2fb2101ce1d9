package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/containerutil"
)

// agentStartTimeout bounds how long Create waits for the agent of a started container
// to answer.
const agentStartTimeout = 30 * time.Second

// removeTimeout bounds the clean-up of a failed Create.
const removeTimeout = 30 * time.Second

// Create makes the sandbox's container and starts it with the agent as PID 1, or adopts
// the container of that name when it carries the same owner label (starting it when
// stopped). A container of that name that is not ours is ErrConflict and is never
// touched. A failed Create of a new container removes it.
func (d *Driver) Create(ctx context.Context, req backend.CreateRequest) (backend.Sandbox, error) {
	spec := req.Spec
	if err := backend.ValidateSandboxName(spec.Name); err != nil {
		return backend.Sandbox{}, err
	}
	if err := containerutil.CheckAgent(Name, spec.Name, req.Agent); err != nil {
		return backend.Sandbox{}, err
	}
	cfg, hcfg, user, err := d.containerConfig(spec, req.Agent)
	if err != nil {
		return backend.Sandbox{}, err
	}
	api, err := d.api()
	if err != nil {
		return backend.Sandbox{}, err
	}
	lk := d.creating.Lock(spec.Name) // other processes: settled by the engine (names are unique; the loser adopts)
	lk.Lock()
	defer lk.Unlock()

	for attempt := 0; ; attempt++ {
		info, err := api.ContainerInspect(ctx, spec.Name)
		if err == nil {
			return d.adopt(ctx, spec, info)
		}
		if err = d.wrap("inspect container "+spec.Name, err); !errors.Is(err, backend.ErrNotFound) {
			return backend.Sandbox{}, err
		}
		resp, err := api.ContainerCreate(ctx, cfg, hcfg, nil, nil, spec.Name)
		if err != nil && ctx.Err() != nil {
			// The request was cancelled, but the engine may have made the container
			// all the same: nothing of this name was there before (the inspect
			// above, under the name's lock), so one of ours now is this call's.
			d.removeAbandoned(ctx, spec)
			return backend.Sandbox{}, d.wrap("create container "+spec.Name, err)
		}
		if err != nil {
			werr := d.wrap("create container "+spec.Name, err)
			if errors.Is(werr, backend.ErrConflict) && attempt < 3 {
				continue // another process created it meanwhile: adopt it
			}
			if rerr := remoteEngine(spec.Name, d.engineHost(), req.Agent, err); rerr != nil {
				return backend.Sandbox{}, rerr
			}
			if spec.Runtime != "" && strings.Contains(err.Error(), "runtime") {
				if cerr := d.checkRuntime(ctx, spec); cerr != nil {
					return backend.Sandbox{}, cerr
				}
			}
			if errors.Is(werr, backend.ErrNotFound) && strings.Contains(strings.ToLower(err.Error()), "image") {
				return backend.Sandbox{}, backend.Errorf(backend.ErrNotFound, "docker sandbox %s: image %q is not in the Docker Engine at %s (%w); pull it (berth pulls before create unless the rule says pull = \"never\") or load it (berth image import FILE --driver docker)", spec.Name, spec.Image, d.engineHost(), err)
			}
			return backend.Sandbox{}, werr
		}
		sb, err := d.start(ctx, spec.Name, resp.ID, user)
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
			api.ContainerRemove(rctx, resp.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
			cancel()
			return backend.Sandbox{}, err
		}
		return sb, nil
	}
}

// Validate implements backend.Validator (Capabilities.Validate, for `berth config
// check`): it checks spec as Create does before it asks the engine anything: the
// sandbox name and containerConfig's checks (image set, env, workdir, network,
// resources, the user's form, mounts under the host-path policy), and, for a spec
// that names a runtime, that the engine has it (`docker info`, the one API call it
// makes). It does not check that the image is there, nor that a user name exists in
// it (the agent resolves that at Create). Errors wrap backend.ErrInvalid
// (backend.ErrUnsupported for a network or runtime the engine lacks) and name the
// input.
func (d *Driver) Validate(ctx context.Context, spec backend.SandboxSpec) error {
	if err := backend.ValidateSandboxName(spec.Name); err != nil {
		return err
	}
	if _, _, _, err := d.containerConfig(spec, backend.AgentFiles{}); err != nil {
		return err
	}
	return d.checkRuntime(ctx, spec)
}

// checkRuntime checks that the engine knows spec.Runtime (`docker info`'s Runtimes),
// so that `berth config check` says so before any sandbox is made. Error:
// ErrUnsupported naming the runtimes the engine has and how to register one.
func (d *Driver) checkRuntime(ctx context.Context, spec backend.SandboxSpec) error {
	if spec.Runtime == "" {
		return nil
	}
	paths, _, err := d.engineRuntimes(ctx)
	if err != nil {
		return err
	}
	if _, ok := paths[spec.Runtime]; ok {
		return nil
	}
	return d.unknownRuntime(spec, slices.Sorted(maps.Keys(paths)))
}

// unknownRuntime is the error for a spec whose runtime the engine lacks.
func (d *Driver) unknownRuntime(spec backend.SandboxSpec, have []string) error {
	return backend.Errorf(backend.ErrUnsupported, "docker sandbox %s: the Docker Engine at %s has no runtime %q (it has %s); register it: dockerd --add-runtime %s=/path/to/runsc (or \"runtimes\": {%q: {\"path\": \"/path/to/runsc\", \"runtimeArgs\": [\"--host-uds=create\", \"--overlay2=none\"]}} in daemon.json) and restart dockerd; install runsc as docs/gvisor.md says",
		spec.Name, d.engineHost(), spec.Runtime, strings.Join(have, ", "), spec.Runtime, spec.Runtime)
}

// remoteEngine recognises the engine's answer to a create whose agent or socket dir
// it cannot find: the engine does not share this host's filesystem (it runs in a VM
// or on another machine, reached through a forwarded socket), so no agent could be
// reached. It returns nil for any other error.
func remoteEngine(name, host string, a backend.AgentFiles, err error) error {
	msg := err.Error()
	if !strings.Contains(msg, "bind source path does not exist") {
		return nil
	}
	for _, dir := range []string{a.Dir, a.SocketDir} {
		if strings.Contains(msg, dir) {
			return backend.Errorf(backend.ErrInvalid, "docker sandbox %s: the Docker Engine at %s cannot see %s, which exists on this host: it runs on another machine or in a VM (a forwarded socket, a tcp or ssh tunnel), and berth's agent needs an engine on this host that shares its filesystem; point host (or DOCKER_HOST) at a local engine's socket", name, host, dir)
		}
	}
	return nil
}

// removeAbandoned removes the container of spec's name, on a fresh bounded context,
// when it carries spec's owner label: what the engine made for a create request whose
// client went away before the answer.
func (d *Driver) removeAbandoned(ctx context.Context, spec backend.SandboxSpec) {
	api, err := d.api()
	if err != nil {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()
	info, err := api.ContainerInspect(rctx, spec.Name)
	if err != nil || info.Config == nil || info.Config.Labels[backend.LabelOwner] != spec.Labels[backend.LabelOwner] {
		return
	}
	api.ContainerRemove(rctx, info.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
}

// adopt takes over an existing container of the spec's name when it is ours.
func (d *Driver) adopt(ctx context.Context, spec backend.SandboxSpec, info container.InspectResponse) (backend.Sandbox, error) {
	var labels map[string]string
	if info.Config != nil {
		labels = info.Config.Labels
	}
	have, ok := labels[backend.LabelOwner]
	if !ok || have != spec.Labels[backend.LabelOwner] {
		who := "it has no berth.owner label (not made by berth)"
		if ok {
			who = fmt.Sprintf("it belongs to berth owner %q, not %q", have, spec.Labels[backend.LabelOwner])
		}
		return backend.Sandbox{}, backend.Errorf(backend.ErrConflict, "docker sandbox %s: a container of that name exists and %s; berth leaves it alone: remove or rename it, or use another session", spec.Name, who)
	}
	if info.State != nil && info.State.Running {
		files := agentFiles(info)
		cctx, cancel := context.WithTimeout(ctx, connTimeout)
		c, err := agent.WaitReady(cctx, agent.DialSocketDir(files.SocketDir), agent.WithTokenFrom(files.Dir))
		cancel()
		if err != nil {
			return backend.Sandbox{}, fmt.Errorf("docker sandbox %s: %w", spec.Name, err)
		}
		c.Close()
		sb := toSandbox(info)
		sb.Adopted = true
		return sb, nil
	}
	sb, err := d.start(ctx, spec.Name, info.ID, labels[LabelUser])
	if err != nil {
		return backend.Sandbox{}, err
	}
	sb.Adopted = true
	sb.EndReason, sb.EndMessage = endOf(info.State) // why the run before this start ended
	return sb, nil
}

// start starts container id (created or stopped), waits for its agent and checks
// its default user. When the container exits before its agent answers, the error
// carries the end of its log.
func (d *Driver) start(ctx context.Context, name, id, user string) (backend.Sandbox, error) {
	api, err := d.api()
	if err != nil {
		return backend.Sandbox{}, err
	}
	info, err := api.ContainerInspect(ctx, id)
	if err != nil {
		return backend.Sandbox{}, d.wrap("inspect container "+name, err)
	}
	files := agentFiles(info)
	sockDir := files.SocketDir
	if sockDir == "" {
		return backend.Sandbox{}, backend.Errorf(backend.ErrConflict, "docker sandbox %s: the container has no %s mount; it was not made by this driver: remove it", name, backend.SocketMountDir)
	}
	if !info.State.Running {
		// A socket left by the agent before the container stopped would answer nothing;
		// the new agent replaces it, but a dial must not find the stale one first.
		os.Remove(filepath.Join(sockDir, backend.AgentSocketName))
		if err := api.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
			werr := d.wrap("start container "+name, err)
			if !errors.Is(werr, backend.ErrUnavailable) && !errors.Is(werr, backend.ErrNotFound) {
				werr = backend.Errorf(backend.ErrInvalid, "docker sandbox %s: the engine cannot start the container: %w", name, err)
			}
			return backend.Sandbox{}, werr
		}
	}
	wctx, cancel := context.WithTimeoutCause(ctx, agentStartTimeout, fmt.Errorf("the agent did not answer within %s", agentStartTimeout))
	defer cancel()
	exited := make(chan struct{})
	go func() {
		waitC, errC := api.ContainerWait(wctx, id, container.WaitConditionNotRunning)
		select {
		case <-waitC:
			close(exited)
			cancel()
		case <-errC:
		case <-wctx.Done():
		}
	}()
	c, err := agent.WaitReady(wctx, agent.DialSocketDir(sockDir), agent.WithTokenFrom(files.Dir))
	if err != nil {
		if errors.Is(err, backend.ErrConflict) {
			// Something other than a socket sits where the agent makes its own: the
			// agent refuses to start over it, and its log says so once it has exited.
			select {
			case <-exited:
			case <-wctx.Done():
			}
		}
		select {
		case <-exited:
			return backend.Sandbox{}, backend.Errorf(backend.ErrUnavailable, "docker sandbox %s: the container exited before its agent answered%s", name, d.logTail(id))
		default:
		}
		if ctx.Err() != nil {
			return backend.Sandbox{}, fmt.Errorf("docker sandbox %s: waiting for the agent: %w", name, ctx.Err())
		}
		return backend.Sandbox{}, backend.Errorf(backend.ErrUnavailable, "docker sandbox %s: the agent in the container did not answer on %s within %s (%w); if the engine does not share this host's filesystem (a socket forwarded from a VM or another machine), berth cannot reach its agent%s", name, sockDir, agentStartTimeout, err, d.logTail(id))
	}
	defer c.Close()
	if err := containerutil.CheckUser(ctx, c, Name, name, user); err != nil {
		return backend.Sandbox{}, err
	}
	info, err = api.ContainerInspect(ctx, id)
	if err != nil {
		return backend.Sandbox{}, d.wrap("inspect container "+name, err)
	}
	return toSandbox(info), nil
}

// logTail returns ": " and the last lines of the container's log, or "".
func (d *Driver) logTail(id string) string {
	api, err := d.api()
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rc, err := api.ContainerLogs(ctx, id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: "20"})
	if err != nil {
		return ""
	}
	defer rc.Close()
	b, _ := io.ReadAll(io.LimitReader(rc, 4096))
	// The multiplexed stream has an 8-byte header per frame; keep printable text.
	var sb strings.Builder
	for i := 0; i < len(b); {
		if i+8 <= len(b) && (b[i] == 1 || b[i] == 2) && b[i+1] == 0 && b[i+2] == 0 && b[i+3] == 0 {
			n := int(b[i+4])<<24 | int(b[i+5])<<16 | int(b[i+6])<<8 | int(b[i+7])
			i += 8
			end := min(i+n, len(b))
			sb.Write(b[i:end])
			i = end
			continue
		}
		sb.WriteByte(b[i])
		i++
	}
	s := strings.TrimSpace(sb.String())
	if s == "" {
		return ""
	}
	return "; container log: " + s
}

// agentFiles returns the host directories of the container's agent: the ones mounted
// at backend.AgentMountDir (Dir, with the token) and backend.SocketMountDir
// (SocketDir); "" for a mount the container lacks.
func agentFiles(info container.InspectResponse) backend.AgentFiles {
	var f backend.AgentFiles
	for _, m := range info.Mounts {
		if m.Type != mount.TypeBind {
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

// toSandbox converts an inspect response.
func toSandbox(info container.InspectResponse) backend.Sandbox {
	sb := backend.Sandbox{Name: strings.TrimPrefix(info.Name, "/"), ID: info.ID, State: backend.StateStopped}
	if info.Config != nil {
		sb.Labels = copyLabels(info.Config.Labels)
	}
	if info.State != nil {
		switch {
		case info.State.Running:
			sb.State = backend.StateRunning
		case info.State.Status == container.StateCreated:
			sb.State = backend.StateCreated
		}
	}
	if t, err := time.Parse(time.RFC3339Nano, info.Created); err == nil {
		sb.CreatedAt = t
	}
	if sb.State == backend.StateStopped {
		sb.EndReason, sb.EndMessage = endOf(info.State)
	}
	return sb
}

// endOf says why a container that is not running ended, from the engine's state,
// as backend.Sandbox's EndReason and EndMessage: OOMKilled when the engine saw an
// OOM kill in the container and its agent died (a non-zero exit; the flag alone
// may be a command's OOM kill that the agent outlived), Error for another non-zero
// exit (137 is SIGKILL), empty for status 0: the agent exits 0 when berth's Stop
// asks it to, so the engine's state does not tell a clean exit from a stop. Empty
// for a container that never ran, or runs.
func endOf(st *container.State) (reason, message string) {
	if st == nil || st.Running || st.ExitCode == 0 || st.FinishedAt == "" || strings.HasPrefix(st.FinishedAt, "0001-") {
		return "", ""
	}
	msg := fmt.Sprintf("the sandbox's agent exited with status %d", st.ExitCode)
	if st.ExitCode > 128 && st.ExitCode < 128+65 {
		msg = fmt.Sprintf("the sandbox's agent was killed by signal %d (exit status %d)", st.ExitCode-128, st.ExitCode)
	}
	if st.Error != "" {
		msg += ": " + st.Error
	}
	if st.OOMKilled {
		return backend.EndOOMKilled, backend.SanitizeEndMessage(msg)
	}
	return backend.EndError, backend.SanitizeEndMessage(msg)
}

func copyLabels(in map[string]string) map[string]string {
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

// containerConfig turns a spec into the container's config, and returns the
// resolved default exec user.
func (d *Driver) containerConfig(spec backend.SandboxSpec, a backend.AgentFiles) (*container.Config, *container.HostConfig, string, error) {
	bad := func(format string, args ...any) (*container.Config, *container.HostConfig, string, error) {
		return nil, nil, "", backend.Errorf(backend.ErrInvalid, "docker sandbox %s: "+format, append([]any{spec.Name}, args...)...)
	}
	if spec.Image == "" {
		return bad("no image: set image in the scope rule (e.g. image = \"debian:bookworm\")")
	}
	if err := containerutil.CheckEnv("docker sandbox "+spec.Name, spec.Env); err != nil {
		return nil, nil, "", err
	}
	if spec.Workdir != "" && !filepath.IsAbs(spec.Workdir) {
		return bad("workdir %q is not an absolute path", spec.Workdir)
	}
	network := spec.Network
	switch network {
	case "":
		network = "none"
	case "none", "bridge", "host":
	default:
		return nil, nil, "", backend.Errorf(backend.ErrUnsupported, "docker sandbox %s: network %q: the docker driver supports %s", spec.Name, spec.Network, strings.Join(NetworkModes, ", "))
	}
	limits, err := containerutil.ResolveLimits(spec.Resources)
	if err != nil {
		return bad("%v", err)
	}
	user, err := containerutil.ResolveUser(spec.User)
	if err != nil {
		return bad("%v", err)
	}
	mounts := []mount.Mount{
		{Type: mount.TypeBind, Source: a.Dir, Target: backend.AgentMountDir, ReadOnly: true},
		{Type: mount.TypeBind, Source: a.SocketDir, Target: backend.SocketMountDir},
	}
	for _, m := range spec.Mounts {
		if err := d.checkMount(m, spec.AllowHostPaths, a); err != nil {
			return bad("%v", err)
		}
		mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	labels := copyLabels(spec.Labels)
	if user != "" {
		labels[LabelUser] = user
	}
	// The agent's token goes in its environment, never in a file of the sandbox.
	env, err := containerutil.AgentEnv(spec.Env, a)
	if err != nil {
		return nil, nil, "", fmt.Errorf("docker sandbox %s: %w", spec.Name, err)
	}
	cfg := &container.Config{
		Image:      spec.Image,
		Env:        env,
		WorkingDir: spec.Workdir,
		Labels:     labels,
		User:       "0:0", // the agent; execs run as the sandbox's user (--exec-user)
		Entrypoint: []string{backend.AgentMountDir + "/" + backend.AgentBinaryName},
		Cmd:        containerutil.AgentArgs(user),
	}
	hcfg := &container.HostConfig{
		Runtime:     spec.Runtime,
		NetworkMode: container.NetworkMode(network),
		Mounts:      mounts,
		CapDrop:     []string{"ALL"},
		CapAdd:      append([]string(nil), containerutil.DefaultCapabilities...),
		SecurityOpt: []string{"no-new-privileges"},
		LogConfig:   container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "1m", "max-file": "1"}},
		Resources: container.Resources{
			PidsLimit: &limits.Pids,
			NanoCPUs:  limits.NanoCPUs,
			CPUShares: limits.CPUShares,
		},
	}
	if limits.MemoryBytes > 0 {
		hcfg.Resources.Memory = limits.MemoryBytes
		hcfg.Resources.MemorySwap = limits.MemoryBytes
	}
	return cfg, hcfg, user, nil
}
