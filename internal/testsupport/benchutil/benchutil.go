// Package benchutil holds what berth's benchmarks share: interleaved rounds of several
// ways to do one thing, and p50/p95 reporting in milliseconds.
package benchutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
)

// MinRounds is the fewest rounds a comparison runs, whatever b.N is (Rounds).
const MinRounds = 20

// Rounds is how many rounds a comparison runs: max(b.N, MinRounds), or b.N alone
// when BERTH_BENCH_SMOKE=1 (CI's smoke run, which shows that the benchmarks run and
// takes no numbers: -benchtime 1x is then one round).
func Rounds(b *testing.B) int {
	if os.Getenv("BERTH_BENCH_SMOKE") == "1" {
		return b.N
	}
	return max(b.N, MinRounds)
}

// Way is one way of doing the measured thing.
type Way struct {
	Name string
	Run  func() error
}

// Interleave runs every way once per round, in order, for max(b.N, MinRounds) rounds,
// so machine noise hits each alike, and reports their p50 and p95 (Report). A way's
// error fails the benchmark. BERTH_BENCH_WAYS (comma-separated names) keeps only the
// ways it names. BERTH_BENCH_SETTLE (a duration, e.g. 50ms) pauses that long before
// each way, untimed: a runtime's exec leaves its own clean-up running after it
// returns (the docker CLI's exit, the engine's and the shim's work), which otherwise
// lands in the next way's time on a 2-CPU machine.
func Interleave(b *testing.B, ways []Way) {
	b.Helper()
	ways = Selected(ways)
	settle := Settle(b)
	rounds := Rounds(b)
	names := make([]string, len(ways))
	samples := make([][]time.Duration, len(ways))
	b.ResetTimer()
	for i := 0; i < rounds; i++ {
		for j, w := range ways {
			if settle > 0 {
				b.StopTimer()
				time.Sleep(settle) // a pause between measurements, not a wait for an event
				b.StartTimer()
			}
			start := time.Now()
			if err := w.Run(); err != nil {
				b.Fatalf("%s: %v", w.Name, err)
			}
			samples[j] = append(samples[j], time.Since(start))
		}
	}
	b.StopTimer()
	for j, w := range ways {
		names[j] = w.Name
	}
	Report(b, names, samples)
}

// SettleEnv names the environment variable of Interleave's pause before each way.
const SettleEnv = "BERTH_BENCH_SETTLE"

// Settle returns the pause of $BERTH_BENCH_SETTLE (0 when unset), failing b when it
// is not a duration.
func Settle(b *testing.B) time.Duration {
	v := os.Getenv(SettleEnv)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		b.Fatalf("%s=%q: want a duration such as 50ms", SettleEnv, v)
	}
	b.Logf("%s=%s: each way starts after that pause", SettleEnv, d)
	return d
}

// Selected returns the ways that BERTH_BENCH_WAYS names (comma-separated), in their
// order, or all of them when it is unset or names none of them.
func Selected(ways []Way) []Way {
	want := os.Getenv("BERTH_BENCH_WAYS")
	if want == "" {
		return ways
	}
	var out []Way
	for _, w := range ways {
		if slices.Contains(strings.Split(want, ","), w.Name) {
			out = append(out, w)
		}
	}
	if len(out) == 0 {
		return ways
	}
	return out
}

// Percentiles returns the p50 and p95 of samples (nearest rank; samples is not changed).
func Percentiles(samples []time.Duration) (p50, p95 time.Duration) {
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(a, c int) bool { return s[a] < s[c] })
	return s[len(s)*50/100], s[min(len(s)-1, len(s)*95/100)]
}

// Report adds NAME-p50-ms and NAME-p95-ms metrics for each named sample set and logs
// them in one line.
func Report(b *testing.B, names []string, samples [][]time.Duration) {
	b.Helper()
	var summary []string
	for j, name := range names {
		p50, p95 := Percentiles(samples[j])
		b.ReportMetric(float64(p50.Microseconds())/1000, name+"-p50-ms")
		b.ReportMetric(float64(p95.Microseconds())/1000, name+"-p95-ms")
		summary = append(summary, name+" p50 "+p50.Round(10*time.Microsecond).String()+" p95 "+p95.Round(10*time.Microsecond).String())
	}
	b.Log(strings.Join(summary, "; "))
}

// AgentKept returns a way that runs `true` through the agent of files over one
// connection kept for the whole benchmark (what a long-lived host pays per exec).
func AgentKept(b *testing.B, files backend.AgentFiles) func() error {
	b.Helper()
	c, err := agent.Connect(context.Background(), files)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return func() error {
		p, err := c.Exec(context.Background(), TrueReq)
		return WaitTrue(b, p, err)
	}
}

