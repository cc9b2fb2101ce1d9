package kubernetes_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/k8stest"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/kubernetes"
	"github.com/berth-sh/berth/registry"
)

// cliEnv is a config file and a state dir of its own for whole berth commands on
// the test cluster: sessions "fault:*" run on the kubernetes driver.
type cliEnv struct {
	t             *testing.T
	c             k8stest.Cluster
	cfg           kubernetes.Config
	config, state string
	admin         *k8s.Clientset
	extra         []string // more environment
}

func newCLIEnv(t *testing.T) *cliEnv {
	t.Helper()
	c, cfg := cluster(t)
	e := &cliEnv{t: t, c: c, cfg: cfg, config: filepath.Join(t.TempDir(), "config.hcl"), state: t.TempDir(), admin: adminClient(t, c)}
	e.writeConfig("")
	t.Cleanup(func() {
		if owner, err := os.ReadFile(filepath.Join(e.state, registry.OwnerFile)); err == nil {
			noneLeft(t, c, strings.TrimSpace(string(owner)))
		}
	})
	return e
}

// writeConfig writes the env's config: "fault:*" sessions run on the kubernetes
// driver, but session local (when not "") runs on local.
func (e *cliEnv) writeConfig(local string) {
	hcl := driverBlock(e.cfg)
	if local != "" {
		hcl += fmt.Sprintf("\nscope %q {\n  driver = \"local\"\n}\n", local)
	}
	hcl += fmt.Sprintf("\nscope \"fault:*\" {\n  driver = \"kubernetes\"\n  image  = %q\n}\n", e.c.TestImage)
	if err := os.WriteFile(e.config, []byte(hcl), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *cliEnv) command(args ...string) *exec.Cmd {
	cmd := exec.Command(testbin.Front(berthBin), args...)
	cmd.Env = append(append(os.Environ(), "BERTH_CONFIG="+e.config, "BERTH_STATE_DIR="+e.state), e.extra...)
	return cmd
}

// berth runs a berth command to its end and returns its stdout and stderr.
func (e *cliEnv) berth(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	cmd := e.command(args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return "", "", err
	}
	stop := context.AfterFunc(ctx, func() { cmd.Process.Kill() })
	defer stop()
	err := cmd.Wait()
	return stdout.String(), stderr.String(), err
}

// must is berth that fails the test when the command fails.
func (e *cliEnv) must(args ...string) (string, string) {
	e.t.Helper()
	out, stderr, err := e.berth(args...)
	if err != nil {
		e.t.Fatalf("berth %s: %v\nstdout %q\nstderr %q", strings.Join(args, " "), err, out, stderr)
	}
	return out, stderr
}

// serve starts `berth serve` for the env (startServe).
func (e *cliEnv) serve() { startServe(e.t, e.command("serve"), e.state) }

// startServe starts cmd, a `berth serve` of state dir state, and waits until its
// socket answers; it is stopped (SIGTERM) when the test or benchmark ends.
func startServe(tb testing.TB, cmd *exec.Cmd, state string) {
	tb.Helper()
	var log testwait.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	tb.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	})
	sock := filepath.Join(state, "berth.sock")
	testwait.Until(tb, "berth serve's socket", func() bool {
		select {
		case <-exited:
			tb.Fatalf("berth serve exited: %s", log.String())
		default:
		}
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// pod returns the Pod that sandbox hostname runs in, as the admin sees it.
func (e *cliEnv) pod(name string) *corev1.Pod {
	e.t.Helper()
	p, err := e.admin.CoreV1().Pods(e.c.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("the Pod %s: %v", name, err)
	}
	return p
}

// TestPodDeletedBehindBack: a session's Pod deleted by someone else (the admin,
// kubectl delete) is noticed at the session's next call, which makes a new, empty
// Pod and says so with the usual notice; embedded, and through berth serve, whose
// registry keeps the agent connection that the deletion broke. Without a storage
// class: with one, the sandbox's volume claim outlives the Pod, so the sandbox is
// stopped and the next call starts it on its volume, as after berth stop
// (TestVolumeKeepsWorkdir), with no notice.
func TestPodDeletedBehindBack(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"embedded", "serve"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := newCLIEnv(t)
			e.cfg.StorageClass = ""
			e.writeConfig("")
			if mode == "serve" {
				e.serve()
			} else {
				e.extra = append(e.extra, "BERTH_NO_DAEMON=1")
			}
			s := "fault:deleted-" + mode
			t.Cleanup(func() { e.berth("rm", s) })
			out, _ := e.must("exec", "-s", s, "--", "sh", "-c", "echo old > /tmp/mark; hostname")
			host := strings.TrimSpace(out)
			old := e.pod(host)
			if out, _ := e.must("exec", "-s", s, "--", "cat", "/tmp/mark"); out != "old\n" {
				t.Fatalf("the session's second call read %q, want its file", out)
			}
			if _, err := e.c.KubectlAs(context.Background(), e.c.AdminKubeconfig, "", "delete", "pod", host, "--wait=true"); err != nil {
				t.Fatal(err)
			}
			out, stderr := e.must("exec", "-s", s, "--", "sh", "-c", "cat /tmp/mark 2>/dev/null; hostname")
			if strings.TrimSpace(out) != host {
				t.Errorf("after the deletion the session ran in %q, want a new Pod %s with nothing of the old one", out, host)
			}
			if want := "berth: session " + s + ": its previous sandbox"; !strings.Contains(stderr, want) || !strings.Contains(stderr, "no longer existed on driver kubernetes") {
				t.Errorf("the call after the deletion said %q, want the notice %q... no longer existed on driver kubernetes", stderr, want)
			}
			if now := e.pod(host); now.UID == old.UID {
				t.Errorf("the Pod %s is still the deleted one (uid %s)", host, old.UID)
			}
			// And the one after that is quiet, on the new Pod.
			if out, stderr := e.must("exec", "-s", s, "--", "true"); out != "" || stderr != "" {
				t.Errorf("the next call: stdout %q stderr %q, want nothing", out, stderr)
			}
		})
	}
}

