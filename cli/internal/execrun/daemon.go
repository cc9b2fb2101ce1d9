package execrun

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/berth-sh/berth/client"
)

// What berth's CLI and its front agree on to find the daemon of a command (both
// read these; docs/cli.md). The daemon's address variable is client.EnvHost.
const (
	// EnvNoDaemon set to anything but "" and "0" is --no-daemon (NoDaemonEnv).
	EnvNoDaemon = "BERTH_NO_DAEMON"
	// EnvClockOffset shifts berth's clock for retention (a duration; the daemon's
	// must be the command's).
	EnvClockOffset = "BERTH_CLOCK_OFFSET"
	// StatusTimeout bounds the status call that detection makes: a daemon that
	// accepts connections but does not answer is an error, never a hang.
	StatusTimeout = 10 * time.Second
	// FixNoStatus is StatusFailed's fix for the daemon of the command's own state
	// dir.
	FixNoStatus = "stop it, or use --no-daemon to run embedded"
	// goneFix is what Report adds to a *client.GoneError: what to do about a daemon
	// that went away.
	goneFix = ": run the command again (embedded when no daemon runs), or with --no-daemon"
)

// NoDaemonEnv returns "BERTH_NO_DAEMON=VALUE" when that variable asks to run
// embedded (set, and not "0"), else "".
func NoDaemonEnv() string {
	if v := os.Getenv(EnvNoDaemon); v != "" && v != "0" {
		return EnvNoDaemon + "=" + v
	}
	return ""
}

// StatusFailed is the error for a daemon at where that did not answer its status
// call with err; fix says what to do about it.
func StatusFailed(where string, err error, fix string) error {
	var ge *client.GoneError
	if errors.As(err, &ge) && ge.Where == where {
		return fmt.Errorf("berth serve at %s does not answer its status call: it %s; %s", where, ge.What(), fix)
	}
	return fmt.Errorf("berth serve at %s does not answer its status call: %v; %s", where, err, fix)
}

// message is err's text as berth prints it: a daemon that went away during a call
// (a *client.GoneError) gets what to do.
func message(err error) string {
	var ge *client.GoneError
	if errors.As(err, &ge) {
		return err.Error() + goneFix
	}
	return err.Error()
}
