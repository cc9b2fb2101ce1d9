package cli

// This file is the CLI's side of berth serve: finding the daemon a command should use
// (g.daemon), and daemonClient, the HTTP client that makes the calls of berth's
// commands through it (its methods mirror the registry's, so that each command has
// one code path, over an api: embedded or daemon).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/client"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/phase"
	"github.com/berth-sh/berth/server/apiv1"
)

// The environment that points berth's CLI at a daemon, or away from one.
const (
	// envHost names the daemon to use (client.EnvHost).
	envHost = client.EnvHost
	// envTokenFile is the file holding the bearer token of a TCP daemon.
	envTokenFile = "BERTH_TOKEN_FILE"
	// envTLSCA is a PEM file of the CA certificates that an https daemon's
	// certificate is checked against (default: the system's roots).
	envTLSCA = "BERTH_TLS_CA"
	// envNoDaemon=1 is --no-daemon (execrun.NoDaemonEnv).
	envNoDaemon = execrun.EnvNoDaemon
)

// daemonClient is the CLI's one client of a running berth serve (a client.Client,
// with what the daemon said of itself): the api methods (daemon_api.go), the files
// routes (daemoncopy.go) and the TTY WebSocket (daemonshell.go) all go through it.
type daemonClient struct {
	*client.Client
	// Status is the daemon's answer to the status call that dialDaemon made.
	Status apiv1.Status
}

// unixClient is the client over the unix socket at the absolute path path.
func unixClient(path string) (*daemonClient, error) {
	c, err := client.New(path)
	if err != nil {
		return nil, err
	}
	return &daemonClient{Client: c}, nil
}

// noDaemon reports why this command runs embedded whatever runs: --no-daemon,
// BERTH_NO_DAEMON, or a flag that changes how drivers are run in this process
// (--in-process, conformance's --plugin); "" when none does.
func (g *globals) noDaemon() string {
	env := execrun.NoDaemonEnv()
	switch {
	case g.noDaemonFlag:
		return "--no-daemon"
	case env != "":
		return env
	case g.inProcess:
		return "--in-process"
	case len(g.plugins) > 0:
		return "--plugin"
	}
	return ""
}

// daemon returns the berth serve that this command goes through, or nil to run
// embedded. With BERTH_HOST set that daemon must answer; otherwise it is the one
// whose socket STATE/berth.sock answers (no socket, or a stale one that refuses the
// connection: embedded). Before it is used, its status is checked against this
// command's state dir, config file and clock offset: a daemon that runs with other
// ones is refused with an error that names both and the fix, never used silently.
// --no-daemon and BERTH_NO_DAEMON=1 (see noDaemon) return nil at once.
//
// This is the one place that picks embedded or daemon: a command that can run
// through the daemon calls g.api (which calls this), or this directly.
func (g *globals) daemon(ctx context.Context) (*daemonClient, error) {
	return g.daemonFor(ctx, true)
}

// daemonFor is daemon; noteBroken says whether a config file that does not parse
// now, while the daemon serves the command with its earlier read, gets a note on
// stderr (config check, which asks the daemon to check the file as it is now, says
// so itself).
func (g *globals) daemonFor(ctx context.Context, noteBroken bool) (*daemonClient, error) {
	if g.noDaemon() != "" {
		return nil, nil
	}
	want, err := g.wantedIdentity()
	if err != nil {
		return nil, err
	}
	phase.Mark("config")
	if want.configErr != nil && os.Getenv(envHost) != "" {
		return nil, want.configErr // BERTH_HOST's daemon reads its own machine's files
	}
	d, err := g.dialDaemon(ctx, want)
	if want.configErr == nil {
		return d, err
	}
	if err != nil || d == nil || d.Status.Config != want.Config {
		// No daemon serves this command with an earlier read of the file: the
		// command stands on the file as it is, and fails as it did before.
		return nil, want.configErr
	}
	if want.configErr.SHA256 == d.Status.ConfigSHA256 {
		// The daemon took these very bytes: what fails here is this command's
		// environment ($BERTH_PLUGIN_PATH naming a plugin, $HOME for "~/"), and the
		// daemon's check is the one that counts, as in the front (docs/cli.md).
		return d, nil
	}
	if noteBroken {
		first, _, _ := strings.Cut(want.configErr.Error(), "\n")
		fmt.Fprintf(os.Stderr, "berth: note: %s does not parse now (%s); this command goes through berth serve at %s (pid %d) with the rules it read before: fix the file, then `kill -HUP %d` makes the daemon read it again\n",
			want.Config, first, d.Where(), d.Status.PID, d.Status.PID)
	}
	return d, nil
}

