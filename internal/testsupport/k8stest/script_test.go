package k8stest

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestScriptChangesNoHostSetting: scripts/kubernetes.sh starts the cluster so that it
// changes nothing host-wide: no sysctl write and no firewall rule of its own, the
// kubelet kept from writing its three sysctls (bind-mounted copies in its own mount
// namespace) and from adding iptables chains, the CNI bridge without gateway, NAT or
// port mapping, and every component started by nsenter in the script's network
// namespace, never by `ip netns exec` (which remounts /sys).
func TestScriptChangesNoHostSetting(t *testing.T) {
	b, err := os.ReadFile("../../../scripts/kubernetes.sh")
	if err != nil {
		t.Fatal(err)
	}
	var code []string // the script without its comments
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			code = append(code, l)
		}
	}
	script := strings.Join(code, "\n")
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`\bsysctl\s+-w\b`),
		regexp.MustCompile(`(^|[\s;&|(])iptables\b`),
		regexp.MustCompile(`\bip\s+netns\s+exec\b`),
		regexp.MustCompile(`>\s*/proc/sys/`),
	} {
		if m := bad.FindString(script); m != "" {
			t.Errorf("the script runs %q", m)
		}
	}
	for _, want := range []string{
		`setsid nsenter --net=/run/netns/"$NETNS" --`,
		"makeIPTablesUtilChains: false",
		"failCgroupV1: false",
		"oomScoreAdj: 0",
		"restrict_oom_score_adj = true",
		`"isGateway": false`,
		`"ipMasq": false`,
		"unshare --mount --propagation unchanged",
		`mount --bind "$1/overcommit_memory" /proc/sys/vm/overcommit_memory`,
		`mount --bind "$1/panic" /proc/sys/kernel/panic`,
		`mount --bind "$1/panic_on_oops" /proc/sys/kernel/panic_on_oops`,
		"--bind-address=127.0.0.1",
		`ip netns delete "$NETNS"`,
	} {
		if !strings.Contains(script, want) {
			t.Errorf("the script lacks %q", want)
		}
	}
	if strings.Contains(script, "portmap") {
		t.Error("the CNI config has the portmap plugin (it adds iptables rules)")
	}
}
