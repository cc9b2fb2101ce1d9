// Package config is berth's config language: it parses and checks the HCL config
// file (Load, Parse) or gives the built-in one (Default), matches session names to
// scope rules (Config.Match), builds a rule's sandbox spec and its hash (Rule.Spec,
// SpecHash), decodes driver "NAME" {} blocks against a driver's schema
// (Config.DriverConfig, DecodeDriverConfig), and holds the rules of names (session
// names, globs, sandbox names) and units (durations with d for days, sizes in k m g t)
// that the config and the CLI share. Errors carry file:line:col (Error,
// FormatDiagnostics) and wrap backend.ErrInvalid.
//
// It reads a file only in Load and the environment only where a name says so:
// ResolvePath, DefaultPath and DefaultStateDir ($BERTH_CONFIG, $XDG_CONFIG_HOME,
// $XDG_STATE_HOME, $HOME), ExpandHome and a "~/" in state_dir or agent_path ($HOME),
// and the plugin finder of DiscoverPlugins ($BERTH_PLUGIN_PATH, through package backends). berth's CLI calls
// those to apply its precedence (flags > BERTH_* environment > config file >
// defaults); package registry calls none of them, so a Go program that builds or
// parses a Config and passes it to registry.Open decides every setting itself.
//
// Config grammar (every key optional unless marked):
//
//	state_dir   = "/abs/path"            # or "~/..."; default $XDG_STATE_HOME/berth or ~/.local/state/berth
//	agent_path  = "/abs/path/berth-cli"  # agent binary; default berth-cli, berth's full binary (not the front, berth)
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
package config
