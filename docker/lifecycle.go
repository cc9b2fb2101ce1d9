package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
)

// DefaultStopGrace is Stop's grace when the caller passes 0.
const DefaultStopGrace = time.Second

// connTimeout bounds connecting to the agent of a running container.
const connTimeout = 10 * time.Second

// inspect returns the container named exactly name. The engine also resolves ids and
// id prefixes; a container found that way under another name is not ours to address
// by this name, so it is ErrNotFound.
func (d *Driver) inspect(ctx context.Context, name string) (container.InspectResponse, error) {
	if err := backend.ValidateSandboxName(name); err != nil {
		return container.InspectResponse{}, err
	}
	api, err := d.api()
	if err != nil {
		return container.InspectResponse{}, err
	}
	info, err := api.ContainerInspect(ctx, name)
	if err != nil {
		return info, d.wrap("inspect container "+name, err)
	}
	if strings.TrimPrefix(info.Name, "/") != name {
		return container.InspectResponse{}, backend.Errorf(backend.ErrNotFound, "docker sandbox %s: no container of that name", name)
	}
	return info, nil
}

// ours reports an error unless the container carries a berth owner label: the driver
// never stops or removes anything else.
func ours(name string, info container.InspectResponse) error {
	if info.Config != nil {
		if _, ok := info.Config.Labels[backend.LabelOwner]; ok {
			return nil
		}
	}
	return backend.Errorf(backend.ErrConflict, "docker sandbox %s: the container of that name has no berth.owner label (not made by berth); berth leaves it alone", name)
}

// Inspect returns the sandbox's state, or ErrNotFound.
func (d *Driver) Inspect(ctx context.Context, name string) (backend.Sandbox, error) {
	info, err := d.inspect(ctx, name)
	if err != nil {
		return backend.Sandbox{}, err
	}
	return toSandbox(info), nil
}

// List returns berth's containers (those with a berth.owner label) whose labels
// contain filter.
func (d *Driver) List(ctx context.Context, filter map[string]string) ([]backend.Sandbox, error) {
	api, err := d.api()
	if err != nil {
		return nil, err
	}
	args := filters.NewArgs(filters.Arg("label", backend.LabelOwner))
	for k, v := range filter {
		args.Add("label", k+"="+v)
	}
	list, err := api.ContainerList(ctx, container.ListOptions{All: true, Filters: args})
	if err != nil {
		return nil, d.wrap("list containers", err)
	}
	var out []backend.Sandbox
	for _, c := range list {
		if !backend.MatchLabels(c.Labels, filter) || len(c.Names) == 0 {
			continue
		}
		sb := backend.Sandbox{Name: strings.TrimPrefix(c.Names[0], "/"), ID: c.ID, State: backend.StateStopped, Labels: copyLabels(c.Labels), CreatedAt: time.Unix(c.Created, 0).UTC()}
		switch c.State {
		case container.StateRunning, container.StateRestarting, container.StatePaused:
			sb.State = backend.StateRunning
		case container.StateCreated:
			sb.State = backend.StateCreated
		}
		out = append(out, sb)
	}
	return out, nil
}

// Stop asks the agent to end every process (SIGTERM, SIGKILL after grace) and exit,
// then kills the container if it still runs. The container and its filesystem stay.
// A missing or stopped sandbox succeeds.
func (d *Driver) Stop(ctx context.Context, name string, grace time.Duration) error {
	if grace <= 0 {
		grace = DefaultStopGrace
	}
	info, err := d.inspect(ctx, name)
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := ours(name, info); err != nil {
		return err
	}
	if !info.State.Running {
		return nil
	}
	api, err := d.api()
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, grace+3*time.Second)
	if agent.Shutdown(sctx, agentFiles(info), grace) == nil {
		// The agent exits after answering: wait for the container to stop.
		waitC, errC := api.ContainerWait(sctx, info.ID, container.WaitConditionNotRunning)
		select {
		case <-waitC:
		case <-errC:
		}
	}
	cancel()
	// Whatever still runs (an agent that did not answer) is killed; a stopped
	// container makes this a no-op.
	zero := 0
	if err := api.ContainerStop(ctx, info.ID, container.StopOptions{Signal: "SIGKILL", Timeout: &zero}); err != nil {
		if werr := d.wrap("stop container "+name, err); !errors.Is(werr, backend.ErrNotFound) {
			return werr
		}
	}
	return nil
}

// Remove force-removes the container with its anonymous volumes. A missing sandbox
// succeeds.
func (d *Driver) Remove(ctx context.Context, name string) error {
	info, err := d.inspect(ctx, name)
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := ours(name, info); err != nil {
		return err
	}
	api, err := d.api()
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		err = api.ContainerRemove(ctx, info.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
		werr := d.wrap("remove container "+name, err)
		switch {
		case err == nil, errors.Is(werr, backend.ErrNotFound):
			return nil
		case errors.Is(werr, backend.ErrConflict) && attempt < 50:
			// "removal already in progress": another caller is removing it.
			select {
			case <-ctx.Done():
				return fmt.Errorf("docker: remove container %s: %w", name, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		default:
			return werr
		}
	}
}

// ImportImage loads a `docker save` archive into the engine and returns the
// references it held.
func (d *Driver) ImportImage(ctx context.Context, r io.Reader) ([]string, error) {
	api, err := d.api()
	if err != nil {
		return nil, err
	}
	resp, err := api.ImageLoad(ctx, r, client.ImageLoadWithQuiet(true))
	if err != nil {
		return nil, d.wrap("load image", err)
	}
	defer resp.Body.Close()
	var refs []string
	dec := json.NewDecoder(resp.Body)
	for {
		var m struct {
			Stream      string `json:"stream"`
			Error       string `json:"error"`
			ErrorDetail *struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&m); err == io.EOF {
			break
		} else if err != nil {
			return refs, fmt.Errorf("docker: load image: reading the engine's answer: %w", err)
		}
		if m.Error != "" {
			return refs, backend.Errorf(backend.ErrInvalid, "docker: load image: %s", m.Error)
		}
		for _, line := range strings.Split(m.Stream, "\n") {
			if ref, ok := strings.CutPrefix(strings.TrimSpace(line), "Loaded image: "); ok {
				refs = append(refs, ref)
			} else if id, ok := strings.CutPrefix(strings.TrimSpace(line), "Loaded image ID: "); ok {
				refs = append(refs, id)
			}
		}
	}
	return refs, nil
}
