package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
)

// testHarness returns a harness without a backend, for synthetic cases.
func testHarness(opts Options) *Harness {
	return newHarness(nil, backend.Info{Name: "synthetic", Capabilities: backend.Capabilities{TTY: false, StopStart: true}}, opts, os.TempDir())
}

func reportByName(t *testing.T, rep Report) map[string]CaseReport {
	t.Helper()
	out := map[string]CaseReport{}
	for _, c := range rep.Cases {
		out[c.FullName()] = c
	}
	return out
}

func TestRunCasesStatuses(t *testing.T) {
	var after []string
	var mu sync.Mutex
	reached := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		after = append(after, s)
	}
	cases := []Case{
		{Group: "g", Name: "pass", Run: func(t T, h *Harness) { t.Logf("hello %d", 1) }},
		{Group: "g", Name: "error-continues", Run: func(t T, h *Harness) {
			t.Errorf("first %s", "problem")
			t.Error("second", "problem")
			reached("error-continues")
		}},
		{Group: "g", Name: "fatal-stops", Run: func(t T, h *Harness) {
			t.Fatalf("stop here")
			reached("fatal-stops")
		}},
		{Group: "g", Name: "fatal-helper-stops", Run: func(t T, h *Harness) {
			func() { t.Fatal("deep") }()
			reached("fatal-helper-stops")
		}},
		{Group: "g", Name: "skip", Run: func(t T, h *Harness) {
			t.Skipf("no %s here", "thing")
			reached("skip")
		}},
		{Group: "g", Name: "skip-after-error", Run: func(t T, h *Harness) {
			t.Error("broken")
			t.Skip("then skipped")
		}},
		{Group: "g", Name: "needs-missing", Needs: needTTY, Run: func(t T, h *Harness) { reached("needs-missing") }},
		{Group: "g", Name: "needs-present", Needs: needStopStart, Run: func(t T, h *Harness) {}},
		{Group: "g", Name: "panics", Run: func(t T, h *Harness) { panic("boom") }},
		{Group: "g", Name: "failnow-bare", Run: func(t T, h *Harness) { t.FailNow() }},
		{Group: "g", Name: "skipnow-bare", Run: func(t T, h *Harness) { t.SkipNow() }},
	}
	var progress []string
	h := testHarness(Options{OnCase: func(c CaseReport) { progress = append(progress, c.FullName()) }})
	rep := runCases(t.Context(), h, cases, Filter{})

	if rep.Driver != "synthetic" || rep.Passed != 2 || rep.Failed != 6 || rep.Skipped != 3 || len(rep.Cases) != len(cases) {
		t.Fatalf("report counts: %+v", rep)
	}
	got := reportByName(t, rep)
	want := map[string]struct {
		status Status
		reason string
	}{
		"g/pass":               {StatusPass, ""},
		"g/error-continues":    {StatusFail, "first problem\nsecond problem"},
		"g/fatal-stops":        {StatusFail, "stop here"},
		"g/fatal-helper-stops": {StatusFail, "deep"},
		"g/skip":               {StatusSkip, "no thing here"},
		"g/skip-after-error":   {StatusFail, "broken"},
		"g/needs-missing":      {StatusSkip, "driver does not claim Capabilities.TTY"},
		"g/needs-present":      {StatusPass, ""},
		"g/failnow-bare":       {StatusFail, "failed (FailNow without a message)"},
		"g/skipnow-bare":       {StatusSkip, "skipped (SkipNow without a reason)"},
	}
	for name, w := range want {
		if c := got[name]; c.Status != w.status || c.Reason != w.reason {
			t.Errorf("%s: status %q reason %q, want %q %q", name, c.Status, c.Reason, w.status, w.reason)
		}
	}
	if c := got["g/panics"]; c.Status != StatusFail || !strings.HasPrefix(c.Reason, "panic: boom") {
		t.Errorf("panics: %q %q", c.Status, c.Reason)
	}
	if !slices.Equal(after, []string{"error-continues"}) {
		t.Errorf("code after Fatal/Skip ran, or code after Error did not: %v", after)
	}
	if c := got["g/pass"]; !slices.Equal(c.Log, []string{"hello 1"}) {
		t.Errorf("pass log: %q", c.Log)
	}
	var order []string
	for _, c := range cases {
		order = append(order, c.FullName())
	}
	if !slices.Equal(progress, order) {
		t.Errorf("OnCase order %v, want %v", progress, order)
	}
}

