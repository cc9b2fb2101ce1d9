package docker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
)

// runscBench returns the engine's address and skips the benchmark when the engine
// has no runtime runsc (scripts/runtimes.sh registers it).
func runscBench(b *testing.B, plug backend.TerminalBackend) {
	b.Helper()
	info, err := plug.Info(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if !slices.Contains(info.Capabilities.RuntimeNames(), "runsc") {
		b.Skipf("the engine has no runtime runsc; %s", testimage.RunscStartHint)
	}
}

// runtimeRequest returns the create request of sandbox name of owner under runtime
// rt ("runc": the engine's default), with its agent files prepared under state.
func runtimeRequest(b *testing.B, state, owner string, bin agent.Binary, name, rt string) backend.CreateRequest {
	b.Helper()
	files, err := agent.PrepareSandbox(filepath.Join(state, "sandboxes", name), bin)
	if err != nil {
		b.Fatal(err)
	}
	spec := backend.SandboxSpec{Name: name, Image: testimage.Ref, Labels: map[string]string{backend.LabelOwner: owner}}
	if rt != "runc" {
		spec.Runtime = rt
	}
	return backend.CreateRequest{Spec: spec, Agent: files}
}

// BenchmarkGVisorExec compares the round trip of `true` in a running sandbox under
// runsc (gVisor) and under runc, on the docker driver, interleaved: through the
// agent over a kept connection, over a new connection per exec, and the whole
// `berth exec -s S -- true` command. p50 and p95 in milliseconds (at least 20
// rounds; docs/gvisor.md quotes 30).
//
//	go test ./docker -run '^$' -bench GVisorExec -benchtime 30x
func BenchmarkGVisorExec(b *testing.B) {
	ctx := context.Background()
	host, state, owner, bin, plug := pluginFixture(b)
	runscBench(b, plug)
	files := map[string]backend.AgentFiles{}
	for _, rt := range []string{"runc", "runsc"} {
		name := benchName(0) + "-" + rt
		req := runtimeRequest(b, state, owner, bin, name, rt)
		if _, err := plug.Create(ctx, req); err != nil {
			b.Fatal(err)
		}
		files[rt] = req.Agent
	}
	cliState := filepath.Join(state, "cli")
	xdg := filepath.Join(state, "xdg")
	os.MkdirAll(filepath.Join(xdg, "berth"), 0o755)
	cfg := fmt.Sprintf("driver \"docker\" {\n  host = %q\n}\nscope \"g:*\" {\n  driver = \"docker\"\n  image  = %q\n  runtime = \"runsc\"\n}\nscope \"*\" {\n  driver = \"docker\"\n  image  = %q\n}\n", host, testimage.Ref, testimage.Ref)
	if err := os.WriteFile(filepath.Join(xdg, "berth", "config.hcl"), []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	berthCLI := func(session string) func() error {
		return func() error {
			cmd := exec.Command(testbin.Front(berthBin), "--state-dir", cliState, "exec", "-s", session, "--", "true")
			cmd.Env = benchutil.CLIEnv(xdg)
			out, err := cmd.CombinedOutput()
			if err != nil {
				b.Logf("berth exec -s %s: %s", session, out)
			}
			return err
		}
	}
	for _, s := range []string{"g:bench", "bench"} {
		if err := berthCLI(s)(); err != nil { // creates the session's sandbox
			b.Fatal(err)
		}
		defer func() {
			cmd := exec.Command(testbin.Front(berthBin), "--state-dir", cliState, "rm", s)
			cmd.Env = benchutil.CLIEnv(xdg)
			cmd.Run()
		}()
	}
	benchutil.Interleave(b, []benchutil.Way{
		{Name: "runc-agent-kept", Run: benchutil.AgentKept(b, files["runc"])},
		{Name: "runsc-agent-kept", Run: benchutil.AgentKept(b, files["runsc"])},
		{Name: "runc-agent-dial", Run: benchutil.AgentDial(b, files["runc"])},
		{Name: "runsc-agent-dial", Run: benchutil.AgentDial(b, files["runsc"])},
		{Name: "runc-berth-exec", Run: berthCLI("bench")},
		{Name: "runsc-berth-exec", Run: berthCLI("g:bench")},
	})
}

// BenchmarkGVisorCreateToFirstExec measures a new sandbox from Create to its first
// exec of `true` finished, through the plugin, under runsc and under runc, against
// `docker run --rm --runtime runsc IMAGE true` and `docker run --rm IMAGE true`,
// interleaved; p50 and p95 in milliseconds (at least 20 rounds). The berth sandboxes
// are removed outside the timed part.
//
//	go test ./docker -run '^$' -bench GVisorCreateToFirstExec -benchtime 30x
func BenchmarkGVisorCreateToFirstExec(b *testing.B) {
	ctx := context.Background()
	host, state, owner, bin, plug := pluginFixture(b)
	runscBench(b, plug)
	var samples [4][]time.Duration
	names := []string{"runc-berth", "runsc-berth", "docker-run-runc", "docker-run-runsc"}
	rounds := benchutil.Rounds(b)
	for i := 0; i < rounds; i++ {
		for j, rt := range []string{"runc", "runsc"} {
			name := benchName(i) + "-" + rt
			req := runtimeRequest(b, state, owner, bin, name, rt)
			start := time.Now()
			if _, err := plug.Create(ctx, req); err != nil {
				b.Fatal(err)
			}
			p, err := agent.Exec(ctx, req.Agent, backend.ExecRequest{Argv: []string{"true"}})
			if err := benchutil.WaitTrue(b, p, err); err != nil {
				b.Fatal(err)
			}
			samples[j] = append(samples[j], time.Since(start))
			if err := plug.Remove(ctx, name); err != nil {
				b.Fatal(err)
			}
		}
		for j, args := range [][]string{{}, {"--runtime", "runsc"}} {
			argv := append([]string{"-H", host, "run", "--rm", "--network", "none"}, args...)
			start := time.Now()
			if out, err := exec.Command("docker", append(argv, testimage.Ref, "true")...).CombinedOutput(); err != nil {
				b.Fatalf("docker %v: %v %s", argv, err, out)
			}
			samples[2+j] = append(samples[2+j], time.Since(start))
		}
	}
	benchutil.Report(b, names, samples[:])
}

// BenchmarkGVisorIdleMemory creates 5 idle sandboxes under runsc and 5 under runc
// and reports the memory each one's cgroup holds once its agent answers (the
// engine's memory_stats.usage less its page cache, as `docker stats` shows it: the
// Sentry, the Gofer and the agent for runsc; the agent for runc), p50 and max in
// MiB.
//
//	go test ./docker -run '^$' -bench GVisorIdleMemory -benchtime 1x
func BenchmarkGVisorIdleMemory(b *testing.B) {
	const n = 5
	ctx := context.Background()
	host, state, owner, bin, plug := pluginFixture(b)
	runscBench(b, plug)
	api, err := client.NewClientWithOpts(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		b.Fatal(err)
	}
	defer api.Close()
	for _, rt := range []string{"runc", "runsc"} {
		var mibs []float64
		for i := 0; i < n; i++ {
			name := benchName(i) + "-mem-" + rt
			req := runtimeRequest(b, state, owner, bin, name, rt)
			if _, err := plug.Create(ctx, req); err != nil {
				b.Fatal(err)
			}
			defer plug.Remove(ctx, name)
			p, err := agent.Exec(ctx, req.Agent, backend.ExecRequest{Argv: []string{"true"}})
			if err := benchutil.WaitTrue(b, p, err); err != nil {
				b.Fatal(err)
			}
			mibs = append(mibs, idleMiB(b, api, name))
		}
		slices.Sort(mibs)
		b.ReportMetric(mibs[len(mibs)/2], rt+"-idle-p50-MiB")
		b.ReportMetric(mibs[len(mibs)-1], rt+"-idle-max-MiB")
		b.Logf("%s: idle memory per sandbox %v MiB", rt, mibs)
	}
}

// idleMiB returns the memory of container name's cgroup as `docker stats` shows it
// (usage less inactive file pages, cgroup v2), in MiB.
func idleMiB(b *testing.B, api *client.Client, name string) float64 {
	b.Helper()
	st, err := api.ContainerStatsOneShot(context.Background(), name)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Body.Close()
	var s container.StatsResponse
	if err := json.NewDecoder(st.Body).Decode(&s); err != nil {
		b.Fatal(err)
	}
	use := s.MemoryStats.Usage - s.MemoryStats.Stats["inactive_file"]
	return float64(use) / (1 << 20)
}
