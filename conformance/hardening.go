package conformance

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// Cases for drivers that isolate: own filesystem, PID namespace, network none,
// dropped capabilities, resource limits. Each is gated on the capability it tests.

func needImageFS(c backend.Capabilities) (bool, string) {
	if !c.FSIsolation.OwnRoot() {
		return false, "driver does not claim Capabilities.FSIsolation image or private (sandboxes see the host's filesystem)"
	}
	return true, ""
}

func needPIDIsolation(c backend.Capabilities) (bool, string) {
	if !c.PIDIsolation {
		return false, "driver does not claim Capabilities.PIDIsolation"
	}
	return true, ""
}

func needNetworkNone(c backend.Capabilities) (bool, string) {
	if !slices.Contains(c.NetworkModes, "none") {
		return false, "driver does not list network mode \"none\" in Capabilities.NetworkModes"
	}
	return true, ""
}

func needDropCaps(c backend.Capabilities) (bool, string) {
	if !c.DropCapabilities {
		return false, "driver does not claim Capabilities.DropCapabilities"
	}
	return true, ""
}

func needMemoryLimit(c backend.Capabilities) (bool, string) {
	if !c.MemoryLimit {
		return false, "driver does not claim Capabilities.MemoryLimit"
	}
	return true, ""
}

func needPidsLimit(c backend.Capabilities) (bool, string) {
	if !c.PidsLimit {
		return false, "driver does not claim Capabilities.PidsLimit"
	}
	return true, ""
}

func needMountsUser(c backend.Capabilities) (bool, string) {
	if c.FSIsolation != backend.FSIsolationImage || !c.ExecUser {
		return false, "needs Capabilities.FSIsolation image (bind mounts) and Capabilities.ExecUser"
	}
	return true, ""
}

func hardeningIsolationCases() []Case {
	g := "isolation"
	return []Case{
		{Group: g, Name: "files-not-shared-nor-on-host", Requires: "Capabilities.FSIsolation image or private", Needs: needImageFS, Run: caseFilesNotOnHost},
		{Group: g, Name: "processes-invisible", Requires: "Capabilities.PIDIsolation", Needs: needPIDIsolation, Run: caseProcessesInvisible},
		{Group: g, Name: "network-none-only-lo", Requires: "network mode none", Needs: needNetworkNone, Run: caseNetworkNone},
		{Group: g, Name: "capabilities-dropped", Requires: "Capabilities.DropCapabilities", Needs: needDropCaps, Run: caseCapabilitiesDropped},
		{Group: g, Name: "signals-to-pid1-ignored", Requires: "Capabilities.PIDIsolation", Needs: needPIDIsolation, Run: caseSignalsToPID1},
		{Group: g, Name: "bind-mount-owner", Requires: "Capabilities.FSIsolation image and ExecUser", Needs: needMountsUser, Run: caseBindMountOwner},
		{Group: g, Name: "agent-out-of-users-reach", Requires: "Capabilities.Agent, ExecUser and FSIsolation image or private", Needs: needAgentUser, Run: caseAgentOutOfUsersReach},
		{Group: g, Name: "agent-token-hidden-from-root", Requires: "Capabilities.Agent, FSIsolation image or private and DropCapabilities", Needs: needAgentHidden, Run: caseAgentTokenHiddenFromRoot},
	}
}

func needAgentUser(c backend.Capabilities) (bool, string) {
	if !c.HasAgent() || !c.ExecUser || !c.FSIsolation.OwnRoot() {
		return false, "needs berth's agent (Capabilities.Agent) at " + agentInSandbox + " in a sandbox with its own root filesystem, and users (Capabilities.ExecUser)"
	}
	return true, ""
}

// execInput runs argv in sb with input on its stdin, then EOF, and waits for it.
func (h *Harness) execInput(t T, sb, input string, argv ...string) (execOut, error) {
	t.Helper()
	return h.execInputReq(t, sb, input, backend.ExecRequest{Argv: argv})
}

