// Package paths resolves where berth's config file and state dir are by default
// and by the environment ($BERTH_CONFIG, $BERTH_STATE_DIR, $XDG_CONFIG_HOME,
// $XDG_STATE_HOME, $HOME): config.ResolvePath, DefaultPath, DefaultStateDir and
// ExpandHome are this package's. It links only the standard library and package
// backend, so that the thin berth front (cli/front) finds the daemon's socket
// as the full CLI does without linking the config's HCL parser.
package paths
