// Package density measures what idle sandboxes cost on one machine: it creates N idle
// sandboxes through a driver, reads each one's agent, shim and memory cgroup from
// /proc and /sys/fs/cgroup, and measures warm exec latency into one sandbox with none
// and with N beside it. docs/performance.md ("Density") describes the figures;
// scripts/density.sh runs it.
//
// It must run as root on the host of the runtime (it reads other processes' /proc
// files). Everything it makes carries a fresh owner label and is removed at the end,
// also when its context is cancelled.
package density

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/benchutil"
)

// Options configures Run.
type Options struct {
	// Driver creates the sandboxes; it must start berth's agent as each sandbox's
	// first process in its own pid namespace (docker, containerd).
	Driver backend.TerminalBackend
	// AgentBinary is the static berth binary to install as the agent.
	AgentBinary string
	// StateDir is where the agent is installed and the sandboxes' agent directories
	// are made; Run removes what it made there.
	StateDir string
	// Image is the sandboxes' image.
	Image string
	// N is the number of idle sandboxes beside the probed one.
	N int
	// Rounds is the number of interleaved exec rounds per measurement (at least 30).
	Rounds int
	// Parallel is how many sandboxes are created or removed at once (at least 1).
	Parallel int
	// MaxHostThreads stops the creation when the host's threads (HostThreads) reach
	// it; 0 means 28000.
	MaxHostThreads int
	// MinMemAvailable stops the creation when the host's MemAvailable falls below it,
	// in bytes; 0 means 4 GiB.
	MinMemAvailable int64
	// Owner is the owner label of every sandbox Run makes; "" means a new one
	// (NewOwner). It must be one no other sandbox carries.
	Owner string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// NewOwner returns a fresh owner label value, "density-" and 8 random hex digits.
func NewOwner() string { return "density-" + randomHex() }

// Figures is the mean cost of one sandbox's processes and cgroup.
type Figures struct {
	// Sandboxes is how many sandboxes were measured.
	Sandboxes int `json:"sandboxes"`
	// Agent is the mean of the agents (PID 1 of each sandbox).
	Agent ProcMean `json:"agent"`
	// Shim is the mean of the distinct parents of the agents (the runtime's shim:
	// containerd-shim-runc-v2), and Shims how many distinct ones there are.
	Shim  ProcMean `json:"shim"`
	Shims int      `json:"shims"`
	// CgroupBytes is the mean memory use of a sandbox's memory cgroup, in bytes.
	CgroupBytes int64 `json:"cgroup_bytes"`
}

// ProcMean is the mean of Proc figures over several processes.
type ProcMean struct {
	Threads float64 `json:"threads"`
	RSS     int64   `json:"rss_bytes"`
	Pss     int64   `json:"pss_bytes"`
	FDs     float64 `json:"fds"`
}

// Latency is one exec way's p50 and p95.
type Latency struct {
	P50 time.Duration `json:"p50_ns"`
	P95 time.Duration `json:"p95_ns"`
}

// Report is what Run measured.
type Report struct {
	// Requested is Options.N; Created how many idle sandboxes were made beside the
	// probed one, and StoppedBy why creation stopped early ("" when all were made).
	Requested int    `json:"requested"`
	Created   int    `json:"created"`
	StoppedBy string `json:"stopped_by,omitempty"`
	// Load is /proc/loadavg's first three fields when the N were up.
	Load string `json:"load"`
	// HostThreads is the host's thread count with none and with N beside the probe.
	HostThreads0 int `json:"host_threads_0"`
	HostThreadsN int `json:"host_threads_n"`
	// MemAvailablePerSandbox is the host's MemAvailable before the N minus after, per
	// sandbox created, in bytes.
	MemAvailablePerSandbox int64 `json:"mem_available_per_sandbox_bytes"`
	// Probe is the probed sandbox's figures with none beside it; Fleet the mean
	// over all sandboxes with N beside it.
	Probe Figures `json:"probe"`
	Fleet Figures `json:"fleet"`
	// Exec latencies of `true` through the agent, over a kept connection and over a
	// new connection each time (dial), with 0 beside the probe (before the N were
	// made, and again after they were removed) and with N beside it.
	Kept0, KeptN, KeptAfter Latency
	Dial0, DialN, DialAfter Latency
	// CreateTime and RemoveTime are how long creating and removing the N took.
	CreateTime time.Duration `json:"create_ns"`
	RemoveTime time.Duration `json:"remove_ns"`
}

// sandbox is one sandbox Run made.
type sandbox struct {
	name  string
	id    string
	files backend.AgentFiles
}

// Run creates the probe sandbox and N idle ones, measures, and removes all of them
// (with a context of its own when ctx is cancelled). It returns the report of what it
// measured before an error too. Errors: the agent cannot be installed, the probe
// cannot be created or exec'd into, a removal failed (named).
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	if o.Rounds < 30 {
		o.Rounds = 30
	}
	if o.Parallel < 1 {
		o.Parallel = 1
	}
	if o.MaxHostThreads == 0 {
		o.MaxHostThreads = 28000
	}
	if o.MinMemAvailable == 0 {
		o.MinMemAvailable = 4 << 30
	}
	logw := o.Log
	if logw == nil {
		logw = io.Discard
	}
	logf := func(format string, args ...any) { fmt.Fprintf(logw, format+"\n", args...) }
	bin, err := agent.Install(o.StateDir, o.AgentBinary)
	if err != nil {
		return nil, err
	}
	if o.Owner == "" {
		o.Owner = NewOwner()
	}
	r := &runner{o: o, bin: bin, owner: o.Owner, logf: logf, made: map[string]bool{}}
	rep = &Report{Requested: o.N}
	defer func() {
		if cerr := r.removeAll(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	probe, err := r.create(ctx, "probe")
	if err != nil {
		return rep, fmt.Errorf("creating the probe sandbox: %w", err)
	}
	rep.HostThreads0 = HostThreads()
	if rep.Probe, err = r.figures([]*sandbox{probe}); err != nil {
		return rep, err
	}
	logf("probe: agent %.0f threads, RSS %s, Pss %s; shim %.0f threads, Pss %s; cgroup %s",
		rep.Probe.Agent.Threads, mb(rep.Probe.Agent.RSS), mb(rep.Probe.Agent.Pss), rep.Probe.Shim.Threads, mb(rep.Probe.Shim.Pss), mb(rep.Probe.CgroupBytes))
	if rep.Kept0, rep.Dial0, err = r.execRounds(ctx, probe); err != nil {
		return rep, err
	}
	logf("exec with 0 beside it: kept p50 %v p95 %v; dial p50 %v p95 %v", rep.Kept0.P50, rep.Kept0.P95, rep.Dial0.P50, rep.Dial0.P95)

	avail0, err := MemAvailable()
	if err != nil {
		return rep, err
	}
	start := time.Now()
	fleet, stopped := r.createMany(ctx, o.N)
	rep.CreateTime = time.Since(start)
	rep.Created, rep.StoppedBy = len(fleet), stopped
	logf("created %d of %d idle sandboxes in %v%s", len(fleet), o.N, rep.CreateTime.Round(time.Millisecond), suffix(stopped))
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	availN, err := MemAvailable()
	if err != nil {
		return rep, err
	}
	if len(fleet) > 0 {
		rep.MemAvailablePerSandbox = (avail0 - availN) / int64(len(fleet))
	}
	rep.Load = LoadAvg()
	rep.HostThreadsN = HostThreads()
	if rep.Fleet, err = r.figures(append([]*sandbox{probe}, fleet...)); err != nil {
		return rep, err
	}
	logf("fleet of %d: agent %.1f threads, RSS %s, Pss %s, %.1f fds; %d shims: %.1f threads, RSS %s, Pss %s; cgroup %s; MemAvailable fell %s per sandbox; host threads %d; load %s",
		rep.Fleet.Sandboxes, rep.Fleet.Agent.Threads, mb(rep.Fleet.Agent.RSS), mb(rep.Fleet.Agent.Pss), rep.Fleet.Agent.FDs,
		rep.Fleet.Shims, rep.Fleet.Shim.Threads, mb(rep.Fleet.Shim.RSS), mb(rep.Fleet.Shim.Pss), mb(rep.Fleet.CgroupBytes),
		mb(rep.MemAvailablePerSandbox), rep.HostThreadsN, rep.Load)
	if rep.KeptN, rep.DialN, err = r.execRounds(ctx, probe); err != nil {
		return rep, err
	}
	logf("exec with %d beside it: kept p50 %v p95 %v; dial p50 %v p95 %v", len(fleet), rep.KeptN.P50, rep.KeptN.P95, rep.DialN.P50, rep.DialN.P95)
	start = time.Now()
	if err := r.removeMany(fleet); err != nil {
		return rep, err
	}
	rep.RemoveTime = time.Since(start)
	logf("removed %d in %v", len(fleet), rep.RemoveTime.Round(time.Millisecond))
	if rep.KeptAfter, rep.DialAfter, err = r.execRounds(ctx, probe); err != nil {
		return rep, err
	}
	logf("exec with 0 beside it again: kept p50 %v p95 %v; dial p50 %v p95 %v", rep.KeptAfter.P50, rep.KeptAfter.P95, rep.DialAfter.P50, rep.DialAfter.P95)
	return rep, nil
}

// runner is one Run's state.
type runner struct {
	o     Options
	bin   agent.Binary
	owner string
	logf  func(string, ...any)

	mu   sync.Mutex
	made map[string]bool // names of sandboxes whose Create was called and that are not removed yet
}

func (r *runner) create(ctx context.Context, suffix string) (*sandbox, error) {
	name := r.owner + "-" + suffix
	files, err := agent.PrepareSandbox(filepath.Join(r.o.StateDir, "sandboxes", name), r.bin)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.made[name] = true
	r.mu.Unlock()
	sb, err := r.o.Driver.Create(ctx, backend.CreateRequest{
		Spec:  backend.SandboxSpec{Name: name, Image: r.o.Image, Labels: map[string]string{backend.LabelOwner: r.owner}},
		Agent: files,
	})
	if err != nil {
		return nil, err
	}
	return &sandbox{name: name, id: sb.ID, files: files}, nil
}

// createMany creates up to n idle sandboxes, o.Parallel at a time, checking the
// host's threads and MemAvailable before each; it returns those made and why it
// stopped early ("" when it did not).
func (r *runner) createMany(ctx context.Context, n int) ([]*sandbox, string) {
	var (
		mu      sync.Mutex
		made    []*sandbox
		stopped string
		next    int
		wg      sync.WaitGroup
	)
	stop := func(why string) {
		mu.Lock()
		if stopped == "" {
			stopped = why
		}
		mu.Unlock()
	}
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if stopped != "" || next >= n || ctx.Err() != nil {
			return 0, false
		}
		next++
		return next - 1, true
	}
	for w := 0; w < r.o.Parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i, ok := take()
				if !ok {
					return
				}
				if t := HostThreads(); t >= r.o.MaxHostThreads {
					stop(fmt.Sprintf("host threads %d reached the limit %d", t, r.o.MaxHostThreads))
					return
				}
				if a, err := MemAvailable(); err != nil || a < r.o.MinMemAvailable {
					stop(fmt.Sprintf("MemAvailable %s below the limit %s", mb(a), mb(r.o.MinMemAvailable)))
					return
				}
				sb, err := r.create(ctx, fmt.Sprintf("%04d", i))
				if err != nil {
					stop(fmt.Sprintf("creating sandbox %d: %v", i, err))
					return
				}
				mu.Lock()
				made = append(made, sb)
				if len(made)%100 == 0 {
					r.logf("%d created (host threads %d)", len(made), HostThreads())
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return made, stopped
}

// figures measures sbs: their agents, their agents' parents (shims) and cgroups.
// Errors: no sandbox's agent was found in /proc.
func (r *runner) figures(sbs []*sandbox) (Figures, error) {
	ids := make([]string, len(sbs))
	for i, sb := range sbs {
		ids[i] = sb.id
	}
	inits := ContainerInits(ids)
	var f Figures
	var agents, shims []Proc
	seen := map[int]bool{}
	var cg int64
	for _, sb := range sbs {
		pid, ok := inits[sb.id]
		if !ok {
			continue
		}
		p, err := ReadProc(pid)
		if err != nil {
			continue
		}
		u, err := MemCgroupUsage(pid)
		if err != nil {
			continue
		}
		agents = append(agents, p)
		cg += u
		if !seen[p.PPID] {
			seen[p.PPID] = true
			if s, err := ReadProc(p.PPID); err == nil {
				shims = append(shims, s)
			}
		}
	}
	if len(agents) == 0 {
		return f, errors.New("no sandbox's agent found in /proc (run as root on the runtime's host)")
	}
	f.Sandboxes = len(agents)
	f.Agent = mean(agents)
	f.Shim = mean(shims)
	f.Shims = len(shims)
	f.CgroupBytes = cg / int64(len(agents))
	return f, nil
}

func mean(ps []Proc) ProcMean {
	var m ProcMean
	if len(ps) == 0 {
		return m
	}
	for _, p := range ps {
		m.Threads += float64(p.Threads)
		m.RSS += p.RSS
		m.Pss += p.Pss
		m.FDs += float64(p.FDs)
	}
	n := len(ps)
	m.Threads /= float64(n)
	m.FDs /= float64(n)
	m.RSS /= int64(n)
	m.Pss /= int64(n)
	return m
}

// execRounds runs `true` in sb o.Rounds times over a kept connection and over a new
// one, interleaved, and returns each way's p50 and p95.
func (r *runner) execRounds(ctx context.Context, sb *sandbox) (kept, dial Latency, err error) {
	c, err := agent.Connect(ctx, sb.files)
	if err != nil {
		return kept, dial, fmt.Errorf("connecting to the probe's agent: %w", err)
	}
	defer c.Close()
	req := backend.ExecRequest{Argv: []string{"true"}}
	var ks, ds []time.Duration
	for i := 0; i < r.o.Rounds; i++ {
		t := time.Now()
		p, err := c.Exec(ctx, req)
		if err = waitTrue(p, err); err != nil {
			return kept, dial, fmt.Errorf("exec over a kept connection: %w", err)
		}
		ks = append(ks, time.Since(t))
		t = time.Now()
		p, err = agent.Exec(ctx, sb.files, req)
		if err = waitTrue(p, err); err != nil {
			return kept, dial, fmt.Errorf("exec over a new connection: %w", err)
		}
		ds = append(ds, time.Since(t))
	}
	return percentiles(ks), percentiles(ds), nil
}

func waitTrue(p backend.Process, err error) error {
	if err != nil {
		return err
	}
	res, err := p.Wait()
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("true exited %d", res.ExitCode)
	}
	return err
}

// percentiles returns the nearest-rank p50 and p95 of samples.
func percentiles(samples []time.Duration) Latency {
	p50, p95 := benchutil.Percentiles(samples)
	return Latency{P50: p50, P95: p95}
}

// removeMany removes sbs, o.Parallel at a time, with a context of its own (it also
// runs after an interrupt). Errors: the first failed removal, named.
func (r *runner) removeMany(sbs []*sandbox) error {
	names := make([]string, len(sbs))
	for i, sb := range sbs {
		names[i] = sb.name
	}
	return r.remove(names)
}

func (r *runner) remove(names []string) error {
	ch := make(chan string)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for w := 0; w < r.o.Parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range ch {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				err := r.o.Driver.Remove(ctx, name)
				cancel()
				if err == nil {
					err = os.RemoveAll(filepath.Join(r.o.StateDir, "sandboxes", name))
				}
				if err == nil {
					r.mu.Lock()
					delete(r.made, name)
					r.mu.Unlock()
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("removing sandbox %s: %w", name, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, n := range names {
		ch <- n
	}
	close(ch)
	wg.Wait()
	return first
}

// removeAll removes every sandbox this run made and any other sandbox carrying its
// owner label (a Create that was interrupted after the runtime made it).
func (r *runner) removeAll() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	set := map[string]bool{}
	r.mu.Lock()
	for n := range r.made {
		set[n] = true
	}
	r.mu.Unlock()
	if list, err := r.o.Driver.List(ctx, map[string]string{backend.LabelOwner: r.owner}); err == nil {
		for _, sb := range list {
			set[sb.Name] = true
		}
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) > 0 {
		r.logf("removing %d sandboxes of owner %s", len(names), r.owner)
	}
	return r.remove(names)
}

func randomHex() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

func suffix(s string) string {
	if s == "" {
		return ""
	}
	return " (stopped: " + s + ")"
}