func TestCleanupOrderContextTempDir(t *testing.T) {
	var order []int
	var ctxErrInCleanup error
	var tmp string
	cases := []Case{{Group: "g", Name: "cleanups", Run: func(t T, h *Harness) {
		t.Cleanup(func() { order = append(order, 1) })
		tmp = t.TempDir()
		if err := os.WriteFile(tmp+"/f", []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			order = append(order, 2)
			if _, err := os.Stat(tmp + "/f"); err != nil {
				t.Errorf("TempDir gone before a cleanup registered after it: %v", err)
			}
			ctxErrInCleanup = t.Context().Err()
		})
		t.Cleanup(func() {
			order = append(order, 3)
			t.Fatalf("cleanup 3 fails")
		})
		t.Cleanup(func() {
			order = append(order, 4)
			panic("cleanup 4 panics")
		})
		if t.Context().Err() != nil {
			t.Errorf("context cancelled while the case runs")
		}
	}}}
	rep := runCases(t.Context(), testHarness(Options{}), cases, Filter{})
	if !slices.Equal(order, []int{4, 3, 2, 1}) {
		t.Errorf("cleanup order %v, want [4 3 2 1]", order)
	}
	if ctxErrInCleanup == nil {
		t.Errorf("the case's context was not cancelled before its cleanups")
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("TempDir %s still there after the case: %v", tmp, err)
	}
	c := rep.Cases[0]
	if c.Status != StatusFail || !strings.Contains(c.Reason, "cleanup 3 fails") || !strings.Contains(c.Reason, "panic in cleanup: cleanup 4 panics") {
		t.Errorf("status %q reason %q", c.Status, c.Reason)
	}
}

func TestCaseTimeout(t *testing.T) {
	cleaned := make(chan struct{})
	cases := []Case{{Group: "g", Name: "hangs", Run: func(t T, h *Harness) {
		t.Cleanup(func() { close(cleaned) })
		<-t.Context().Done()
		t.Logf("context done: %v", t.Context().Err())
	}}}
	start := time.Now()
	rep := runCases(t.Context(), testHarness(Options{CaseTimeout: 200 * time.Millisecond}), cases, Filter{})
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("RunAll took %s past a 200 ms case timeout", d)
	}
	c := rep.Cases[0]
	if c.Status != StatusFail || c.Reason != "timed out after 200ms" {
		t.Errorf("status %q reason %q", c.Status, c.Reason)
	}
	select {
	case <-cleaned:
	default:
		t.Errorf("cleanup did not run")
	}
}

func TestCancelledRunSkipsRest(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cases := []Case{
		{Group: "g", Name: "first", Run: func(t T, h *Harness) { cancel() }},
		{Group: "g", Name: "second", Run: func(t T, h *Harness) { t.Errorf("ran") }},
	}
	rep := runCases(ctx, testHarness(Options{}), cases, Filter{})
	if rep.Passed != 1 || rep.Skipped != 1 || rep.Cases[1].Reason != "not run: the run was cancelled" {
		t.Errorf("%+v", rep)
	}
}

