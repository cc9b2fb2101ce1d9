package local_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/local"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// markedPids returns the pids of processes whose environment holds mark=1.
func markedPids(mark string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err == nil && bytes.Contains(append([]byte{0}, env...), []byte("\x00"+mark+"=1\x00")) {
			out = append(out, pid)
		}
	}
	return out
}

func waitGone(t *testing.T, mark string) {
	t.Helper()
	testwait.Until(t, "the processes marked "+mark+" to end", func() bool { return len(markedPids(mark)) == 0 })
}

// TestDeletedDirectory: when a sandbox's directory is deleted by hand, Remove still
// ends its agent and processes, and a new Create of the name starts cleanly.
func TestDeletedDirectory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	state := t.TempDir()
	driverDir := filepath.Join(state, "drivers", "local")
	d := local.New(local.WithStateDir(driverDir))
	defer d.Close()
	bin, err := agent.Install(state, berthBin)
	if err != nil {
		t.Fatal(err)
	}
	files, err := agent.PrepareSandbox(filepath.Join(state, "sandboxes", "sb"), bin)
	if err != nil {
		t.Fatal(err)
	}
	req := backend.CreateRequest{Spec: backend.SandboxSpec{Name: "sb", Labels: map[string]string{backend.LabelOwner: "o"}}, Agent: files}
	start := func(mark string) {
		t.Helper()
		if _, err := d.Create(ctx, req); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		p, err := agent.Exec(ctx, files, backend.ExecRequest{Argv: []string{"sh", "-c", "sleep 300 & echo started"}, Env: []string{mark + "=1"}, Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 || strings.TrimSpace(out.String()) != "started" {
			t.Fatalf("exec: %+v %v %q", res, err, out.String())
		}
		// The sleep may still be between fork and exec, when its environ reads empty.
		testwait.Until(t, "the background sleep to run", func() bool { return len(markedPids(mark)) > 0 })
	}

	mark1 := "BERTH_LOCAL_T1_" + strconv.Itoa(os.Getpid())
	start(mark1)
	if err := os.RemoveAll(filepath.Join(driverDir, "sandboxes", "sb")); err != nil {
		t.Fatal(err)
	}
	d.Close() // forget the cached agent connection, as a new berth process would
	if err := d.Remove(ctx, "sb"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, mark1)

	mark2 := "BERTH_LOCAL_T2_" + strconv.Itoa(os.Getpid())
	start(mark2)
	if err := os.RemoveAll(filepath.Join(driverDir, "sandboxes", "sb")); err != nil {
		t.Fatal(err)
	}
	d.Close()
	mark3 := "BERTH_LOCAL_T3_" + strconv.Itoa(os.Getpid())
	start(mark3) // a new Create over the leftovers
	waitGone(t, mark2)
	if err := d.Remove(ctx, "sb"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, mark3)
}

// TestSameNameOtherDriver: two drivers built on this package, each with its own state
// dir, may both have a sandbox of one name (the registry names sandboxes by session,
// not by driver: a session whose rule moved from one driver to the other). Stopping or
// removing one of them, also after its directory was deleted by hand, never ends the
// other's processes.
func TestSameNameOtherDriver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	state := t.TempDir()
	bin, err := agent.Install(state, berthBin)
	if err != nil {
		t.Fatal(err)
	}
	type drv struct {
		d    *local.Driver
		dir  string
		req  backend.CreateRequest
		mark string
	}
	var ds []*drv
	for i, name := range []string{"local", "other"} {
		dir := filepath.Join(state, "drivers", name)
		files, err := agent.PrepareSandbox(filepath.Join(state, "sandboxes", name, "sb"), bin)
		if err != nil {
			t.Fatal(err)
		}
		x := &drv{d: local.New(local.WithStateDir(dir)), dir: dir, mark: "BERTH_LOCAL_SAME" + strconv.Itoa(i) + "_" + strconv.Itoa(os.Getpid()),
			req: backend.CreateRequest{Spec: backend.SandboxSpec{Name: "sb", Labels: map[string]string{backend.LabelOwner: "o"}}, Agent: files}}
		defer x.d.Remove(context.Background(), "sb")
		defer x.d.Close()
		ds = append(ds, x)
	}
	start := func(x *drv) {
		t.Helper()
		if _, err := x.d.Create(ctx, x.req); err != nil {
			t.Fatal(err)
		}
		p, err := agent.Exec(ctx, x.req.Agent, backend.ExecRequest{Argv: []string{"sh", "-c", "sleep 300 &"}, Env: []string{x.mark + "=1"}})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %+v %v", res, err)
		}
		testwait.Until(t, "the background sleep to run", func() bool { return len(markedPids(x.mark)) > 0 })
	}
	alive := func(x *drv, after string) {
		t.Helper()
		if len(markedPids(x.mark)) == 0 {
			t.Fatalf("after %s, the first driver's background process is gone", after)
		}
		var out bytes.Buffer
		p, err := agent.Exec(ctx, x.req.Agent, backend.ExecRequest{Argv: []string{"sh", "-c", "echo $HOME"}, Stdout: &out})
		if err != nil {
			t.Fatalf("after %s, exec in the first driver's sandbox: %v", after, err)
		}
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 || !strings.HasPrefix(out.String(), x.dir) {
			t.Fatalf("after %s, exec in the first driver's sandbox: %+v %v %q", after, res, err, out.String())
		}
	}
	start(ds[0])
	start(ds[1])
	if err := ds[1].d.Stop(ctx, "sb", 0); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ds[1].mark)
	alive(ds[0], "Stop of the other driver's sandbox")

	start(ds[1])
	if err := os.RemoveAll(filepath.Join(ds[1].dir, "sandboxes", "sb")); err != nil {
		t.Fatal(err)
	}
	ds[1].d.Close()
	if err := ds[1].d.Remove(ctx, "sb"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ds[1].mark)
	alive(ds[0], "Remove of the other driver's sandbox whose directory was deleted")

	if err := ds[0].d.Remove(ctx, "sb"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ds[0].mark)
}
