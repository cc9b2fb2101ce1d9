// Package conformance is berth's shared driver test suite: one set of cases that every
// backend.TerminalBackend must pass, whether it is a built-in driver (local, docker,
// containerd) or a third party's plugin.
//
// Cases are plain Go values (Case) over a small test interface (T) that *testing.T
// satisfies, so the same suite runs three ways:
//
//   - under `go test` in this repository and in a driver author's repository:
//     conformance.Run(t, driver, conformance.Options{...}), one subtest per case named
//     "group/name";
//   - from `berth conformance`, through RunAll, which has its own T implementation,
//     a per-case timeout and --run/--skip filtering (Filter), and returns a Report that
//     writes JSON (Report.JSON) and JUnit XML (Report.JUnit);
//   - listed without running (List).
//
// Each case names what it needs (Case.Needs, over backend.Capabilities); a case whose
// need the driver does not claim is skipped with a reason, never silently. Cases that
// need more than a driver (a registry for session isolation) take it from Options and
// skip with a reason when it is not given.
//
// The groups are lifecycle, idempotence, exec, tty, isolation, resources, terminal
// (shell mode, jobs, copy), retention and recovery (over a registry).
//
// The suite creates real sandboxes through the driver: each gets a unique name
// ("bconf-" and random hex), the berth labels (owner Options.Owner) and a
// "conformance.run" label unique to the run, and is removed in the case's cleanup.
// Agent files are prepared under Options.StateDir by Options.PrepareAgent.
package conformance
