// Package early starts package sigstart's catching of SIGINT, SIGTERM and SIGHUP from
// its initialiser: import it (blank) in a main package to catch them from the
// process's first milliseconds (sigstart's doc says why and how early). berth-cli,
// berth-serve and berth-agent do; the thin berth front does not.
package early

import "github.com/berth-sh/berth/internal/sigstart"

func init() { sigstart.Start() }
