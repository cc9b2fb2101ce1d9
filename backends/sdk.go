package backends

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/backend"
)

// DescribeCommand is the argument that makes a driver built with Main print
// its Description as JSON on stdout and exit 0, without the plugin handshake.
const DescribeCommand = "describe"

// DescribeTimeout bounds how long Describe waits for a driver's describe output.
const DescribeTimeout = 10 * time.Second

// describeMaxBytes caps the describe output Describe reads: 1 MiB.
const describeMaxBytes = 1 << 20

// Description is what `berth-driver-NAME describe` prints: one JSON object.
type Description struct {
	// Name, Version and ProtocolVersions are the driver's Info fields: its
	// config name, its own version string, and the plugin protocol versions it
	// speaks (sorted ascending).
	Name             string `json:"name"`
	Version          string `json:"version"`
	ProtocolVersions []int  `json:"protocol_versions"`
	// Capabilities are the driver's Info.Capabilities.
	Capabilities backend.Capabilities `json:"capabilities"`
	// ConfigSchema is the driver's config schema (backend.Configurer), empty
	// when it takes no config.
	ConfigSchema []backend.ConfigField `json:"config_schema"`
}

// DescribeDriver returns d's Description by asking it, in this process: Info and,
// when d implements backend.Configurer, ConfigSchema. ProtocolVersions
// defaults to [ProtocolVersion] when Info leaves it empty, as Serve does.
func DescribeDriver(ctx context.Context, d backend.TerminalBackend) (Description, error) {
	info, err := backend.InfoOf(ctx, d)
	if err != nil {
		return Description{}, fmt.Errorf("Info: %w", err)
	}
	desc := Description{Name: info.Name, Version: info.Version, ProtocolVersions: slices.Clone(info.ProtocolVersions), Capabilities: info.Capabilities}
	if len(desc.ProtocolVersions) == 0 {
		desc.ProtocolVersions = []int{ProtocolVersion}
	}
	slices.Sort(desc.ProtocolVersions)
	if c, ok := d.(backend.Configurer); ok {
		fields, err := c.ConfigSchema(ctx)
		if err != nil && !errors.Is(err, backend.ErrUnsupported) {
			return Description{}, fmt.Errorf("ConfigSchema: %w", err)
		}
		desc.ConfigSchema = fields
	}
	if desc.ConfigSchema == nil {
		desc.ConfigSchema = []backend.ConfigField{}
	}
	return desc, nil
}

// Main is the whole main function of a driver plugin binary
// (berth-driver-NAME): with the single argument "describe" it prints the
// driver's Description as indented JSON on stdout and returns 0; with no
// arguments it serves the driver (Serve, logging go-hclog JSON on stderr at
// the level the host asked for) and returns 0 once the host is done with it;
// anything else prints a usage line on stderr and returns 2. Run by hand
// without a host, Serve prints go-plugin's hint and exits 1.
//
//	func main() { os.Exit(backends.Main(mydriver.New())) }
//
// d is closed before Main returns.
func Main(d backend.TerminalBackend) int {
	if len(os.Args) == 2 && os.Args[1] == DescribeCommand {
		// What the driver prints while it is asked goes to stderr: stdout carries
		// only the JSON, as after the handshake it carries nothing.
		if out, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 3); err == nil {
			if unix.Dup3(2, 1, 0) == nil {
				f := os.NewFile(uintptr(out), "stdout")
				defer f.Close()
				return mainArgs(d, os.Args[1:], f, os.Stderr)
			}
			unix.Close(out)
		}
	}
	return mainArgs(d, os.Args[1:], os.Stdout, os.Stderr)
}

func mainArgs(d backend.TerminalBackend, args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		Serve(d, nil)
		return 0
	case len(args) == 1 && args[0] == DescribeCommand:
		ctx, cancel := context.WithTimeout(context.Background(), DescribeTimeout)
		defer cancel()
		defer d.Close()
		desc, err := DescribeDriver(ctx, d)
		if err != nil {
			fmt.Fprintf(stderr, "describe: %v\n", err)
			return 1
		}
		b, err := json.MarshalIndent(desc, "", "  ")
		if err != nil {
			fmt.Fprintf(stderr, "describe: %v\n", err)
			return 1
		}
		if _, err := stdout.Write(append(b, '\n')); err != nil {
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "usage: %s [%s]\n  a berth driver plugin: berth starts it (see 'berth drivers'); %q prints its name, version, protocol versions, capabilities and config schema as JSON\n", progName(), DescribeCommand, DescribeCommand)
	return 2
}