// execInputReq is execInput of req (Stdin is set, Stdout and Stderr captured).
func (h *Harness) execInputReq(t T, sb, input string, req backend.ExecRequest) (execOut, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	var stdout, stderr testwait.Buffer
	req.Stdin, req.Stdout, req.Stderr = true, &stdout, &stderr
	p, err := h.Exec(ctx, sb, req)
	if err != nil {
		return execOut{}, err
	}
	if input != "" {
		if _, err := p.Write([]byte(input)); err != nil {
			p.Wait()
			return execOut{}, err
		}
	}
	if err := p.CloseStdin(); err != nil {
		p.Wait()
		return execOut{}, err
	}
	res, err := p.Wait()
	return execOut{ExecResult: res, Stdout: stdout.String(), Stderr: stderr.String()}, err
}

// agentInSandbox is the agent binary's path in a sandbox with its own root.
const agentInSandbox = backend.AgentMountDir + "/" + backend.AgentBinaryName

// probeLines returns the lines of `berth agent probe` output, failing the case when
// it found no agent or any line says the agent ran the command.
func probeLines(t T, what string, out execOut) {
	t.Helper()
	if out.ExitCode != 0 {
		t.Fatalf("%s: berth agent probe: %s", what, out.describe())
	}
	lines := strings.Split(strings.TrimSpace(out.Stdout), "\n")
	if len(lines) == 0 || lines[0] == "" {
		t.Fatalf("%s: berth agent probe tried no address: %s", what, out.describe())
	}
	for _, l := range lines {
		t.Logf("%s: %s", what, l)
		if _, res, _ := strings.Cut(l, ": "); !strings.HasPrefix(res, "refused:") && !strings.HasPrefix(res, "unreachable:") {
			t.Errorf("%s: the sandbox's user got the agent to run a command as root: %s", what, l)
		}
	}
}

// In a sandbox whose user is 1234:1234, a process of that user finds the sandbox's
// agent token in nothing it can read (the files under /.berth, every process's
// environment and command line), and cannot use the agent to run a command as root:
// connecting to every address the agent listens on (its socket, its TCP port) is
// refused or fails, with no token and even with the right one (as if it had leaked).
func caseAgentOutOfUsersReach(t T, h *Harness) {
	sb := h.NewSandboxWith(t, func(s *backend.SandboxSpec) { s.User = "1234:1234" })
	files, _ := h.agentFilesOf(sb)
	token, err := agent.ReadToken(files.Dir)
	if err != nil {
		t.Fatalf("reading the sandbox's token on the host: %v", err)
	}
	tok := hex.EncodeToString(token)
	if out := h.run(t, sb, "id", "-u"); strings.TrimSpace(out.Stdout) != "1234" {
		t.Fatalf("id -u in a sandbox of user 1234:1234: %s", out.describe())
	}
	// The list of files is made before grep runs, so grep's own command line
	// (which holds the token) is not among them; the token comes on stdin.
	// environ and cmdline separate their strings with NULs, which grep (busybox's)
	// does not search past: tr makes them lines.
	search := `read -r tok; set -- $(find /.berth -type f 2>/dev/null) /proc/[0-9]*/environ /proc/[0-9]*/cmdline; ` +
		`for f in "$@"; do tr '\000' '\n' < "$f" 2>/dev/null | grep -qF -e "$tok" && echo "$f"; done; ` +
		`env | grep -qF -e "$tok" && echo "the exec's environment"; true`
	out, err := h.execInput(t, sb, tok+"\n", "sh", "-c", search)
	if err != nil || out.ExitCode != 0 {
		t.Fatalf("searching for the token as the sandbox's user: %v %s", err, out.describe())
	}
	for _, f := range strings.Split(strings.TrimSpace(out.Stdout), "\n") {
		if f != "" {
			t.Errorf("the sandbox's user can read the agent token in %s", f)
		}
	}
	// The search itself works: given the token in its own environment, it finds
	// it there (the exec's environment, its /proc/PID/environ).
	self := backend.ExecRequest{Argv: []string{"sh", "-c", search}, Env: []string{"BERTH_CONFORMANCE_MARK=" + tok}}
	if out, err := h.execInputReq(t, sb, tok+"\n", self); err != nil || !strings.Contains(out.Stdout, "/environ") || !strings.Contains(out.Stdout, "the exec's environment") {
		t.Errorf("the token search does not find the token in its own environment, so it proves nothing: %v %s", err, out.describe())
	}
	for _, c := range []struct{ what, input string }{
		{"without the token", ""},
		{"with the sandbox's token", tok + "\n"},
	} {
		argv := []string{agentInSandbox, "probe", "--user", "0", "--", "id", "-u"}
		if c.input != "" {
			argv = []string{agentInSandbox, "probe", "--token-stdin", "--user", "0", "--", "id", "-u"}
		}
		out, err := h.execInput(t, sb, c.input, argv...)
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		probeLines(t, c.what, out)
	}
}