func TestFilter(t *testing.T) {
	cases := []Case{{Group: "exec", Name: "a"}, {Group: "exec", Name: "b"}, {Group: "tty", Name: "a"}}
	sel := func(f Filter) []string {
		var out []string
		for _, c := range cases {
			if f.Match(c) {
				out = append(out, c.FullName())
			}
		}
		return out
	}
	if got := sel(Filter{}); len(got) != 3 {
		t.Errorf("empty filter: %v", got)
	}
	if got := sel(Filter{Run: regexp.MustCompile(`^exec/`)}); !slices.Equal(got, []string{"exec/a", "exec/b"}) {
		t.Errorf("run ^exec/: %v", got)
	}
	if got := sel(Filter{Skip: regexp.MustCompile(`/a$`)}); !slices.Equal(got, []string{"exec/b"}) {
		t.Errorf("skip /a$: %v", got)
	}
	if got := sel(Filter{Run: regexp.MustCompile(`a`), Skip: regexp.MustCompile(`^tty`)}); !slices.Equal(got, []string{"exec/a"}) {
		t.Errorf("run a skip ^tty: %v", got)
	}
	ran := runCases(t.Context(), testHarness(Options{}), []Case{
		{Group: "g", Name: "in", Run: func(T, *Harness) {}},
		{Group: "g", Name: "out", Run: func(t T, _ *Harness) { t.Error("ran") }},
	}, Filter{Skip: regexp.MustCompile(`out`)})
	if len(ran.Cases) != 1 || ran.Cases[0].Name != "in" || ran.Passed != 1 {
		t.Errorf("filtered run: %+v", ran)
	}
	listed := List(Filter{Run: regexp.MustCompile(`^tty/`)})
	if len(listed) == 0 {
		t.Fatalf("List(^tty/) is empty")
	}
	for _, c := range listed {
		if c.Group != "tty" {
			t.Errorf("List(^tty/) has %s", c.FullName())
		}
	}
}

func TestCasesWellFormed(t *testing.T) {
	seen := map[string]bool{}
	name := regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
	groups := []string{}
	for _, c := range Cases() {
		if !name.MatchString(c.Group) || !name.MatchString(c.Name) {
			t.Errorf("bad case name %q", c.FullName())
		}
		if seen[c.FullName()] {
			t.Errorf("duplicate case %s", c.FullName())
		}
		seen[c.FullName()] = true
		if c.Run == nil {
			t.Errorf("%s has no Run", c.FullName())
		}
		if (c.Needs != nil) != (c.Requires != "") && !strings.Contains(c.Requires, "registry") {
			t.Errorf("%s: Needs and Requires disagree", c.FullName())
		}
		if len(groups) == 0 || groups[len(groups)-1] != c.Group {
			groups = append(groups, c.Group)
		}
	}
	if want := []string{"lifecycle", "idempotence", "exec", "tty", "isolation", "resources", "terminal", "retention", "pool", "recovery", "exec-dial", "tty-dial", "terminal-dial"}; !slices.Equal(groups, want) {
		t.Errorf("groups in order %v, want %v (each contiguous)", groups, want)
	}
	if len(seen) < 40 {
		t.Errorf("only %d cases", len(seen))
	}
	// Every capability-gated case names the capability in its skip reason.
	for _, c := range Cases() {
		if c.Needs == nil {
			continue
		}
		if ok, reason := c.Needs(backend.Capabilities{}); ok || reason == "" {
			t.Errorf("%s: Needs(zero caps) = %v %q, want a skip with a reason", c.FullName(), ok, reason)
		}
		all := backend.Capabilities{FSIsolation: backend.FSIsolationImage, PIDIsolation: true, NetworkModes: []string{"none"},
			TTY: true, CPULimit: true, MemoryLimit: true, PidsLimit: true, DropCapabilities: true, Copy: true,
			StopStart: true, ExecUser: true, ImagePull: true, ImageImport: true, Config: true, Agent: backend.AgentSocket, AgentDial: true, Validate: true}
		if ok, _ := c.Needs(all); !ok {
			t.Errorf("%s: Needs(all caps) = false", c.FullName())
		}
	}
}

