// Package registry is berth's policy layer: given a parsed config (package
// config), it resolves a session name to its scope rule, driver and
// sandbox, keeps the state store that
// records which session uses which sandbox, and applies retention: on_close when a
// session closes, idle_ttl and max_age on each exec (to that session only) and in
// Prune, which also reconciles every configured driver with the store.
//
// The pieces, in the order a call meets them:
//
//   - Session names (config.NormalizeSession): 1–128 characters of A–Z a–z 0–9 . _ - : @ /
//     and printable non-ASCII characters (no space, control or format character), no
//     empty, "." or ".." path component, no leading "/". Every call normalises the
//     name to Unicode NFC first, so an NFD and an NFC spelling are one session. They
//     are never used raw as paths or sandbox names; config.SandboxName hashes them.
//   - Config (package config: Load, Parse, Default): top-level attributes
//     state_dir, agent_path, plugin_dirs, log_level; driver "NAME" {} blocks, decoded
//     against the driver's declared schema by config.DecodeDriverConfig; and ordered
//     scope "GLOB" {} rules. Errors carry file:line:col (see config.Error and
//     config.FormatDiagnostics). The grammar is in that package's doc.
//   - Rules (Config.Match): tried in order; the first whose glob matches the whole
//     session name decides. In a glob, * matches any run of characters (/ and :
//     included) and ? matches one character; everything else is literal.
//   - The state dir: state.db (a bbolt file opened per transaction, so concurrent
//     berth processes share it; it holds the schema version, the owner id and one
//     record per session), locks/ (SANDBOX.lock, per sandbox name, an flock held
//     around create, close, remove and prune's actions; SANDBOX.DRIVER.busy, a
//     shared flock every exec holds while it runs, so any process can tell a
//     sandbox is in use), drivers/NAME/ (each driver's private state) and
//     sandboxes/DRIVER/SANDBOX/ (the agent files of each sandbox; a sandbox is a
//     driver and a name, as two drivers may have a sandbox of one name after a
//     session's rule changed driver). Sandboxes made by earlier versions keep their
//     sandboxes/SANDBOX/ until they are removed (see hostdirs.go).
//   - Registry (Open): Acquire, Exec, Sessions, CloseSession, RemoveSession, Prune,
//     Drivers, Explain.
//   - The mount policy (CheckMounts, see docs/security.md): before any driver's
//     Create, a rule's mount that is, contains or lies inside the state dir, another
//     berth state dir or a plugin socket dir is refused unless the rule sets
//     allow_host_paths. The other dirs are host facts that internal/hostpaths looks
//     up (environment, /etc/passwd) at each check, not settings; Open reads none.
//   - Retention (see docs/retention.md): a sandbox is idle when no exec runs in it and
//     none started or ended for longer than idle_ttl; idle_action stops or removes
//     it; max_age removes it whatever its use. A session whose sandbox retention
//     removed keeps its record, marked, so its next exec creates a new sandbox and
//     says so (Lease.Recreated). Time comes from WithClock.
//
// Settings: Open takes a parsed config (nil for config.Default) and functional
// options (WithStateDir, WithLogger, WithDriver, ...) and reads no environment
// variable and no config file. berth's CLI applies the precedence flags >
// BERTH_* environment > config file > defaults before it calls config.Load and Open
// (cli/settings.go).
package registry