func resourcesCases() []Case {
	g := "resources"
	return []Case{
		{Group: g, Name: "oom-137", Requires: "Capabilities.MemoryLimit", Needs: needMemoryLimit, Run: caseOOM},
		{Group: g, Name: "fork-bomb-contained", Requires: "Capabilities.PidsLimit", Needs: needPidsLimit, Serial: true, Run: caseForkBomb},
		{Group: g, Name: "unlimited-memory-accepted", Run: caseUnlimitedMemory},
	}
}

// A spec asking for no memory limit (backend.UnlimitedMemory, the rule's memory =
// "unlimited") is accepted by every driver, with or without limits of its own.
func caseUnlimitedMemory(t T, h *Harness) {
	sb := h.NewSandboxWith(t, func(s *backend.SandboxSpec) { s.Resources.MemoryBytes = backend.UnlimitedMemory })
	if out := h.run(t, sb, "true"); out.ExitCode != 0 {
		t.Errorf("exec in a sandbox without a memory limit: %s", out.describe())
	}
}

// A file written at an absolute path in sandbox A is neither in sandbox B nor at that
// path on the host.
func caseFilesNotOnHost(t T, h *Harness) {
	a := h.NewSandbox(t)
	b := h.NewSandbox(t)
	path := "/tmp/berth-conf-private-" + randHex(6)
	h.sh(t, a, `echo secret > "$1" && cat "$1"`, path)
	if out := h.sh(t, b, `if [ -e "$1" ]; then echo present; fi; true`, path); out.Stdout != "" {
		t.Errorf("a file written at %s in sandbox %s is visible in sandbox %s", path, a, b)
	}
	if _, err := os.Lstat(path); err == nil {
		os.Remove(path)
		t.Errorf("a file written at %s in sandbox %s appeared at that path on the host", path, a)
	}
}

// A process of sandbox A is invisible in sandbox B.
func caseProcessesInvisible(t T, h *Harness) {
	a := h.NewSandbox(t)
	b := h.NewSandbox(t)
	mark := h.startBackground(t, a)
	if ps := h.marked(t, b, mark); len(ps) > 0 {
		t.Errorf("a background process of sandbox %s is visible in sandbox %s: %v", a, b, ps)
	}
	// And B sees few processes at all: its agent and the scan itself.
	if ps := liveOnly(parseStat(h.sh(t, b, statScript).Stdout)); len(ps) > 8 {
		t.Errorf("sandbox %s sees %d processes, want only its own few: %v", b, len(ps), ps)
	}
}

// With network "none" the sandbox has only the loopback interface.
func caseNetworkNone(t T, h *Harness) {
	sb := h.NewSandboxWith(t, func(s *backend.SandboxSpec) { s.Network = "none" })
	out := h.sh(t, sb, "cat /proc/net/dev")
	var ifaces []string
	for _, line := range strings.Split(out.Stdout, "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok {
			ifaces = append(ifaces, strings.TrimSpace(name))
		}
	}
	if len(ifaces) != 1 || ifaces[0] != "lo" {
		t.Errorf("interfaces with network none: %v, want only lo (/proc/net/dev: %q)", ifaces, out.Stdout)
	}
}

