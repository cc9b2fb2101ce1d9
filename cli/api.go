package cli

import (
	"context"
	"io"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/catalog"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiconv"
	"github.com/berth-sh/berth/server/apiv1"
)

// api is what the commands that can go through berth serve call: the registry in
// this process (embedded) or the daemon (*daemonClient). Each command has one code
// path over it, so its output and exit codes are the same either way. The methods
// are the registry's, with the API's shapes for sessions and jobs.
type api interface {
	Sessions(ctx context.Context) ([]apiv1.Session, error)
	// Pools reports the warm pools (berth sessions --pool; GET /v1/pools).
	Pools(ctx context.Context) ([]apiv1.Pool, error)
	CloseSession(ctx context.Context, session string) error
	StopSession(ctx context.Context, session string) error
	RemoveSession(ctx context.Context, session string) error
	Recreate(ctx context.Context, session string) (bool, error)
	Prune(ctx context.Context, opts registry.PruneOptions) (*registry.PruneReport, error)
	// Exec starts a plain exec and says where it runs, as the API's started event
	// does (embedded: the registry's lease through apiconv.StartedOf; through the
	// daemon: its event as it came).
	Exec(ctx context.Context, session string, req backend.ExecRequest) (backend.Process, *apiv1.ExecStarted, error)
	Shell(ctx context.Context, session string, req registry.ShellRequest) (registry.ShellResult, error)
	JobStart(ctx context.Context, session string, req registry.JobStartRequest) (apiv1.Job, error)
	Jobs(ctx context.Context, session string) ([]apiv1.Job, error)
	JobLogs(ctx context.Context, session string, req registry.JobLogsRequest, w io.Writer) (agent.JobLogsEnd, error)
	JobKill(ctx context.Context, session, id string) error
	// DriverRows describes every driver (berth drivers; GET /v1/drivers).
	DriverRows(ctx context.Context) ([]apiv1.Driver, error)
	// Explanation says how session is placed (berth config explain; GET
	// /v1/config/explain).
	Explanation(ctx context.Context, session string) (apiv1.Explanation, error)
	Close() error
}

// embedded is the api of a registry opened in this process; inProcess is
// --in-process (the local driver runs in this process).
type embedded struct {
	*registry.Registry
	inProcess bool
}

func (e embedded) Exec(ctx context.Context, session string, req backend.ExecRequest) (backend.Process, *apiv1.ExecStarted, error) {
	p, lease, err := e.Registry.Exec(ctx, session, req)
	if err != nil {
		return nil, nil, err
	}
	return p, apiconv.StartedOf(lease), nil
}

func (e embedded) DriverRows(ctx context.Context) ([]apiv1.Driver, error) {
	return apiconv.DriversOf(ctx, e.Registry, func(name string) bool {
		_, ok := catalog.Linked(name)
		return ok && e.inProcess
	})
}

func (e embedded) Explanation(_ context.Context, session string) (apiv1.Explanation, error) {
	ex, err := e.Registry.Explain(session)
	if err != nil {
		return apiv1.Explanation{}, err
	}
	return apiconv.ExplanationOf(ex), nil
}

func (e embedded) Sessions(ctx context.Context) ([]apiv1.Session, error) {
	list, err := e.Registry.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	rows := make([]apiv1.Session, 0, len(list))
	for _, s := range list {
		rows = append(rows, apiconv.SessionOf(s)) // as GET /v1/sessions lists them
	}
	return rows, nil
}

func (e embedded) Pools(ctx context.Context) ([]apiv1.Pool, error) {
	list, err := e.Registry.Pools(ctx)
	if err != nil {
		return nil, err
	}
	return apiconv.PoolsOf(list), nil // as GET /v1/pools lists them
}

func (e embedded) JobStart(ctx context.Context, session string, req registry.JobStartRequest) (apiv1.Job, error) {
	j, err := e.Registry.JobStart(ctx, session, req)
	return apiconv.JobOf(j), err
}

func (e embedded) Jobs(ctx context.Context, session string) ([]apiv1.Job, error) {
	jobs, err := e.Registry.Jobs(ctx, session)
	if err != nil {
		return nil, err
	}
	out := make([]apiv1.Job, 0, len(jobs))
	for _, j := range jobs {
		out = append(out, apiconv.JobOf(j))
	}
	return out, nil
}

// api returns the api this command uses: the daemon that g.daemon finds, else a
// registry opened here. Errors (a refused daemon, a registry that cannot be opened)
// are berth failures (exit 125).
func (g *globals) api(ctx context.Context) (api, error) {
	d, err := g.daemon(ctx)
	if err != nil {
		return nil, execrun.Failure(err)
	}
	if d != nil {
		return d, nil
	}
	reg, err := g.open(ctx)
	if err != nil {
		return nil, execrun.Failure(err)
	}
	return embedded{Registry: reg, inProcess: g.inProcess}, nil
}

// withAPI runs f with g.api and closes it; every error is a berth failure (exit 125)
// unless f returns an exit code of its own.
func (g *globals) withAPI(ctx context.Context, f func(a api) error) error {
	a, err := g.api(ctx)
	if err != nil {
		return err
	}
	defer a.Close()
	return execrun.Failure(f(a))
}