// AgentDial returns a way that runs `true` through the agent of files over a new
// connection each time (agent.Exec: dial, handshake, Hello, exec, close).
func AgentDial(b *testing.B, files backend.AgentFiles) func() error {
	return func() error {
		p, err := agent.Exec(context.Background(), files, TrueReq)
		return WaitTrue(b, p, err)
	}
}

// TrueReq is the exec request of `true`.
var TrueReq = backend.ExecRequest{Argv: []string{"true"}}

// WaitTrue waits for an exec of `true` and fails b when it did not exit 0.
func WaitTrue(b *testing.B, p backend.Process, err error) error {
	if err != nil {
		return err
	}
	res, err := p.Wait()
	if err == nil && res.ExitCode != 0 {
		b.Fatalf("true exited %d", res.ExitCode)
	}
	return err
}

// Phases collects the phase lines (internal/phase) of traced runs of a berth command
// and reports the p50 and p95 of each phase's share of the wall time.
type Phases struct {
	names []string
	durs  map[string][]time.Duration
}

// NewPhases returns an empty collection.
func NewPhases() *Phases { return &Phases{durs: map[string][]time.Duration{}} }

// Add attributes one run that was started at start and reaped at end, whose stderr
// holds its "phase NAME NANOS" lines: spawn→first phase, each phase since the one
// before, and last phase→reaped. Errors: no phase lines.
func (p *Phases) Add(start, end time.Time, stderr string) error {
	return p.AddSpan("spawn", "reaped", start, end, stderr)
}

// AddSpan is Add for a span whose ends are named first (at start) and last (at end),
// such as a library call's "call" and "returned". Errors: no phase lines.
func (p *Phases) AddSpan(first, last string, start, end time.Time, lines string) error {
	prev, prevName := start, first
	found := false
	for _, line := range strings.Split(lines, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "phase" {
			continue
		}
		ns, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			continue
		}
		t := time.Unix(0, ns)
		p.add(prevName+"→"+f[1], t.Sub(prev))
		prev, prevName, found = t, f[1], true
	}
	if !found {
		return fmt.Errorf("no phase lines in the traced run's output: %q", lines)
	}
	p.add(prevName+"→"+last, end.Sub(prev))
	return nil
}

func (p *Phases) add(name string, d time.Duration) {
	if _, ok := p.durs[name]; !ok {
		p.names = append(p.names, name)
	}
	p.durs[name] = append(p.durs[name], d)
}

// Report reports each phase (Report's metrics, named after the phases).
func (p *Phases) Report(b *testing.B) {
	var samples [][]time.Duration
	var names []string
	for _, n := range p.names {
		names = append(names, strings.NewReplacer("→", "-to-").Replace(n))
		samples = append(samples, p.durs[n])
	}
	Report(b, names, samples)
}

// CLIEnv is the environment for a berth command that a test or benchmark runs with
// its own config under xdg (XDG_CONFIG_HOME): the caller's environment without any
// BERTH_* or XDG_* variable, so that a BERTH_CONFIG, BERTH_STATE_DIR or
// XDG_STATE_HOME exported in the caller's shell cannot send the command to another
// config or state dir; then XDG_CONFIG_HOME=xdg and extra ("KEY=value" each).
func CLIEnv(xdg string, extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "BERTH_") || strings.HasPrefix(k, "XDG_") {
			continue
		}
		out = append(out, kv)
	}
	return append(append(out, "XDG_CONFIG_HOME="+xdg), extra...)
}

// Floors returns the ways that say what this machine itself costs for a whole
// command: `sh -c true` (the host shell's fork, exec and exit) and a static Go
// hello-world, built with CGO_ENABLED=0 into b's temp dir (what any Go program's
// start and exit cost, before its own work). A build failure fails b.
func Floors(b *testing.B) []Way {
	b.Helper()
	dir := b.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nimport \"os\"\n\nfunc main() { os.Stdout.WriteString(\"hello\\n\") }\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	hello := filepath.Join(dir, "hello")
	build := exec.Command("go", "build", "-o", hello, src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building a Go hello-world: %v\n%s", err, out)
	}
	return []Way{
		{Name: "sh-c-true", Run: func() error { return exec.Command("sh", "-c", "true").Run() }},
		{Name: "go-hello", Run: func() error { return exec.Command(hello).Run() }},
	}
}