// capNumbers are the Linux capability numbers by name (without CAP_).
var capNumbers = map[string]int{
	"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4, "KILL": 5,
	"SETGID": 6, "SETUID": 7, "SETPCAP": 8, "LINUX_IMMUTABLE": 9, "NET_BIND_SERVICE": 10,
	"NET_BROADCAST": 11, "NET_ADMIN": 12, "NET_RAW": 13, "IPC_LOCK": 14, "IPC_OWNER": 15,
	"SYS_MODULE": 16, "SYS_RAWIO": 17, "SYS_CHROOT": 18, "SYS_PTRACE": 19, "SYS_PACCT": 20,
	"SYS_ADMIN": 21, "SYS_BOOT": 22, "SYS_NICE": 23, "SYS_RESOURCE": 24, "SYS_TIME": 25,
	"SYS_TTY_CONFIG": 26, "MKNOD": 27, "LEASE": 28, "AUDIT_WRITE": 29, "AUDIT_CONTROL": 30,
	"SETFCAP": 31, "MAC_OVERRIDE": 32, "MAC_ADMIN": 33, "SYSLOG": 34, "WAKE_ALARM": 35,
	"BLOCK_SUSPEND": 36, "AUDIT_READ": 37, "PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40,
}

// neverCaps are capabilities no hardened sandbox keeps: they reach the host (modules,
// raw devices, mounts, tracing, the network stack) or hand out privileges (file caps).
var neverCaps = []string{"SYS_ADMIN", "SYS_MODULE", "SYS_RAWIO", "SYS_PTRACE", "SYS_BOOT", "SYS_TIME",
	"NET_ADMIN", "NET_RAW", "MKNOD", "SETFCAP", "SETPCAP", "DAC_READ_SEARCH", "LINUX_IMMUTABLE",
	"MAC_ADMIN", "MAC_OVERRIDE", "BPF", "PERFMON", "SYSLOG", "AUDIT_CONTROL", "SYS_CHROOT"}

func capNames(mask uint64) []string {
	var out []string
	for name, n := range capNumbers {
		if mask&(1<<n) != 0 {
			out = append(out, name)
		}
	}
	for n := 41; n < 64; n++ {
		if mask&(1<<n) != 0 {
			out = append(out, fmt.Sprintf("cap%d", n))
		}
	}
	sort.Strings(out)
	return out
}

// As root in the sandbox, /proc/self/status shows NoNewPrivs 1 and a bounding set
// without any capability that reaches the host; with Options.Capabilities set, exactly
// that set.
func caseCapabilitiesDropped(t T, h *Harness) {
	sb := h.NewSandbox(t)
	out, err := h.exec(t, sb, backend.ExecRequest{Argv: []string{"grep", "-E", "^(CapEff|CapBnd|CapPrm|NoNewPrivs):", "/proc/self/status"}, User: "0"})
	if err != nil || out.ExitCode != 0 {
		t.Fatalf("reading /proc/self/status as root: %v %s", err, out.describe())
	}
	fields := map[string]string{}
	for _, line := range strings.Split(out.Stdout, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	if fields["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs: %q, want 1 (status: %q)", fields["NoNewPrivs"], out.Stdout)
	}
	bnd, err1 := strconv.ParseUint(fields["CapBnd"], 16, 64)
	eff, err2 := strconv.ParseUint(fields["CapEff"], 16, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("parsing CapBnd/CapEff from %q", out.Stdout)
	}
	t.Logf("bounding set: %v", capNames(bnd))
	for _, c := range neverCaps {
		if bnd&(1<<capNumbers[c]) != 0 {
			t.Errorf("the bounding set holds CAP_%s (set: %v)", c, capNames(bnd))
		}
	}
	if eff&^bnd != 0 {
		t.Errorf("effective capabilities %v are not within the bounding set %v", capNames(eff), capNames(bnd))
	}
	if want := h.Options.Capabilities; want != nil {
		var mask uint64
		for _, c := range want {
			n, ok := capNumbers[strings.TrimPrefix(strings.ToUpper(c), "CAP_")]
			if !ok {
				t.Fatalf("Options.Capabilities: unknown capability %q", c)
			}
			mask |= 1 << n
		}
		if bnd != mask {
			t.Errorf("bounding set %v, want exactly the documented %v", capNames(bnd), capNames(mask))
		}
	}
}