func sampleReport() Report {
	var r Report
	r.Driver = "local"
	r.add(CaseReport{Group: "exec", Name: "ok", Status: StatusPass, DurationMS: 1500, Log: []string{"a log line"}})
	r.add(CaseReport{Group: "exec", Name: "bad", Status: StatusFail, Reason: "first line\nsecond <line> & more", DurationMS: 20})
	r.add(CaseReport{Group: "tty", Name: "none", Status: StatusSkip, Reason: "driver does not claim Capabilities.TTY"})
	return r
}

func TestReportJSON(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().JSON(&buf); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	keys := func(m map[string]any) []string {
		var k []string
		for key := range m {
			k = append(k, key)
		}
		slices.Sort(k)
		return k
	}
	if k := keys(got); !slices.Equal(k, []string{"cases", "driver", "failed", "passed", "skipped"}) {
		t.Errorf("top-level keys %v", k)
	}
	if got["driver"] != "local" || got["passed"] != 1.0 || got["failed"] != 1.0 || got["skipped"] != 1.0 {
		t.Errorf("top level %v", got)
	}
	cases := got["cases"].([]any)
	if len(cases) != 3 {
		t.Fatalf("cases %v", cases)
	}
	c1 := cases[1].(map[string]any)
	if k := keys(c1); !slices.Equal(k, []string{"duration_ms", "group", "name", "reason", "status"}) {
		t.Errorf("case keys %v", k)
	}
	if c1["name"] != "bad" || c1["group"] != "exec" || c1["status"] != "fail" || c1["reason"] != "first line\nsecond <line> & more" || c1["duration_ms"] != 20.0 {
		t.Errorf("case %v", c1)
	}
	buf.Reset()
	if err := (Report{Driver: "x"}).JSON(&buf); err != nil || !strings.Contains(buf.String(), `"cases": []`) {
		t.Errorf("empty report: %v %s", err, buf.String())
	}
}

