package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sh/berth/internal/testsupport/benchutil"
)

// servePid returns the pid of the berth serve whose socket is sock, from the serve
// lock beside it.
func servePid(b *testing.B, sock string) int {
	b.Helper()
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(sock), serveLock))
	if err != nil {
		b.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		b.Fatalf("serve lock %q: %v", raw, err)
	}
	return pid
}

// procStatus returns a /proc/PID/status field in bytes (VmRSS, VmHWM).
func procStatus(b testing.TB, pid int, field string) int64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// cpuTime returns the user+system CPU time pid has used (/proc/PID/stat, at the
// kernel's USER_HZ of 100).
func cpuTime(b *testing.B, pid int) time.Duration {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// BenchmarkServeConcurrent runs 200 concurrent execs of `true` across 50 warm local
// sessions through the API per round (one Go HTTP client, up to 200 connections);
// any failed exec fails the benchmark. It reports the execs' p50/p95 and the
// daemon's RSS before the first round and after the last.
//
//	go test ./cli -run '^$' -bench ServeConcurrent -benchtime 30x
func BenchmarkServeConcurrent(b *testing.B) {
	const sessions, concurrent = 50, 200
	_, client, sock := benchServe(b, "")
	pid := servePid(b, sock)
	posts := make([]func() error, sessions)
	setup := make([]error, sessions)
	var wg sync.WaitGroup
	for i := range posts {
		wg.Add(1)
		go func() { // creates the sandboxes, 50 at once
			defer wg.Done()
			session := fmt.Sprintf("c:%d", i)
			// Not benchExec: its b.Fatal cannot stop the benchmark from this goroutine.
			if _, setup[i] = postTrue(client, session); setup[i] == nil {
				posts[i] = func() error { _, err := postTrue(client, session); return err }
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(setup...); err != nil {
		b.Fatalf("creating the %d sessions' sandboxes: %v", sessions, err)
	}
	rssBefore := procStatus(b, pid, "VmRSS")
	var samples []time.Duration
	var mu sync.Mutex
	var failed []error
	b.ResetTimer()
	for round := 0; round < max(b.N, 1); round++ {
		for i := 0; i < concurrent; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				err := posts[i%sessions]()
				d := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				samples = append(samples, d)
				if err != nil {
					failed = append(failed, err)
				}
			}()
		}
		wg.Wait()
	}
	b.StopTimer()
	if len(failed) > 0 {
		b.Fatalf("%d of %d execs failed, first: %v", len(failed), len(samples), failed[0])
	}
	rssAfter := procStatus(b, pid, "VmRSS")
	benchutil.Report(b, []string{"exec"}, [][]time.Duration{samples})
	b.ReportMetric(float64(rssBefore)/(1<<20), "rss-before-MiB")
	b.ReportMetric(float64(rssAfter)/(1<<20), "rss-after-MiB")
	b.Logf("%d execs, 0 errors; daemon RSS %.1f MiB before, %.1f MiB after (peak %.1f MiB)", len(samples),
		float64(rssBefore)/(1<<20), float64(rssAfter)/(1<<20), float64(procStatus(b, pid, "VmHWM"))/(1<<20))
}

// BenchmarkServeIdle measures the daemon with 100 idle local sessions: its RSS, and
// its CPU use over b.N seconds of idling (prune rounds every 30 s included when b.N
// reaches them).
//
//	go test ./cli -run '^$' -bench ServeIdle -benchtime 60x
func BenchmarkServeIdle(b *testing.B) {
	const sessions = 100
	_, client, sock := benchServe(b, "")
	pid := servePid(b, sock)
	sem := make(chan struct{}, 10)
	var wg sync.WaitGroup
	for i := 0; i < sessions; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			benchExec(b, client, fmt.Sprintf("idle:%d", i))
		}()
	}
	wg.Wait()
	client.CloseIdleConnections()
	window := time.Duration(max(b.N, 1)) * time.Second
	b.ResetTimer()
	cpu0, t0 := cpuTime(b, pid), time.Now()
	time.Sleep(window) // the measurement itself: the daemon idles for the window
	cpu, wall := cpuTime(b, pid)-cpu0, time.Since(t0)
	b.StopTimer()
	rss := procStatus(b, pid, "VmRSS")
	b.ReportMetric(float64(rss)/(1<<20), "idle-rss-MiB")
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "idle-cpu-%")
	b.Logf("%d idle sessions: RSS %.1f MiB, CPU %v over %v (%.3f%%)", sessions, float64(rss)/(1<<20), cpu, wall.Round(time.Millisecond), 100*cpu.Seconds()/wall.Seconds())
}
