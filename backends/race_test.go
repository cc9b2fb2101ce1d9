//go:build race

package backends

func init() { raceEnabled = true }
