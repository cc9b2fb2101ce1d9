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
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/apiclient"
	"github.com/berth-sh/berth/internal/phase"
)

// The environment that points berth's CLI at a daemon, or away from one.
const (
	// envHost names the daemon to use (apiclient.EnvHost).
	envHost = apiclient.EnvHost
	// envTokenFile is the file holding the bearer token of a TCP daemon.
	envTokenFile = "BERTH_TOKEN_FILE"
	// envTLSCA is a PEM file of the CA certificates that an https daemon's
	// certificate is checked against (default: the system's roots).
	envTLSCA = "BERTH_TLS_CA"
	// envNoDaemon=1 is --no-daemon (apiclient.NoDaemonEnv).
	envNoDaemon = apiclient.EnvNoDaemon
)

// daemonClient is the CLI's one client of a running berth serve (an
// apiclient.Client): the api methods (daemon_api.go), the files routes
// (daemoncopy.go) and the TTY WebSocket (daemonshell.go) all go through it.
type daemonClient struct {
	*apiclient.Client
}

// unixClient is the client over the unix socket at path (apiclient.Unix).
func unixClient(path string) *daemonClient { return &daemonClient{apiclient.Unix(path)} }

// noDaemon reports why this command runs embedded whatever runs: --no-daemon,
// BERTH_NO_DAEMON, or a flag that changes how drivers are run in this process
// (--in-process, conformance's --plugin); "" when none does.
func (g *globals) noDaemon() string {
	env := apiclient.NoDaemonEnv()
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
			want.Config, first, d.Where, d.Status.PID, d.Status.PID)
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
		d = unixClient(sock)
	}
	sctx, cancel := context.WithTimeout(ctx, apiclient.StatusTimeout)
	defer cancel()
	if err := d.Get(sctx, "/v1/status", &d.Status); err != nil {
		if host == "" && apiclient.Refused(err) {
			return nil, nil // a socket that a berth serve left behind: nobody listens
		}
		var ae *apiclient.APIError
		if errors.As(err, &ae) && ae.StatusCode == http.StatusUnauthorized {
			why := ""
			if ae.Info.Message != "" {
				why = ": " + ae.Info.Message
			}
			return nil, fmt.Errorf("berth serve at %s refused the token of %s=%s (401 unauthorized%s); point %s at the file that berth serve's --token-file reads",
				d.Where, envTokenFile, os.Getenv(envTokenFile), why, envTokenFile)
		}
		fix := fmt.Sprintf("unset %s or use --no-daemon to run embedded", envHost)
		if host == "" {
			fix = apiclient.FixNoStatus
		}
		return nil, apiclient.StatusFailed(d.Where, err, fix)
	}
	if err := d.matches(want, host != ""); err != nil {
		return nil, err
	}
	if st := d.Status; host == "" && st.Config != "" && st.Config == want.Config && st.ConfigSHA256 != "" && want.ConfigSHA256 != "" && st.ConfigSHA256 != want.ConfigSHA256 {
		fmt.Fprintf(os.Stderr, "berth: note: berth serve at %s (pid %d) read %s before it last changed, and this command goes through it with the rules it read then: `kill -HUP %d` makes it read the file again (or run with --no-daemon)\n",
			d.Where, st.PID, st.Config, st.PID)
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
		d.Where, st.PID, strings.Join(diffs, ", and "), envNoDaemon)
}

func orBuiltin(p string) string {
	if p == "" {
		return "(none: the built-in default)"
	}
	return p
}

// dialHost is the client of BERTH_HOST: unix:///PATH, https://HOST:PORT (with
// BERTH_TOKEN_FILE) or http://LOOPBACK-IP:PORT (with BERTH_TOKEN_FILE).
func dialHost(host string) (*daemonClient, error) {
	u, err := url.Parse(host)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: %v; use unix:///PATH, https://HOST:PORT or http://127.0.0.1:PORT", envHost, host, err)
	}
	switch u.Scheme {
	case "unix":
		if u.Host != "" || !filepath.IsAbs(u.Path) {
			return nil, fmt.Errorf("%s=%q: a unix socket needs an absolute path: unix:///PATH", envHost, host)
		}
		return unixClient(filepath.Clean(u.Path)), nil
	case "http", "https":
	case "tcp":
		addr := u.Host
		if h, port, err := net.SplitHostPort(u.Host); err == nil && (h == "" || net.ParseIP(h).IsUnspecified()) {
			addr = net.JoinHostPort("127.0.0.1", port) // a listener on every address: name one of them
		}
		return nil, fmt.Errorf("%s=%q: tcp:// is how berth serve's --listen is written; a client names the address as http://%s (a listener on loopback without TLS) or https://%s (one with --tls-cert; the name its certificate holds)", envHost, host, addr, addr)
	default:
		return nil, fmt.Errorf("%s=%q: unknown scheme; use unix:///PATH, https://HOST:PORT or http://127.0.0.1:PORT", envHost, host)
	}
	if u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("%s=%q: want %s://HOST:PORT, nothing after the port", envHost, host, u.Scheme)
	}
	if u.Scheme == "http" && !loopback(u.Host) {
		return nil, fmt.Errorf("%s=%q: plain http only to a loopback IP (127.0.0.1, ::1): the token would cross the network in clear; use https://", envHost, host)
	}
	tokFile := os.Getenv(envTokenFile)
	if tokFile == "" {
		return nil, fmt.Errorf("%s=%q: a TCP daemon needs its bearer token: set %s to the file that berth serve's --token-file reads", envHost, host, envTokenFile)
	}
	tok, err := readToken(tokFile, envTokenFile)
	if err != nil {
		return nil, err
	}
	var dl net.Dialer
	tr := &http.Transport{DialContext: apiclient.Watched(dl.DialContext), DisableCompression: true, MaxIdleConnsPerHost: 4, Proxy: nil}
	if ca := os.Getenv(envTLSCA); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", envTLSCA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in it", envTLSCA, ca)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &daemonClient{&apiclient.Client{Where: u.Scheme + "://" + u.Host, Base: u.Scheme + "://" + u.Host, HTTP: &http.Client{Transport: tr, CheckRedirect: apiclient.NoRedirect}, Token: tok}}, nil
}
