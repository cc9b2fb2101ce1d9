package conformance

import (
	"strings"
)

func isolationCases() []Case {
	g := "isolation"
	return []Case{
		{Group: g, Name: "files-private", Run: caseFilesPrivate},
		{Group: g, Name: "sessions-isolated", Requires: "a registry (Options.OpenRegistry)", Run: caseSessionsIsolated, registry: true},
		{Group: g, Name: "sessions-shared", Requires: "a registry (Options.OpenRegistry)", Run: caseSessionsShared, registry: true},
	}
}

// A file written in one sandbox's working directory and home is in neither of
// another sandbox's.
func caseFilesPrivate(t T, h *Harness) {
	a := h.NewSandbox(t)
	b := h.NewSandbox(t)
	file := "berth-conf-private-" + randHex(4)
	write := `echo secret > "$1" && if [ -n "$HOME" ] && [ -d "$HOME" ] && [ -w "$HOME" ]; then echo secret > "$HOME/$1"; fi; pwd`
	cwdA := strings.TrimSpace(h.sh(t, a, write, file).Stdout)
	if out := h.run(t, a, "cat", file); out.ExitCode != 0 || out.Stdout != "secret\n" {
		t.Fatalf("reading the file back in the sandbox that wrote it: %s", out.describe())
	}
	cwdB := strings.TrimSpace(h.sh(t, b, "pwd").Stdout)
	if !h.imageFS() && cwdA == cwdB {
		t.Errorf("two sandboxes share the working directory %s", cwdA)
	}
	check := `for f in "./$1" "$HOME/$1"; do if [ -e "$f" ]; then echo "$f"; fi; done; true`
	if out := h.sh(t, b, check, file); out.Stdout != "" {
		t.Errorf("a file written in sandbox %s is visible in sandbox %s: %s", a, b, strings.TrimSpace(out.Stdout))
	}
}

// imageFS reports whether the driver's sandboxes have their own root filesystem
// (FSIsolation image or private).
func (h *Harness) imageFS() bool {
	return h.Info.Capabilities.FSIsolation.OwnRoot()
}
