// Package phase records when a berth command reaches the phases of its work, for the
// breakdown of a command's time in docs/architecture.md. It costs nothing unless
// Enable was called (berth does when BERTH_TRACE is set, a developer's setting): then
// Mark records a phase's name and time and Report prints them, one line each, as
// "phase NAME UNIX-NANOSECONDS", which a benchmark reads to attribute the command's
// wall time.
package phase

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

var (
	enabled atomic.Bool
	mu      sync.Mutex
	marks   []mark
)

type mark struct {
	name string
	at   time.Time
}

// Enable turns recording on.
func Enable() { enabled.Store(true) }

// Mark records that the command reached phase name now (nothing unless enabled).
func Mark(name string) {
	if !enabled.Load() {
		return
	}
	t := time.Now()
	mu.Lock()
	marks = append(marks, mark{name, t})
	mu.Unlock()
}

// Report writes the recorded phases to w, in order, one "phase NAME NANOS" line each
// (NANOS: Unix time in nanoseconds), and the line "phase exit NANOS" for now.
func Report(w io.Writer) {
	if !enabled.Load() {
		return
	}
	Mark("exit")
	mu.Lock()
	defer mu.Unlock()
	writeMarks(w)
}

// Drain prints the phases marked since Enable or the last Drain, as Report does but
// without an "exit" phase, and forgets them: what a benchmark that traces calls
// inside its own process (a registry held as a library) reads after each call.
func Drain(w io.Writer) {
	mu.Lock()
	defer mu.Unlock()
	writeMarks(w)
	marks = marks[:0]
}

// writeMarks writes the recorded phases to w, one "phase NAME NANOS" line each; the
// caller holds mu.
func writeMarks(w io.Writer) {
	for _, m := range marks {
		fmt.Fprintf(w, "phase %s %d\n", m.name, m.at.UnixNano())
	}
}