// `kill -TERM 1`, `kill -HUP 1` and `kill -INT 1` from inside leave the sandbox
// running, background processes included.
func caseSignalsToPID1(t T, h *Harness) {
	sb := h.NewSandbox(t)
	mark := h.startBackground(t, sb)
	for _, sig := range []string{"TERM", "HUP", "INT"} {
		out := h.run(t, sb, "kill", "-"+sig, "1")
		t.Logf("kill -%s 1: %s", sig, out.describe())
	}
	// A PID 1 that died of a signal would have done so by now; no event says it
	// survived, so this pause can only turn such a death into a pass, never a
	// working PID 1 into a failure.
	time.Sleep(500 * time.Millisecond)
	if got := h.inspect(t, sb); got.State != backend.StateRunning {
		t.Fatalf("after kill -TERM/-HUP/-INT 1 the sandbox is %q, want running", got.State)
	}
	if out := h.run(t, sb, "sh", "-c", "echo alive"); out.ExitCode != 0 || out.Stdout != "alive\n" {
		t.Fatalf("exec after kill -TERM 1: %s", out.describe())
	}
	if len(h.markedAlive(t, sb, mark)) == 0 {
		t.Errorf("a background process died after kill -TERM/-HUP/-INT 1")
	}
}

// A file created in a bind-mounted host directory belongs to the sandbox's user on the
// host: "1234:1234" gives 1234:1234, "host" the invoking user's ids (SUDO_UID and
// SUDO_GID under sudo).
func caseBindMountOwner(t T, h *Harness) {
	dir, err := os.MkdirTemp("", "bconf-mount-")
	if err != nil {
		t.Fatalf("MkdirTemp: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatalf("Chmod: %v", err)
	}
	hostUID, hostGID := os.Getuid(), os.Getgid()
	if s := os.Getenv("SUDO_UID"); s != "" {
		if n, err := strconv.Atoi(s); err == nil {
			hostUID, hostGID = n, n
		}
		if n, err := strconv.Atoi(os.Getenv("SUDO_GID")); err == nil {
			hostGID = n
		}
	}
	for _, c := range []struct {
		user     string
		uid, gid int
	}{{"1234:1234", 1234, 1234}, {"host", hostUID, hostGID}} {
		spec := h.Spec(t, SandboxName())
		spec.User = c.user
		spec.Mounts = []backend.Mount{{Source: dir, Target: "/mnt/berth-conf"}}
		created, err := h.Create(t, spec)
		if errors.Is(err, backend.ErrUnsupported) && c.user == "1234:1234" {
			// The contract's answer for a spec a driver cannot run: a driver whose
			// sandboxes live elsewhere (a cluster node) has no host directory to mount.
			t.Skipf("the driver does not support host mounts: %v", err)
		}
		if err != nil {
			t.Fatalf("Create(%s) with a host mount and user %q: %v", spec.Name, c.user, err)
		}
		if created.State != backend.StateRunning {
			t.Fatalf("Create(%s) returned state %q, want %q", spec.Name, created.State, backend.StateRunning)
		}
		sb := spec.Name
		file := "made-by-" + strings.ReplaceAll(c.user, ":", "-")
		h.sh(t, sb, `touch "/mnt/berth-conf/$1"`, file)
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, file), &st); err != nil {
			t.Errorf("user %q: the file made in the mount is not in the host directory: %v", c.user, err)
			continue
		}
		if int(st.Uid) != c.uid || int(st.Gid) != c.gid {
			t.Errorf("user %q: the file made in the mount belongs to %d:%d on the host, want %d:%d", c.user, st.Uid, st.Gid, c.uid, c.gid)
		}
	}
}