// dialDaemon is daemon's work once want is resolved: the daemon that answers and
// matches want, or nil to run embedded.
func (g *globals) dialDaemon(ctx context.Context, want identity) (*daemonClient, error) {
	var err error
	host := os.Getenv(envHost)
	var d *daemonClient
	if host != "" {
		if d, err = dialHost(host); err != nil {
			return nil, err
		}
	} else {
		sock := filepath.Join(want.StateDir, serveSocket)
		if _, err := os.Lstat(sock); err != nil {
			return nil, nil // no daemon
		}
		if d, err = unixClient(sock); err != nil {
			return nil, err
		}
	}
	sctx, cancel := context.WithTimeout(ctx, execrun.StatusTimeout)
	defer cancel()
	if d.Status, err = d.Client.Status(sctx); err != nil {
		if host == "" && client.Refused(err) {
			return nil, nil // a socket that a berth serve left behind: nobody listens
		}
		var ae *client.APIError
		if errors.As(err, &ae) && ae.StatusCode == http.StatusUnauthorized {
			why := ""
			if ae.Info.Message != "" {
				why = ": " + ae.Info.Message
			}
			return nil, fmt.Errorf("berth serve at %s refused the token of %s=%s (401 unauthorized%s); point %s at the file that berth serve's --token-file reads",
				d.Where(), envTokenFile, os.Getenv(envTokenFile), why, envTokenFile)
		}
		fix := fmt.Sprintf("unset %s or use --no-daemon to run embedded", envHost)
		if host == "" {
			fix = execrun.FixNoStatus
		}
		return nil, execrun.StatusFailed(d.Where(), err, fix)
	}
	if err := d.matches(want, host != ""); err != nil {
		return nil, err
	}
	if st := d.Status; host == "" && st.Config != "" && st.Config == want.Config && st.ConfigSHA256 != "" && want.ConfigSHA256 != "" && st.ConfigSHA256 != want.ConfigSHA256 {
		fmt.Fprintf(os.Stderr, "berth: note: berth serve at %s (pid %d) read %s before it last changed, and this command goes through it with the rules it read then: `kill -HUP %d` makes it read the file again (or run with --no-daemon)\n",
			d.Where(), st.PID, st.Config, st.PID)
	}
	phase.Mark("daemon")
	return d, nil
}

// identity is what a command and a daemon must agree on.
type identity struct {
	StateDir, Config string
	ConfigSHA256     string // of the config file's bytes as this command read them; "" without one
	// configErr is why the config file at Config does not parse (a *config.Error,
	// which holds the SHA-256 of those bytes); StateDir then leaves out the file's
	// state_dir. A daemon that read the file before it broke may still serve the
	// command (daemon).
	configErr           *config.Error
	ClockOffset         time.Duration
	explicitState       bool // --state-dir or BERTH_STATE_DIR
	explicitConfig      bool // --config or BERTH_CONFIG
	explicitClockOffset bool
}

