package conformance

import (
	"encoding/hex"
	"strings"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
)

func needAgentHidden(c backend.Capabilities) (bool, string) {
	if !c.HasAgent() || !c.FSIsolation.OwnRoot() || !c.DropCapabilities {
		return false, "needs berth's agent (Capabilities.Agent) in a sandbox with its own root filesystem (FSIsolation image or private) that drops capabilities (DropCapabilities): " +
			"in a sandbox that shares the host's user and files (local) the token's file is the user's own"
	}
	return true, ""
}

// tokenSearch, run as the sandbox's root with the token on its stdin, prints one line
// per place that gives the token away: "file PATH" for a file holding it (every
// regular file under /.berth, its mounts included, and on the root filesystem, not
// on the others mounted there, which may be the host's /usr: the list is made
// before grep runs, so grep's own command line, which holds the token, is not
// searched), "environ PROC" and "cmdline PROC" for a process whose environment or
// command line holds it, "agent PID" for each of the sandbox's agents (found by
// their command line) and "mem PID" for an agent whose /proc/PID/mem opens, and
// "selfmem" when the shell could open its own (so "mem" lines can mean something).
// environ and cmdline separate their strings with NULs, which grep (busybox's) does
// not search past: tr makes them lines.
const tokenSearch = `read -r tok
set -- $({ find /.berth -type f; find / -xdev -type f; } 2>/dev/null | sort -u)
procs=$(echo /proc/[0-9]*)
for f in "$@"; do grep -qF -e "$tok" "$f" 2>/dev/null && echo "file $f"; done
for p in $procs; do
	for x in environ cmdline; do tr '\000' '\n' < "$p/$x" 2>/dev/null | grep -qF -e "$tok" && echo "$x $p"; done
	case "$(tr '\000' ' ' < "$p/cmdline" 2>/dev/null)" in
	*berth-agent\ serve\ *|*berth-agent\ agent\ serve\ *) echo "agent ${p#/proc/}"; (exec 3< "$p/mem") 2>/dev/null && echo "mem ${p#/proc/}";;
	esac
done
(exec 3< /proc/self/mem) 2>/dev/null && echo selfmem
true`

// Root in a new sandbox (the image's default user, root for berth's agent, with the
// capabilities the sandbox keeps) finds the agent's token nowhere: in no file (the
// agent's directories under /.berth and wherever else), in no process's environment
// or command line (the agent's own /proc/PID/environ included, which keeps the
// environment a process started with), and it cannot open the agent's
// /proc/PID/mem (the agent is not dumpable). The search runs as the sandbox's first
// exec, and again after a stop and a start where the driver can (Capabilities.StopStart).
// It is proved to work: given the token in its own environment it finds it there.
func caseAgentTokenHiddenFromRoot(t T, h *Harness) {
	spec := h.Spec(t, SandboxName())
	if _, err := h.Create(t, spec); err != nil {
		t.Fatalf("Create(%s): %v", spec.Name, err)
	}
	sb := spec.Name
	files, _ := h.agentFilesOf(sb)
	token, err := agent.ReadToken(files.Dir)
	if err != nil {
		t.Fatalf("reading the sandbox's token on the host: %v", err)
	}
	tok := hex.EncodeToString(token)
	req := backend.ExecRequest{Argv: []string{"sh", "-c", tokenSearch}}
	if h.Info.Capabilities.ExecUser {
		req.User = "0"
	}
	search := func(when string) {
		t.Helper()
		out, err := h.execInputReq(t, sb, tok+"\n", req)
		if err != nil || out.ExitCode != 0 {
			t.Fatalf("%s: searching for the token as the sandbox's root: %v %s", when, err, out.describe())
		}
		agents, selfmem := 0, false
		for _, l := range strings.Split(strings.TrimSpace(out.Stdout), "\n") {
			what, where, _ := strings.Cut(l, " ")
			switch what {
			case "agent":
				agents++
			case "selfmem":
				selfmem = true
			case "file":
				t.Errorf("%s: root in the sandbox can read the agent token in the file %s", when, where)
			case "environ", "cmdline":
				t.Errorf("%s: root in the sandbox can read the agent token in %s/%s", when, where, what)
			case "mem":
				t.Errorf("%s: root in the sandbox can open the memory of the agent, pid %s (/proc/%s/mem): the agent is dumpable", when, where, where)
			case "":
			default:
				t.Errorf("%s: unexpected line from the search: %q", when, l)
			}
		}
		if agents == 0 {
			t.Errorf("%s: the search found no agent process (a command line of berth-agent [agent] serve), so it proves nothing about the agent's memory: %s", when, out.describe())
		}
		if !selfmem {
			t.Logf("%s: the sandbox's shell cannot open its own /proc/self/mem either", when)
		}
	}
	search("in a new sandbox")
	// The search works: given the token in its own environment, it finds it there.
	self := req
	self.Env = []string{"BERTH_CONFORMANCE_MARK=" + tok}
	if out, err := h.execInputReq(t, sb, tok+"\n", self); err != nil || !strings.Contains(out.Stdout, "environ /proc/") {
		t.Errorf("the token search does not find the token in its own environment, so it proves nothing: %v %s", err, out.describe())
	}
	if !h.Info.Capabilities.StopStart {
		return
	}
	// Started again (Create of the stopped sandbox adopts it), the agent gets the
	// token as at the first start, and hides it as well.
	h.stop(t, sb)
	if _, err := h.Create(t, spec); err != nil {
		t.Fatalf("Create(%s) of the stopped sandbox: %v", sb, err)
	}
	search("after a stop and a start")
}
