package local_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-sh/berth/registry"
)

// A session's full-output files stay within output_max_total (a call deletes the
// oldest ones, never its own) and prune deletes those older than output_max_age.
func TestShellOutputFilesBounded(t *testing.T) {
	t.Parallel()
	var shift atomic.Int64 // registry clock offset, in nanoseconds
	open := localRegistries(t, t.TempDir(), "output_max_total = 6000\noutput_max_age = \"1d\"\n",
		registry.WithClock(func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }))
	r := open()
	ctx := context.Background()
	// seq 1 1000 is 3893 bytes: each call leaves one file; two do not fit in 6000.
	call := func() registry.ShellResult {
		t.Helper()
		res, err := r.Shell(ctx, "out:1", registry.ShellRequest{Command: "seq 1 1000", MaxOutput: 100})
		if err != nil || res.StdoutFile == "" || res.StdoutFileTruncatedBytes != 0 {
			t.Fatalf("shell call: %+v, %v", res, err)
		}
		return res
	}
	first := call()
	if first.OutputFilesRemoved != 0 {
		t.Errorf("first call removed %d files", first.OutputFilesRemoved)
	}
	second := call()
	if second.OutputFilesRemoved != 1 {
		t.Errorf("second call removed %d files, want 1 (the first call's)", second.OutputFilesRemoved)
	}
	if _, err := os.Stat(first.StdoutFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the oldest file is still there: %v", err)
	}
	if fi, err := os.Stat(second.StdoutFile); err != nil || fi.Size() != 3893 {
		t.Errorf("the call's own file: %v, %v", fi, err)
	}
	// A file bigger than the whole bound is kept for the call that made it.
	big, err := r.Shell(ctx, "out:1", registry.ShellRequest{Command: "seq 1 5000", MaxOutput: 100})
	if err != nil || big.OutputFilesRemoved != 1 {
		t.Errorf("call over the bound: removed %d, %v", big.OutputFilesRemoved, err)
	}
	if _, err := os.Stat(big.StdoutFile); err != nil {
		t.Errorf("a call's own file was removed: %v", err)
	}

	// A file last written over a day ago is past output_max_age (file times are real
	// time: the registry's clock does not age them); a dry run reports it, prune
	// removes it, and leaves younger ones.
	shift.Store(int64(25 * time.Hour))
	if _, err := r.Prune(ctx, registry.PruneOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(big.StdoutFile); err != nil {
		t.Errorf("a shifted clock aged a file: %v", err)
	}
	shift.Store(0)
	past := time.Now().Add(-25 * time.Hour)
	if err := os.Chtimes(big.StdoutFile, past, past); err != nil {
		t.Fatal(err)
	}
	young, err := r.Shell(ctx, "out:2", registry.ShellRequest{Command: "seq 1 1000", MaxOutput: 100})
	if err != nil || young.StdoutFile == "" {
		t.Fatalf("shell call: %+v, %v", young, err)
	}
	rep, err := r.Prune(ctx, registry.PruneOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range rep.Actions {
		if a.Path == big.StdoutFile {
			found = a.Action == registry.PruneDelete && a.Cause == registry.CauseAge && !a.Done
		}
	}
	if !found {
		t.Errorf("dry run does not report the old file for deletion: %+v", rep.Actions)
	}
	if _, err := r.Prune(ctx, registry.PruneOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(big.StdoutFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("prune left a file older than output_max_age: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(big.StdoutFile)); err != nil {
		t.Errorf("prune removed the live session's output dir: %v", err)
	}
	if _, err := os.Stat(young.StdoutFile); err != nil {
		t.Errorf("prune removed a young file: %v", err)
	}
}