// TestKillDuringCreate: berth killed with SIGKILL while it creates a session's Pod
// (as soon as the Pod exists, before its agent answered and anything was recorded).
//
// Killed with its plugin process (a machine that lost power, the OOM killer, kill
// -9 of the process group): a Pod of its owner is left that no record names.
// Within the grace period prune keeps it (it may be mid-create); past it
// (BERTH_CLOCK_OFFSET) prune adopts it when a rule still maps its session, and the
// next call uses that same Pod, or removes it when none does.
//
// Killed alone: its plugin notices and ends, removing the Pod its cancelled Create
// made (or leaving it, if it ended first); either way the session's next call
// works and leaves one Pod, the recorded one.
func TestKillDuringCreate(t *testing.T) {
	t.Parallel()
	e := newCLIEnv(t)
	e.extra = append(e.extra, "BERTH_NO_DAEMON=1")
	// The store and owner id exist before the kill, as they do for any berth whose
	// earlier commands ran (prune makes them).
	e.must("prune", "--dry-run")
	adopted := e.killCreating("fault:killed-adopt", true)
	removed := e.killCreating("fault:killed-remove", true)
	alone := e.killCreating("fault:killed-alone", false)
	for _, s := range []string{"fault:killed-adopt", "fault:killed-alone"} {
		t.Cleanup(func() { e.berth("rm", s) })
	}

	// Within the grace period: both are kept.
	acts := e.prune()
	for _, p := range []*corev1.Pod{adopted, removed} {
		if a := acts[p.Name]; a.Action != registry.PruneKeep || a.Cause != registry.CauseGrace {
			t.Errorf("prune within the grace period, Pod %s: %+v, want keep (grace)", p.Name, a)
		}
	}
	// Past it: adopted while a rule maps its session to it, and the session's next
	// call runs there; removed when none does (its session now runs on local).
	past := "BERTH_CLOCK_OFFSET=16m" // registry.DefaultOrphanGrace is 15m
	e.writeConfig("fault:killed-remove")
	acts = e.prune(past)
	e.writeConfig("")
	if a := acts[adopted.Name]; a.Action != registry.PruneAdopt || !a.Done {
		t.Errorf("prune past the grace period, Pod %s whose rule maps it: %+v, want adopt, done", adopted.Name, a)
	}
	if out, _ := e.must("exec", "-s", "fault:killed-adopt", "--", "hostname"); strings.TrimSpace(out) != adopted.Name {
		t.Errorf("the adopted session ran on %q, want Pod %s", out, adopted.Name)
	}
	if now := e.pod(adopted.Name); now.UID != adopted.UID {
		t.Errorf("the adopted session's Pod is new (uid %s), want the one its killed create made (%s)", now.UID, adopted.UID)
	}
	if a := acts[removed.Name]; a.Action != registry.PruneRemove || a.Cause != registry.CauseOrphan || !a.Done {
		t.Errorf("prune past the grace period, Pod %s that no rule maps: %+v, want remove (orphan), done", removed.Name, a)
	}
	if _, err := e.admin.CoreV1().Pods(e.c.Namespace).Get(context.Background(), removed.Name, metav1.GetOptions{}); err == nil {
		t.Errorf("the orphan Pod %s is still there after prune removed it", removed.Name)
	}
	// berth alone killed: the next call works, on the one Pod of the session.
	if out, _ := e.must("exec", "-s", "fault:killed-alone", "--", "hostname"); strings.TrimSpace(out) != alone.Name {
		t.Errorf("the session whose berth was killed alone ran on %q, want Pod %s", out, alone.Name)
	}
	if now := e.pod(alone.Name); now.UID == alone.UID {
		t.Logf("berth killed alone: its plugin ended before removing the Pod; the next call adopted it")
	} else {
		t.Logf("berth killed alone: its plugin removed the Pod; the next call made a new one")
	}
	if a := e.prune(past)[alone.Name]; a.Action != registry.PruneKeep || a.Cause != registry.CauseRecorded {
		t.Errorf("prune of the session whose berth was killed alone: %+v, want keep (recorded)", a)
	}
}

