package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/server/apiv1"
)

// poolBenchSize is the pool of BenchmarkServePoolAcquire's pooled rule.
const poolBenchSize = 4

// poolBenchRules are a rule pool:* with a pool of poolBenchSize and a rule fresh:*
// without one, both with body (the driver and its image).
func poolBenchRules(body string) string {
	return fmt.Sprintf("scope \"pool:*\" {\n%s\n  pool {\n    size = %d\n  }\n}\nscope \"fresh:*\" {\n%s\n}\n", body, poolBenchSize, body)
}

// httpPools is GET /v1/pools through client.
func httpPools(client *http.Client) ([]apiv1.Pool, error) {
	var ps []apiv1.Pool
	return ps, httpGet(client, "/v1/pools", &ps)
}

// httpGet is GET path through client, its JSON answer decoded into out.
func httpGet(client *http.Client, path string, out any) error {
	resp, err := client.Get("http://berth" + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %v", path, resp.StatusCode, err)
	}
	return nil
}

// waitPoolFull waits until the daemon's pool of scope holds its size of ready
// members and nothing else.
func waitPoolFull(b testing.TB, client *http.Client, scope string) {
	b.Helper()
	var last []apiv1.Pool
	if !testwait.For(context.Background(), 0, func() bool {
		ps, err := httpPools(client)
		if err != nil {
			b.Fatal(err)
		}
		last = ps
		for _, p := range ps {
			if p.Scope == scope {
				return p.Size > 0 && p.Ready == p.Size && len(p.Members) == p.Size
			}
		}
		return false
	}) {
		b.Fatalf("the pool of %s did not fill: %+v", scope, last)
	}
}

// postTrue posts {"argv":["true"]} to session's exec and returns the result.
func postTrue(client *http.Client, session string) (apiv1.ExecResult, error) {
	resp, err := client.Post("http://berth/v1/sessions/"+session+"/exec", "application/json", strings.NewReader(`{"argv":["true"]}`))
	if err != nil {
		return apiv1.ExecResult{}, err
	}
	defer resp.Body.Close()
	var res apiv1.ExecResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != 200 || res.ExitCode != 0 {
		return res, fmt.Errorf("exec in %s: status %d, %+v, %v", session, resp.StatusCode, res, err)
	}
	return res, nil
}

// deleteSession is DELETE /v1/sessions/{session} through client.
func deleteSession(client *http.Client, session string) error {
	req, _ := http.NewRequest(http.MethodDelete, "http://berth/v1/sessions/"+session, nil)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("DELETE session %s: %d", session, resp.StatusCode)
	}
	return nil
}

// drainBenchPools reloads benchServe's daemon (environ, sock) with its config's
// pool blocks removed and waits until it has drained them; the daemon's shutdown
// (benchServe's cleanup) waits for the removals. Register it after benchServe.
func drainBenchPools(b testing.TB, environ []string, client *http.Client, sock string) {
	path := ""
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "BERTH_CONFIG="); ok {
			path = v
		}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Error(err)
		return
	}
	src := string(raw)
	if i := strings.Index(src, "  pool {"); i >= 0 {
		j := strings.Index(src[i:], "}\n")
		src = src[:i] + src[i+j+2:]
	}
	os.WriteFile(path, []byte(src), 0o644)
	syscall.Kill(servePid(b.(*testing.B), sock), syscall.SIGHUP)
	if !testwait.For(context.Background(), 0, func() bool {
		ps, err := httpPools(client)
		return err == nil && len(ps) == 0
	}) {
		b.Errorf("the daemon did not drain its pools after a reload without them")
	}
}

// BenchmarkServePoolAcquire measures a new session's acquire to its first exec
// finished (POST /v1/sessions/NEW/exec {"argv":["true"]} through the daemon's API,
// from a Go HTTP client over its socket) with a warm pool of 4 (a claim) against
// without one (a create), on local and, when their runtimes answer, docker and
// containerd (1.6 and 2.x), and the whole `berth exec -s NEW -- true` command (its
// claim: cli-claim); on docker also `docker run --rm IMAGE true`. Each round
// removes its sessions and waits until the pool is full again (GET /v1/pools shows
// 4 ready) before it goes on, outside the timing; at least 30 interleaved rounds.
// Issue 16's targets: p50 <= 15 ms with the pool, <= 0.05x docker run.
//
//	go test ./cli -run '^$' -bench ServePoolAcquire -benchtime 30x
func BenchmarkServePoolAcquire(b *testing.B) {
	b.Run("local", func(b *testing.B) { benchPoolAcquire(b, "  driver = \"local\"", nil) })
	b.Run("docker", func(b *testing.B) {
		host := testimage.RequireEngine(b)
		body := fmt.Sprintf("  driver = \"docker\"\n  image  = %q", testimage.Ref)
		benchPoolAcquire(b, body, func(environ []string) (string, func() error) {
			importBenchImage(b, environ, "docker")
			return "docker-run", func() error {
				out, err := exec.Command("docker", "-H", host, "run", "--rm", "--network", "none", testimage.Ref, "true").CombinedOutput()
				if err != nil {
					return fmt.Errorf("docker run: %v: %s", err, out)
				}
				return nil
			}
		})
	})
	for _, env := range testimage.ContainerdEnvs {
		b.Run(strings.ToLower(strings.TrimSuffix(env, "_ADDRESS")), func(b *testing.B) {
			addr := testimage.RequireContainerd(b, env)
			head := fmt.Sprintf("driver \"containerd\" {\n  address   = %q\n  namespace = %q\n}\n", addr, containerdCLINamespace+"-pool")
			body := fmt.Sprintf("  driver = \"containerd\"\n  image  = %q", testimage.Ref)
			benchPoolAcquireConfig(b, head+poolBenchRules(body), func(environ []string) (string, func() error) {
				importBenchImage(b, environ, "containerd")
				return "", nil
			})
		})
	}
}

