package testimage

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestRuntimesScriptChangesNoHostSetting: scripts/runtimes.sh starts its daemons so
// that they change nothing host-wide that the tests do not need: dockerd without a
// bridge, firewall or NAT rules, without turning on IP forwarding for the whole host
// (its --ip-forward default), with its trust key in the script's directory rather than
// /etc/docker; both containerds without the CRI plugin (a TCP listener on 127.0.0.1 in
// 1.6, CNI lookups).
func TestRuntimesScriptChangesNoHostSetting(t *testing.T) {
	b, err := os.ReadFile("../../../scripts/runtimes.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	// The dockerd command: from "setsid dockerd" to the end of its continued lines.
	m := regexp.MustCompile(`(?s)setsid dockerd (.*?)</dev/null`).FindStringSubmatch(script)
	if m == nil {
		t.Fatal("no `setsid dockerd ... </dev/null` command in the script")
	}
	for _, flag := range []string{"--bridge=none", "--iptables=false", "--ip-masq=false", "--ip-forward=false", "--config-file", "--data-root", "--exec-root"} {
		if !strings.Contains(m[1], flag) {
			t.Errorf("dockerd is started without %s", flag)
		}
	}
	if !strings.Contains(script, `"deprecated-key-path": "%s"%s}\n' "$DIR/docker/key.json"`) {
		t.Error("dockerd's daemon.json does not keep its trust key in $DIR (dockerd 20.10 writes /etc/docker/key.json)")
	}
	for _, toml := range []string{`containerd.toml"`, `containerd2.toml"`} {
		i := strings.Index(script, toml)
		if i < 0 {
			t.Fatalf("no %s in the script", toml)
		}
		around := script[max(0, i-400):min(len(script), i+400)]
		if !strings.Contains(around, `disabled_plugins = ["io.containerd.grpc.v1.cri"`) {
			t.Errorf("the config written to %s does not disable the CRI plugin", toml)
		}
	}
}

// TestRuntimesScriptRunscFlags: the runsc that scripts/runtimes.sh registers (the
// containerd wrapper and dockerd's runtimeArgs) lets the host reach sockets made in
// the sandbox (--host-uds=create) and never lets the sandbox reach the host's
// (--host-uds=open or all), keeps a stopped sandbox's files (--overlay2=none) and
// needs no KVM (--platform=systrap); runsc is built at a pinned version, not a
// branch the module proxy refuses.
func TestRuntimesScriptRunscFlags(t *testing.T) {
	b, err := os.ReadFile("../../../scripts/runtimes.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	wrapper := regexp.MustCompile(`exec "%s" ([^"\n]*)"\$@"`).FindStringSubmatch(script)
	args := regexp.MustCompile(`"runtimeArgs": \[([^\]]*)\]`).FindStringSubmatch(script)
	if wrapper == nil || args == nil {
		t.Fatalf("no runsc-berth wrapper (exec \"%%s\" FLAGS \"$@\") or dockerd runtimeArgs in the script")
	}
	for _, flags := range []string{wrapper[1], args[1]} {
		for _, want := range []string{"--host-uds=create", "--overlay2=none", "--platform=systrap"} {
			if !strings.Contains(flags, want) {
				t.Errorf("runsc flags %q lack %s", flags, want)
			}
		}
		if strings.Contains(flags, "=open") || strings.Contains(flags, "=all") {
			t.Errorf("runsc flags %q let the sandbox reach host sockets", flags)
		}
	}
	if !regexp.MustCompile(`RUNSC_VERSION=\$\{BERTH_RUNSC_VERSION:-v0\.0\.0-\d{14}-[0-9a-f]{12}\}`).MatchString(script) {
		t.Error("runsc is not pinned to a pseudo-version")
	}
}