// wantedIdentity resolves this command's state dir, config file and clock offset as
// an embedded run would.
func (g *globals) wantedIdentity() (identity, error) {
	self, err := g.self()
	if err != nil {
		return identity{}, err
	}
	cfg, err := g.loadConfig(self)
	var cfgErr *config.Error
	switch {
	case errors.As(err, &cfgErr):
		cfg = &config.Config{Path: cfgErr.Path}
	case err != nil:
		return identity{}, err
	default:
		g.detected = cfg // an embedded run opens its registry with it: not read twice
	}
	dir, err := g.resolveStateDir(cfg)
	if err != nil {
		return identity{}, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return identity{}, err
	}
	off, err := clockOffset()
	if err != nil {
		return identity{}, err
	}
	return identity{StateDir: filepath.Clean(dir), Config: cfg.Path, ConfigSHA256: cfg.SHA256, ClockOffset: off, configErr: cfgErr,
		explicitState:       g.stateDir != "" || os.Getenv(config.EnvStateDir) != "",
		explicitConfig:      g.configPath != "" || os.Getenv(config.EnvConfig) != "",
		explicitClockOffset: os.Getenv(envClockOffset) != ""}, nil
}

// matches refuses a daemon whose state dir, config file or clock offset is not the
// command's. With BERTH_HOST (explicit), only what the command sets itself (a flag
// or its variable) must match: the daemon may be another machine's.
func (d *daemonClient) matches(want identity, explicit bool) error {
	st := d.Status
	var diffs []string
	if (!explicit || want.explicitState) && filepath.Clean(st.StateDir) != want.StateDir {
		diffs = append(diffs, fmt.Sprintf("state dir %s (this command: %s; --state-dir or %s)", st.StateDir, want.StateDir, config.EnvStateDir))
	}
	if (!explicit || want.explicitConfig) && st.Config != want.Config {
		knob := fmt.Sprintf("--config or %s", config.EnvConfig)
		if st.Config == "" && !want.explicitConfig {
			// The default file was made after the daemon started without one.
			knob = fmt.Sprintf("the default file, made since the daemon started: `kill -HUP %d` makes the daemon read it", st.PID)
		}
		diffs = append(diffs, fmt.Sprintf("config %s (this command: %s; %s)", orBuiltin(st.Config), orBuiltin(want.Config), knob))
	}
	if (!explicit || want.explicitClockOffset) && st.ClockOffsetMS != want.ClockOffset.Milliseconds() {
		diffs = append(diffs, fmt.Sprintf("clock offset %v (this command: %v; %s)", time.Duration(st.ClockOffsetMS)*time.Millisecond, want.ClockOffset, envClockOffset))
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("berth serve at %s (pid %d) runs with %s; refusing to mix them: run this command with the daemon's settings, or with --no-daemon (or %s=1) to run it embedded",
		d.Where(), st.PID, strings.Join(diffs, ", and "), envNoDaemon)
}

func orBuiltin(p string) string {
	if p == "" {
		return "(none: the built-in default)"
	}
	return p
}

// dialHost is the client of BERTH_HOST: unix:///PATH, https://HOST:PORT (with
// BERTH_TOKEN_FILE, and BERTH_TLS_CA for a CA of its own) or
// http://LOOPBACK-IP:PORT (with BERTH_TOKEN_FILE); the address is checked by
// client.New, whose error names the fix.
func dialHost(host string) (*daemonClient, error) {
	c, err := client.New(host)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envHost, err)
	}
	if strings.HasPrefix(c.Where(), "unix://") {
		return &daemonClient{Client: c}, nil
	}
	tokFile := os.Getenv(envTokenFile)
	if tokFile == "" {
		return nil, fmt.Errorf("%s=%q: a TCP daemon needs its bearer token: set %s to the file that berth serve's --token-file reads", envHost, host, envTokenFile)
	}
	tok, err := readToken(tokFile, envTokenFile)
	if err != nil {
		return nil, err
	}
	opts := []client.Opt{client.WithToken(tok)}
	if ca := os.Getenv(envTLSCA); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", envTLSCA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in it", envTLSCA, ca)
		}
		opts = append(opts, client.WithTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	}
	if c, err = client.New(host, opts...); err != nil {
		return nil, fmt.Errorf("%s: %w", envHost, err)
	}
	return &daemonClient{Client: c}, nil
}