// importBenchImage imports berth's test image for driver with berth image import
// (the daemon's state dir, embedded beside it).
func importBenchImage(b *testing.B, environ []string, driver string) {
	b.Helper()
	archive, err := testimage.Archive()
	if err != nil {
		b.Fatal(err)
	}
	imp := cli(environ, "image", "import", "--driver", driver, "-")
	imp.Stdin = bytes.NewReader(archive)
	if out, err := imp.CombinedOutput(); err != nil {
		b.Fatalf("image import: %v\n%s", err, out)
	}
}

func benchPoolAcquire(b *testing.B, body string, setup func(environ []string) (string, func() error)) {
	benchPoolAcquireConfig(b, poolBenchRules(body), setup)
}

// benchPoolAcquireConfig runs BenchmarkServePoolAcquire's rounds on a daemon with
// config; setup (when set) runs before the rounds and may return one more way to
// time beside them (name "" for none).
func benchPoolAcquireConfig(b *testing.B, config string, setup func(environ []string) (string, func() error)) {
	environ, client, sock := benchServe(b, config)
	b.Cleanup(func() { drainBenchPools(b, environ, client, sock) })
	var extraName string
	var extra func() error
	if setup != nil {
		extraName, extra = setup(environ)
	}
	waitPoolFull(b, client, "pool:*")
	rounds := max(b.N, 30)
	var claims, cliClaims, creates, others []time.Duration
	b.ResetTimer()
	for i := range rounds {
		start := time.Now()
		res, err := postTrue(client, fmt.Sprintf("pool:%d", i))
		took := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if !res.Pooled {
			b.Fatalf("round %d: the pooled session was not a claim: %+v", i, res)
		}
		claims = append(claims, took)
		// The whole `berth exec -s NEW -- true` command through the daemon: the
		// front's path (issue 16's done-when: ten new sessions in a row), on a full
		// pool again, as the API's claim (not beside the refill that claim started).
		b.StopTimer()
		waitPoolFull(b, client, "pool:*")
		b.StartTimer()
		start = time.Now()
		err = cliRun(environ, "exec", "-s", fmt.Sprintf("pool:c%d", i), "--", "true")
		took = time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		var got apiv1.Session
		if err := httpGet(client, "/v1/sessions/"+url.PathEscape(fmt.Sprintf("pool:c%d", i)), &got); err != nil || !got.Pooled {
			b.Fatalf("round %d: the CLI's session is not a claim: %+v %v", i, got, err)
		}
		cliClaims = append(cliClaims, took)
		start = time.Now()
		res, err = postTrue(client, fmt.Sprintf("fresh:%d", i))
		took = time.Since(start)
		if err != nil || res.Pooled {
			b.Fatalf("round %d: %+v %v", i, res, err)
		}
		creates = append(creates, took)
		if extra != nil {
			start = time.Now()
			if err := extra(); err != nil {
				b.Fatal(err)
			}
			others = append(others, time.Since(start))
		}
		b.StopTimer()
		for _, s := range []string{fmt.Sprintf("pool:%d", i), fmt.Sprintf("pool:c%d", i), fmt.Sprintf("fresh:%d", i)} {
			if err := deleteSession(client, s); err != nil {
				b.Fatal(err)
			}
		}
		waitPoolFull(b, client, "pool:*")
		b.StartTimer()
	}
	b.StopTimer()
	names, samples := []string{"claim", "cli-claim", "create"}, [][]time.Duration{claims, cliClaims, creates}
	if extra != nil {
		names, samples = append(names, extraName), append(samples, others)
		p50c, _ := benchutil.Percentiles(claims)
		p50o, _ := benchutil.Percentiles(others)
		b.ReportMetric(float64(p50c)/float64(p50o), "claim/"+extraName+"-p50")
	}
	benchutil.Report(b, names, samples)
}

// Twenty sessions claim at once from a pool of 20 through the daemon's API: every
// call succeeds, every one is a claim, and no member is handed out twice.
func TestServePoolConcurrentClaims(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", poolConfig(20))
	d := e.serve()
	members := map[string]bool{}
	for _, m := range d.waitPool(20).Members {
		members[m.Sandbox] = true
	}
	const n = 20
	results := make([]apiv1.ExecResult, n)
	took := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			start := time.Now()
			resp, err := d.do(context.Background(), "POST", fmt.Sprintf("/v1/sessions/task:%d/exec", i), `{"argv":["true"]}`)
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			if err := json.NewDecoder(resp.Body).Decode(&results[i]); err != nil || resp.StatusCode != 200 {
				errs[i] = fmt.Errorf("status %d: %v", resp.StatusCode, err)
			}
			took[i] = time.Since(start)
		}()
	}
	close(gate)
	wg.Wait()
	seen := map[string]int{}
	for i, res := range results {
		if errs[i] != nil {
			t.Fatalf("task:%d: %v", i, errs[i])
		}
		if !res.Pooled || !members[res.Sandbox] || res.ExitCode != 0 {
			t.Errorf("task:%d: %+v, want a claim of a member", i, res)
		}
		if prev, dup := seen[res.Sandbox]; dup {
			t.Errorf("task:%d and task:%d got the same member %s", prev, i, res.Sandbox)
		}
		seen[res.Sandbox] = i
	}
	p50, p95 := benchutil.Percentiles(took)
	t.Logf("20 claims at once: p50 %v, p95 %v", p50, p95)
	e.drainPools(d)
}