// killCreating starts `berth exec -s session -- true` and, as soon as its Pod is
// created, kills it with SIGKILL: with its plugin process (both stopped first, so
// that neither sees the other go), or alone. It checks that the plugin ended and
// that nothing recorded the session, and returns the Pod as it was created.
func (e *cliEnv) killCreating(session string, withPlugin bool) *corev1.Pod {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	owner, err := os.ReadFile(filepath.Join(e.state, registry.OwnerFile))
	if err != nil {
		t.Fatal(err)
	}
	sel := metav1.ListOptions{LabelSelector: backend.LabelOwner + "=" + strings.TrimSpace(string(owner))}
	list, err := e.admin.CoreV1().Pods(e.c.Namespace).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	sel.ResourceVersion = list.ResourceVersion // Pods made from now on
	w, err := e.admin.CoreV1().Pods(e.c.Namespace).Watch(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	cmd := e.command("exec", "-s", session, "--", "true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pod *corev1.Pod
	for ev := range w.ResultChan() {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok || ev.Type != watch.Added {
			continue
		}
		var labels map[string]string
		if json.Unmarshal([]byte(p.Annotations[kubernetes.AnnotationLabels]), &labels) == nil && labels[backend.LabelSession] == session {
			pod = p
			break
		}
	}
	plugins := childrenOf(cmd.Process.Pid)
	if withPlugin {
		for _, pid := range plugins {
			syscall.Kill(pid, syscall.SIGSTOP)
		}
		cmd.Process.Signal(syscall.SIGSTOP)
		for _, pid := range plugins {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	if pod == nil {
		t.Fatalf("no Pod of session %s appeared; berth said %q", session, stderr.String())
	}
	if len(plugins) == 0 {
		t.Fatalf("berth had no plugin process when its Pod appeared")
	}
	testwait.Until(t, "the killed berth's plugin process to end", func() bool {
		for _, pid := range plugins {
			if !gone(pid) {
				return false
			}
		}
		return true
	})
	out, _ := e.must("sessions", "--json")
	if strings.Contains(out, session) {
		t.Fatalf("session %s was recorded before berth was killed (its create had finished): %s", session, out)
	}
	return pod
}

// prune runs berth prune --json with env added to its environment and returns its
// actions by sandbox (Pod) name.
func (e *cliEnv) prune(env ...string) map[string]registry.PruneAction {
	e.t.Helper()
	saved := e.extra
	e.extra = append(append([]string(nil), e.extra...), env...)
	out, _ := e.must("prune", "--json")
	e.extra = saved
	var rep registry.PruneReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		e.t.Fatalf("berth prune --json: %v: %s", err, out)
	}
	m := map[string]registry.PruneAction{}
	for _, a := range rep.Actions {
		if a.Driver == kubernetes.Name {
			m[kubernetes.PodName(a.Sandbox)] = a
		}
	}
	return m
}

// childrenOf returns the pids of the processes whose parent is pid.
func childrenOf(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, ent := range ents {
		if _, err := strconv.Atoi(ent.Name()); err != nil {
			continue
		}
		if ppid, _, ok := procStat(ent.Name()); ok && ppid == pid {
			n, _ := strconv.Atoi(ent.Name())
			out = append(out, n)
		}
	}
	return out
}

// gone reports whether pid has exited (a zombie counts).
func gone(pid int) bool {
	_, state, ok := procStat(strconv.Itoa(pid))
	return !ok || state == 'Z'
}

// procStat reads the parent pid and state of process pid from /proc/PID/stat.
func procStat(pid string) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0, 0, false
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0][0], err == nil
}