func progName() string {
	if len(os.Args) == 0 {
		return "berth-driver"
	}
	return os.Args[0]
}

// Describe runs `path describe` (stdin /dev/null, a clean process group that
// is killed when it ends or when ctx or DescribeTimeout runs out) and parses
// its JSON. It does not start the plugin handshake. Errors wrap
// backend.ErrUnavailable and name the file: it cannot be run, exits non-zero
// (its stderr is quoted), prints no valid JSON, or declares no name or no
// protocol version.
func Describe(ctx context.Context, path string) (Description, error) {
	return describe(ctx, path, nil)
}

// describe is Describe with extra KEY=VALUE pairs in the plugin's environment.
func describe(ctx context.Context, path string, extraEnv []string) (Description, error) {
	if err := checkExecutable(path); err != nil {
		return Description{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, DescribeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, DescribeCommand)
	var stdout bytes.Buffer
	stderr := &tailRecorder{max: 2048}
	cmd.Stdout = &limitWriter{w: &stdout, n: describeMaxBytes}
	cmd.Stderr = stderr
	cmd.Env = append(os.Environ(), extraEnv...) // no handshake cookie: a plugin that ignores "describe" exits at once
	cmd.SysProcAttr = processGroup()
	cmd.Cancel = func() error { return killGroup(cmd) }
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		_ = killGroup(cmd) // whatever it left in its group
	}
	if ctx.Err() != nil {
		return Description{}, describeError(path, "no answer within %s; it must print its description and exit (backends.Main does)", DescribeTimeout)
	}
	if err != nil {
		note := strings.TrimSpace(stderr.String())
		if note != "" {
			note = "; its stderr ended with: " + lastLines(note, 3)
		}
		return Description{}, describeError(path, "%v%s; a berth driver built with backends.Main answers %q with JSON", err, note, DescribeCommand)
	}
	var desc Description
	dec := json.NewDecoder(bytes.NewReader(stdout.Bytes()))
	if err := dec.Decode(&desc); err != nil {
		return Description{}, describeError(path, "its output is not a JSON description (%v): %q", err, clip(strings.TrimSpace(stdout.String()), 120))
	}
	if desc.Name == "" || len(desc.ProtocolVersions) == 0 {
		return Description{}, describeError(path, "the description lacks a name or protocol_versions: %q", clip(strings.TrimSpace(stdout.String()), 200))
	}
	slices.Sort(desc.ProtocolVersions)
	return desc, nil
}

// HostProtocolVersions returns the plugin protocol versions this host speaks,
// ascending.
func HostProtocolVersions() []int {
	var vs []int
	for v := range pluginSets(nil) {
		vs = append(vs, v)
	}
	slices.Sort(vs)
	return vs
}

// CommonVersion returns the highest protocol version in both lists, or false.
func CommonVersion(host, plugin []int) (int, bool) {
	best, ok := 0, false
	for _, v := range plugin {
		if slices.Contains(host, v) && (!ok || v > best) {
			best, ok = v, true
		}
	}
	return best, ok
}

// versionError is the error for a plugin that shares no protocol version with
// this host.
func versionError(path string, plugin []int) error {
	host := HostProtocolVersions()
	return backend.Errorf(backend.ErrUnavailable,
		"driver plugin %s speaks plugin protocol versions %v and this berth speaks %v: no version in common, so it was not started; install a build of the driver that speaks one of %v, or a berth that speaks one of %v",
		path, plugin, host, host, plugin)
}

// limitWriter writes at most n bytes to w and drops the rest.
type limitWriter struct {
	w io.Writer
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(l.n, len(p))
		_, _ = l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

func processGroup() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// killGroup kills the process group of a command started with processGroup.
func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}

// describeError formats an error of Describe.
func describeError(path, format string, args ...any) error {
	return backend.Errorf(backend.ErrUnavailable, "driver plugin %s: describe: %s", path, fmt.Sprintf(format, args...))
}
