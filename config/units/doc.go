// Package units parses the durations that berth's config, flags and environment
// take ("90s", "36h", "7d"): config.ParseDuration is this package's ParseDuration.
// It links only the standard library, so that the thin berth front
// (cli/front) can check a --timeout as the full CLI does without linking the
// config's HCL parser.
package units
