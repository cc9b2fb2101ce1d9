package conformance

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// The /proc scans run here with the host's sh and grep on real processes, as they run
// in a sandbox without PID isolation.

func TestMarkedScriptFindsMarkedProcess(t *testing.T) {
	mark := newMarker()
	cmd := exec.Command("sleep", "60")
	cmd.Env = append(os.Environ(), mark)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	out, err := exec.Command("sh", "-c", markedScript, "sh", mark).Output()
	if err != nil {
		t.Fatalf("markedScript: %v", err)
	}
	ps := parseStat(string(out))
	if len(ps) != 1 || ps[0].PID != cmd.Process.Pid || ps[0].Comm != "sleep" || !ps[0].live() || ps[0].PPID != os.Getpid() {
		t.Errorf("marked processes %v, want only pid %d (sleep), live, child of %d", ps, cmd.Process.Pid, os.Getpid())
	}
	if pids := hostMarked(mark); !slices.Equal(pids, []int{cmd.Process.Pid}) {
		t.Errorf("hostMarked = %v, want [%d]", pids, cmd.Process.Pid)
	}
	// Another marker finds nothing (and the scanning processes never find themselves).
	out, err = exec.Command("sh", "-c", markedScript, "sh", newMarker()).Output()
	if err != nil || len(parseStat(string(out))) != 0 {
		t.Errorf("unused marker: %v %q", err, out)
	}
	if pids := hostMarked(newMarker()); len(pids) != 0 {
		t.Errorf("hostMarked(unused) = %v", pids)
	}
}

func TestStatScriptSeesZombie(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer func() { _ = cmd.Wait() }()
	var found procInfo
	ok := testwait.For(t.Context(), 0, func() bool {
		out, err := exec.Command("sh", "-c", statScript).Output()
		if err != nil {
			t.Fatalf("statScript: %v", err)
		}
		for _, p := range parseStat(string(out)) {
			if p.PID == pid && p.State == 'Z' {
				found = p
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("the unwaited child %d never showed as a zombie", pid)
	}
	if found.PPID != os.Getpid() || found.live() {
		t.Errorf("zombie %v: want ppid %d and not live", found, os.Getpid())
	}
}

func TestParseStat(t *testing.T) {
	text := "12 (a (b) c) S 1 12 12 0 -1\n" +
		"garbage\n" +
		"13 (z) Z 12 13 7 0\n" +
		"\n"
	ps := parseStat(text)
	if len(ps) != 2 {
		t.Fatalf("%v", ps)
	}
	if p := ps[0]; p.PID != 12 || p.Comm != "a (b) c" || p.State != 'S' || p.PPID != 1 || p.PGRP != 12 || p.SID != 12 {
		t.Errorf("%+v", p)
	}
	if p := ps[1]; p.PID != 13 || p.State != 'Z' || p.PPID != 12 || p.SID != 7 || p.live() {
		t.Errorf("%+v", p)
	}
}

func TestSeqVerifierAgainstRealSeq(t *testing.T) {
	const n = 3 << 20
	cmd := exec.Command("sh", "-c", "seq 1 1000000 | head -c 3145728")
	v := newVerifier(newSeqGen())
	cmd.Stdout = v
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	got, mismatch, sum := v.result()
	if got != n || mismatch != -1 || sum != prefixSum(newSeqGen(), n) {
		t.Errorf("n %d mismatch %d sum %s", got, mismatch, sum)
	}
}

func TestVerifierFindsDifference(t *testing.T) {
	gen := newStreamGen()
	data := make([]byte, 100000)
	_, _ = gen.clone().Read(data)
	data[77777] ^= 1
	v := newVerifier(gen.clone())
	for b := data; len(b) > 0; {
		c := min(len(b), 4099)
		_, _ = v.Write(b[:c])
		b = b[c:]
	}
	n, mismatch, sum := v.result()
	if n != 100000 || mismatch != 77777 || sum == prefixSum(gen.clone(), n) {
		t.Errorf("n %d mismatch %d", n, mismatch)
	}
	// Two clones produce the same stream, and it is not trivially periodic.
	a, b := make([]byte, 1000), make([]byte, 1000)
	_, _ = gen.clone().Read(a)
	r := gen.clone()
	_, _ = io.ReadFull(r, b[:7])
	_, _ = io.ReadFull(r, b[7:])
	if !bytes.Equal(a, b) || bytes.Equal(a[:32], a[32:64]) {
		t.Errorf("stream generator is not deterministic or is periodic")
	}
}

func TestNotifyWriter(t *testing.T) {
	w := newNotifyWriter("started\n")
	_, _ = w.Write([]byte("sta"))
	select {
	case <-w.seen:
		t.Fatal("seen too early")
	default:
	}
	_, _ = w.Write([]byte("rted\nmore"))
	_, _ = w.Write([]byte("started\n"))
	select {
	case <-w.seen:
	default:
		t.Fatal("not seen")
	}
	if w.String() != "started\nmorestarted\n" {
		t.Errorf("%q", w.String())
	}
}

func TestRegistryConfig(t *testing.T) {
	h := testHarness(Options{Image: "berth-test/busybox:1", Runtime: "runsc"})
	cfg := h.registryConfig("abcd")
	for _, want := range []string{`scope "conf-iso-abcd:*" {`, `isolation = "session"`, `scope "conf-shared-abcd:*" {`, `isolation = "shared"`, `name      = "conf-shared-abcd"`, `driver    = "synthetic"`, `image = "berth-test/busybox:1"`, `runtime = "runsc"`} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	if c := testHarness(Options{}).registryConfig("x"); strings.Contains(c, "image") || strings.Contains(c, "runtime") {
		t.Errorf("config without Options.Image and Runtime sets them:\n%s", c)
	}
}

func TestSandboxNameAndSpec(t *testing.T) {
	h := testHarness(Options{Owner: "owner-1"})
	name := SandboxName()
	if len(name) != 18 || !strings.HasPrefix(name, "bconf-") {
		t.Errorf("SandboxName() = %q", name)
	}
	spec := h.Spec(t, name)
	for _, k := range []string{"berth.owner", "berth.session", "berth.scope", "berth.created", "berth.spec-hash", RunLabel} {
		if spec.Labels[k] == "" {
			t.Errorf("spec lacks label %s: %v", k, spec.Labels)
		}
	}
	if spec.Labels["berth.owner"] != "owner-1" || spec.Labels[RunLabel] != h.RunID || spec.Name != name {
		t.Errorf("%+v", spec)
	}
	if _, err := time.Parse(time.RFC3339, spec.Labels["berth.created"]); err != nil {
		t.Errorf("berth.created: %v", err)
	}
	if _, err := DefaultPrepareAgent("")(t.TempDir(), name); err == nil || !strings.Contains(err.Error(), "AgentBinary") {
		t.Errorf("DefaultPrepareAgent(\"\"): %v", err)
	}
}
