package testbin

import (
	"os"
	"slices"

	"github.com/berth-sh/berth/conformance"
)

// FullSuitesEnv names the environment variable that, set to 1, makes SuiteGroups
// return nil, so that every conformance suite of this repository's tests runs all
// of its groups (the whole matrix: each driver in process and through its plugin,
// on each daemon), as before CI's time budget split them. Unset, each path runs once.
const FullSuitesEnv = "BERTH_CONFORMANCE_FULL"

// SuiteGroups returns groups for conformance.Options.Groups, or nil (every group)
// when $BERTH_CONFORMANCE_FULL is 1. A driver package's tests run the shared suite
// several ways (in process, through the plugin, per daemon, under gVisor); most
// groups exercise the same code whichever way the driver is reached, so the second
// and later ways run only the groups whose calls differ, and CI's test command stays
// within its time. docs/conformance.md#this-repositorys-matrix lists what runs where.
func SuiteGroups(groups ...string) []string {
	if FullSuites() {
		return nil
	}
	return groups
}

// SuiteGroupsExcept returns every group of the conformance suite but those named, in
// the suite's order, or nil (every group) when $BERTH_CONFORMANCE_FULL is 1.
func SuiteGroupsExcept(excluded ...string) []string {
	if FullSuites() {
		return nil
	}
	var out []string
	for _, c := range conformance.Cases() {
		if !slices.Contains(excluded, c.Group) && !slices.Contains(out, c.Group) {
			out = append(out, c.Group)
		}
	}
	return out
}

// FullSuites reports whether $BERTH_CONFORMANCE_FULL is 1: every suite of the matrix
// runs whole.
func FullSuites() bool { return os.Getenv(FullSuitesEnv) == "1" }

// PluginGroups are the conformance groups whose calls cross the plugin protocol in a
// different way than in process: every lifecycle call, the sandbox specs (isolation,
// resources), and the DialAgent copies. The exec, tty and terminal groups reach the
// agent on its socket from the host, the same code in process and through a plugin,
// and are left to the in-process suite; so are RegistryGroups.
var PluginGroups = []string{"lifecycle", "idempotence", "isolation", "resources", "exec-dial", "tty-dial", "terminal-dial"}

// RegistryGroups are the groups that run berth's registry (retention, pools, recovery
// from abandoned creates) over the driver's lifecycle calls: the policy is the same
// code whichever way the driver is reached and whatever OCI runtime runs the
// sandbox, and the calls it makes are the lifecycle group's. They run once per
// driver, in process, where the race detector sees the driver under the registry's
// concurrent calls.
var RegistryGroups = []string{"retention", "pool", "recovery"}

// RuntimeGroups are the groups whose outcome depends on the OCI runtime that runs
// the sandbox (runc or runsc): the sandbox's lifecycle, execs, terminals, isolation
// and resources. A second runtime runs these; RegistryGroups and idempotence test
// berth's and the driver's bookkeeping, not the runtime.
var RuntimeGroups = []string{"lifecycle", "exec", "tty", "terminal", "isolation", "resources", "exec-dial", "tty-dial", "terminal-dial"}