func TestReportJUnit(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().JUnit(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "<?xml") {
		t.Errorf("no XML header: %s", buf.String())
	}
	var got struct {
		Tests    int `xml:"tests,attr"`
		Failures int `xml:"failures,attr"`
		Skipped  int `xml:"skipped,attr"`
		Suites   []struct {
			Name  string `xml:"name,attr"`
			Tests int    `xml:"tests,attr"`
			Time  string `xml:"time,attr"`
			Cases []struct {
				Name      string `xml:"name,attr"`
				Classname string `xml:"classname,attr"`
				Time      string `xml:"time,attr"`
				Failure   *struct {
					Message string `xml:"message,attr"`
					Text    string `xml:",chardata"`
				} `xml:"failure"`
				Skipped *struct {
					Message string `xml:"message,attr"`
				} `xml:"skipped"`
				SystemOut string `xml:"system-out"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	if got.Tests != 3 || got.Failures != 1 || got.Skipped != 1 || len(got.Suites) != 2 {
		t.Fatalf("%+v", got)
	}
	exec := got.Suites[0]
	if exec.Name != "conformance/local/exec" || exec.Tests != 2 || exec.Time != "1.520" {
		t.Errorf("suite %+v", exec)
	}
	ok, bad := exec.Cases[0], exec.Cases[1]
	if ok.Name != "ok" || ok.Classname != "conformance.local.exec" || ok.Time != "1.500" || ok.Failure != nil || ok.SystemOut != "a log line" {
		t.Errorf("ok case %+v", ok)
	}
	if bad.Failure == nil || bad.Failure.Message != "first line" || bad.Failure.Text != "first line\nsecond <line> & more" {
		t.Errorf("bad case %+v", bad)
	}
	if s := got.Suites[1].Cases[0].Skipped; s == nil || s.Message != "driver does not claim Capabilities.TTY" {
		t.Errorf("skipped case %+v", got.Suites[1].Cases[0])
	}
}

// With Options.Runtime the cases branch on that runtime's capabilities: a case the
// driver's default runtime could run but the runtime cannot is skipped naming the
// runtime and its kernel; one neither can run keeps its plain reason; a runtime the
// driver does not list fails the run's setup.
func TestRuntimeCapabilities(t *testing.T) {
	base := backend.Capabilities{MemoryLimit: true, StopStart: true}
	gv := base
	gv.MemoryLimit = false
	base.Runtimes = []backend.RuntimeCapabilities{{Name: "runsc", Kernel: backend.KernelGVisor, Capabilities: gv}}
	info := backend.Info{Name: "synthetic", Capabilities: base}
	h := newHarness(nil, info, Options{Runtime: "runsc"}, os.TempDir())
	if h.Info.Capabilities.MemoryLimit || len(h.Info.Capabilities.Runtimes) != 0 || !h.Info.Capabilities.StopStart {
		t.Fatalf("harness capabilities %+v, want runsc's", h.Info.Capabilities)
	}
	byName := map[string]Case{}
	for _, c := range Cases() {
		byName[c.FullName()] = c
	}
	ok, reason := h.applies(byName["resources/oom-137"])
	if ok || !strings.Contains(reason, "runtime runsc (kernel gvisor)") || !strings.Contains(reason, "MemoryLimit") {
		t.Errorf("oom-137 under runsc: %v %q, want a skip naming runsc, gvisor and MemoryLimit", ok, reason)
	}
	ok, reason = h.applies(byName["tty/is-terminal"])
	if ok || strings.Contains(reason, "runsc") {
		t.Errorf("tty under runsc (neither claims TTY): %v %q, want the plain reason", ok, reason)
	}
	if spec := h.Spec(t, "x"); spec.Runtime != "runsc" {
		t.Errorf("spec runtime %q, want runsc", spec.Runtime)
	}
	rep := RunAll(t.Context(), syntheticInfo{info}, Options{Runtime: "kata"}, Filter{})
	if rep.Failed != 1 || len(rep.Cases) != 1 || !strings.Contains(rep.Cases[0].Reason, `does not offer runtime "kata"`) {
		t.Errorf("run with an unknown runtime: %+v, want one failed setup case saying so", rep)
	}
}

// syntheticInfo is a backend whose Info is fixed; RunAll with an unknown runtime
// calls nothing else.
type syntheticInfo struct{ info backend.Info }

func (s syntheticInfo) Info(context.Context) (backend.Info, error) { return s.info, nil }
func (syntheticInfo) Create(context.Context, backend.CreateRequest) (backend.Sandbox, error) {
	return backend.Sandbox{}, backend.ErrUnsupported
}
func (syntheticInfo) Inspect(context.Context, string) (backend.Sandbox, error) {
	return backend.Sandbox{}, backend.ErrUnsupported
}
func (syntheticInfo) List(context.Context, map[string]string) ([]backend.Sandbox, error) {
	return nil, nil
}
func (syntheticInfo) Stop(context.Context, string, time.Duration) error { return nil }
func (syntheticInfo) Remove(context.Context, string) error              { return nil }
func (syntheticInfo) Close() error                                      { return nil }

func TestSelectGroups(t *testing.T) {
	cases := []Case{{Group: "exec", Name: "a"}, {Group: "tty", Name: "b"}, {Group: "exec", Name: "c"}}
	got, err := selectGroups(cases, []string{"exec"})
	if err != nil || len(got) != 2 || got[0].Name != "a" || got[1].Name != "c" {
		t.Fatalf("selectGroups(exec) = %v, %v; want cases a and c", got, err)
	}
	if got, err := selectGroups(cases, nil); err != nil || len(got) != 3 {
		t.Fatalf("selectGroups(nil) = %v, %v; want all three cases", got, err)
	}
	if _, err := selectGroups(cases, []string{"exec", "tyy"}); err == nil || !strings.Contains(err.Error(), `"tyy"`) || !strings.Contains(err.Error(), "exec, tty") {
		t.Fatalf("selectGroups(tyy) error = %v, want it to name tyy and the groups", err)
	}
}