// With a 64 MiB memory limit, allocating 256 MiB ends with 137 and OOMKilled.
func caseOOM(t T, h *Harness) {
	sb := h.NewSandboxWith(t, func(s *backend.SandboxSpec) { s.Resources.MemoryBytes = 64 << 20 })
	out := h.run(t, sb, "dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1")
	if out.ExitCode != 137 || out.Signal != 9 || !out.OOMKilled {
		t.Errorf("allocating 256 MiB under a 64 MiB limit: %s oom_killed %v, want exit 137 signal 9 oom_killed true", out.describe(), out.OOMKilled)
	}
	if o := h.run(t, sb, "true"); o.ExitCode != 0 || o.OOMKilled {
		t.Errorf("the next exec: %s oom_killed %v, want exit 0 and no OOM", o.describe(), o.OOMKilled)
	}
}

// forkBombPids is the pids limit of the fork bomb case.
const forkBombPids = 128

// A fork bomb with a 2 s timeout under a pids limit ends at its timeout, while a
// second exec (retried while the sandbox cannot fork) and a copy (when the driver has
// Copy) made at the same time end correctly; the agent stays up and answers the next
// exec.
func caseForkBomb(t T, h *Harness) {
	sb := h.NewSandboxWith(t, func(s *backend.SandboxSpec) { s.Resources.Pids = forkBombPids })
	var wg sync.WaitGroup
	var bomb execOut
	var bombErr error
	wg.Go(func() {
		// The leader forks once, for the subshell that starts the bomb, then execs
		// (no fork): a leader that had to fork once the limit is reached (as for the
		// second element of a pipeline) exits at once with "can't fork" instead of
		// living until the timeout.
		bomb, bombErr = h.exec(t, sb, backend.ExecRequest{Argv: []string{"sh", "-c", "f() { f | f & }; (f) & exec sleep 30"}, Timeout: 2 * time.Second})
	})
	// Let it fill the pids limit: the pause only makes the second exec meet a full
	// sandbox more likely; on a slow machine it may not, and the case is weaker,
	// never wrong.
	time.Sleep(300 * time.Millisecond)
	var second execOut
	var secondErr error
	var tries int
	var refused error // the first refusal of the second exec, logged for diagnosis
	wg.Go(func() {
		deadline := time.Now().Add(testwait.Limit)
		for {
			tries++
			second, secondErr = h.exec(t, sb, backend.ExecRequest{Argv: []string{"echo", "second"}})
			if secondErr == nil && second.ExitCode == 0 || time.Now().After(deadline) {
				return
			}
			if secondErr != nil && !errors.Is(secondErr, backend.ErrUnavailable) {
				return // a wrong kind of error: reported below
			}
			if refused == nil {
				refused = secondErr
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	var copyErr error
	var copied bytes.Buffer
	hasCopy := h.Info.Capabilities.Copy
	if hasCopy {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
			defer cancel()
			copyErr = h.copyOut(ctx, sb, "/etc/passwd", &copied)
		})
	}
	wg.Wait()
	if bombErr != nil {
		t.Errorf("the fork bomb's exec: %v", bombErr)
	} else if !bomb.TimedOut {
		// Not TimedOut: it ended otherwise (its leader's sleep 30, or a failure).
		t.Errorf("the fork bomb: %s, want TimedOut", bomb.describe())
	}
	if secondErr != nil || second.ExitCode != 0 || second.Stdout != "second\n" {
		t.Errorf("the second exec (after %d tries): err %v, %s", tries, secondErr, second.describe())
	}
	if hasCopy && (copyErr != nil || copied.Len() == 0) {
		t.Errorf("CopyOut of /etc/passwd during the fork bomb: %v (%d bytes)", copyErr, copied.Len())
	}
	if got := h.inspect(t, sb); got.State != backend.StateRunning {
		t.Fatalf("after the fork bomb the sandbox is %q", got.State)
	}
	if out := h.run(t, sb, "sh", "-c", "echo recovered"); out.ExitCode != 0 || out.Stdout != "recovered\n" {
		t.Errorf("exec after the fork bomb: %s", out.describe())
	}
	t.Logf("fork bomb: %s; second exec after %d tries", bomb.describe(), tries)
	if refused != nil {
		t.Logf("the second exec's first refusal: %v", refused)
	}
}
