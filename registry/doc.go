// Package registry is berth's policy layer: it reads the HCL config, resolves a
// session name to its scope rule, driver and sandbox, keeps the state store that
// records which session uses which sandbox, and applies retention: on_close when a
// session closes, idle_ttl and max_age on each exec (to that session only) and in
// Prune, which also reconciles every configured driver with the store.
//
// The pieces, in the order a call meets them:
//
//   - Session names (ValidateSession): 1–128 characters of A–Z a–z 0–9 . _ - : @ /,
//     no empty, "." or ".." path component, no leading "/". They are never used raw
//     as paths or sandbox names; SandboxName hashes them.
//   - Config (LoadConfig, ParseConfig, DefaultConfig): top-level attributes
//     state_dir, agent_path, plugin_dirs, log_level; driver "NAME" {} blocks, decoded
//     against the driver's declared schema by DecodeDriverConfig; and ordered
//     scope "GLOB" {} rules. Errors carry file:line:col (see ConfigError and
//     FormatDiagnostics).
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
//   - Retention (see docs/retention.md): a sandbox is idle when no exec runs in it and
//     none started or ended for longer than idle_ttl; idle_action stops or removes
//     it; max_age removes it whatever its use. A session whose sandbox retention
//     removed keeps its record, marked, so its next exec creates a new sandbox and
//     says so (Lease.Recreated). Time comes from Options.Now.
//
// Precedence of settings: Options fields (the CLI's flags) over BERTH_CONFIG,
// BERTH_STATE_DIR and BERTH_LOG over the config file over defaults.
//
// Config grammar (every key optional unless marked):
//
//	state_dir   = "/abs/path"            # or "~/..."; default $XDG_STATE_HOME/berth or ~/.local/state/berth
//	agent_path  = "/abs/path/berth"      # agent binary; default the berth binary itself
//	plugin_dirs = ["/abs/dir", ...]
//	log_level   = "trace" | "debug" | "info" | "warn" | "error" | "off"
//
//	driver "NAME" {                      # attributes from the driver's ConfigSchema
//	  key = value
//	}
//
//	scope "GLOB" {
//	  driver          = "local"          # default "local"; must be a known driver
//	  isolation       = "session"        # or "shared"; default "session"
//	  name            = "tools"          # required with isolation = "shared", a session-style name
//	  image           = "busybox:latest"
//	  env             = { K = "V" }
//	  env_passthrough = ["SSH_AUTH_SOCK"] # more host variables for execs (drivers without their
//	                                      # own filesystem), added to the driver's PATH LANG TERM TZ
//	  workdir         = "/abs/dir"
//	  user            = "1000:1000"
//	  network         = "none"
//	  allow_host_paths = false
//	  mount {                            # repeatable; blocks, not a list attribute
//	    source    = "/abs/host/path"
//	    target    = "/abs/sandbox/path"
//	    read_only = true
//	  }
//	  resources {
//	    cpus   = 1.5
//	    memory = "512m"                  # bytes as a number, or k m g t (powers of 1024)
//	    pids   = 256
//	  }
//	  retention {
//	    on_close = "keep"                # "keep" | "stop" | "remove"; default "keep"
//	    idle_ttl    = "7d"               # Go duration plus d (days); "0" or unset: never
//	    idle_action = "stop"             # "stop" | "remove"; default "stop"
//	    max_age     = "30d"              # removed when older, whatever its use
//	  }
//	}
package registry
