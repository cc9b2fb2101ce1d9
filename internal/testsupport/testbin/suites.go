package testbin

import "os"

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

// FullSuites reports whether $BERTH_CONFORMANCE_FULL is 1: every suite of the matrix
// runs whole.
func FullSuites() bool { return os.Getenv(FullSuitesEnv) == "1" }

// PluginGroups are the conformance groups whose calls cross the plugin protocol in a
// different way than in process: every lifecycle call, the sandbox specs (isolation,
// resources), retention and recovery through a registry, and the DialAgent copies.
// The exec, tty and terminal groups reach the agent on its socket from the host, the
// same code in process and through a plugin, and are left to the in-process suite.
var PluginGroups = []string{"lifecycle", "idempotence", "isolation", "resources", "retention", "pool", "recovery", "exec-dial", "tty-dial", "terminal-dial"}
