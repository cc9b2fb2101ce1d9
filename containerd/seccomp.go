package containerd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-sh/berth/backend"
)

// maxSeccompFile bounds a seccomp profile file (bytes); Docker's profile is ~20 KiB.
const maxSeccompFile = 1 << 20

// checkSeccomp checks the shape of a seccomp setting: one of the Seccomp* names, or an
// absolute path. The file itself is read by readSeccomp (at Create, and by Validate):
// a profile file that went missing must not stop the driver from stopping and
// removing the sandboxes it already has. Errors wrap backend.ErrInvalid and say what
// to write instead.
func checkSeccomp(v string) error {
	switch v {
	case SeccompNative, SeccompDocker, SeccompUnconfined:
		return nil
	}
	if !filepath.IsAbs(v) {
		return backend.Errorf(backend.ErrInvalid, "driver \"containerd\": seccomp %q is neither %q, %q, %q nor the absolute path of a JSON profile", v, SeccompNative, SeccompDocker, SeccompUnconfined)
	}
	return nil
}

// Validate implements backend.Validator (Capabilities.Validate, for `berth config
// check`): it checks spec as Create does before it asks containerd anything (the
// sandbox name, and specOpts: image reference, env, workdir, network, resources,
// the user's form, mounts, the seccomp setting's shape, the spec's runtime: in the
// runtimes setting, its binary executable, its network one it has) and reads the
// seccomp profile file that Configure checks only for shape, as Create does for a
// new container. It connects to no daemon, so it does not check that the image is
// there, nor that a user name exists in it (the agent resolves that at Create).
// Errors wrap backend.ErrInvalid (backend.ErrUnsupported for a network or runtime the
// driver lacks) and name the input (the profile file, for its errors).
func (d *Driver) Validate(ctx context.Context, spec backend.SandboxSpec) error {
	if err := backend.ValidateSandboxName(spec.Name); err != nil {
		return err
	}
	if _, _, err := d.specOpts(spec, backend.AgentFiles{}); err != nil {
		return err
	}
	binary, err := d.runtimeBinary(spec.Name, spec.Runtime)
	if err != nil {
		return err
	}
	if err := checkRuntimeNetwork(spec, binary); err != nil {
		return err
	}
	_, err = seccompOpt(d.seccompSetting()) // what Create does, without a container
	return err
}

// unsafeActions are the seccomp actions a profile must not use. SCMP_ACT_KILL and
// SCMP_ACT_KILL_THREAD end only the calling thread: in a multi-threaded process (runc's
// init while it starts the task, berth's agent) the others live on and wait for it,
// and the task start never ends. SCMP_ACT_NOTIFY needs a seccomp agent
// (listenerPath), which berth does not run.
var unsafeActions = map[specs.LinuxSeccompAction]string{
	specs.ActKill:       "it ends only the calling thread, and the task start then hangs; use SCMP_ACT_KILL_PROCESS or SCMP_ACT_ERRNO",
	specs.ActKillThread: "it ends only the calling thread, and the task start then hangs; use SCMP_ACT_KILL_PROCESS or SCMP_ACT_ERRNO",
	specs.ActNotify:     "it needs a seccomp agent, which berth does not run; use SCMP_ACT_ERRNO",
}

// knownActions are the actions of the OCI runtime spec (specs-go).
var knownActions = []specs.LinuxSeccompAction{specs.ActKill, specs.ActKillProcess, specs.ActKillThread, specs.ActTrap, specs.ActErrno, specs.ActTrace, specs.ActAllow, specs.ActLog, specs.ActNotify}

// knownArches are the architectures of the OCI runtime spec (specs-go).
var knownArches = []specs.Arch{specs.ArchX86, specs.ArchX86_64, specs.ArchX32, specs.ArchARM, specs.ArchAARCH64, specs.ArchMIPS, specs.ArchMIPS64, specs.ArchMIPS64N32, specs.ArchMIPSEL, specs.ArchMIPSEL64, specs.ArchMIPSEL64N32, specs.ArchPPC, specs.ArchPPC64, specs.ArchPPC64LE, specs.ArchS390, specs.ArchS390X, specs.ArchPARISC, specs.ArchPARISC64, specs.ArchRISCV64, specs.ArchLOONGARCH64, specs.ArchM68K, specs.ArchSH, specs.ArchSHEB}

// checkAction refuses an action the spec does not know and one of unsafeActions;
// where says which one it is.
func checkAction(a specs.LinuxSeccompAction, where string) error {
	if !slices.Contains(knownActions, a) {
		return fmt.Errorf("%s %q is not an action of the OCI runtime spec (SCMP_ACT_ERRNO, SCMP_ACT_ALLOW, SCMP_ACT_KILL_PROCESS, ...)", where, a)
	}
	if why := unsafeActions[a]; why != "" {
		return fmt.Errorf("%s %s: %s", where, a, why)
	}
	return nil
}

// readSeccomp reads and decodes the OCI seccomp profile at path (at most
// maxSeccompFile bytes). Errors wrap backend.ErrInvalid and name the file.
func readSeccomp(path string) (*specs.LinuxSeccomp, error) {
	bad := func(format string, args ...any) (*specs.LinuxSeccomp, error) {
		return nil, backend.Errorf(backend.ErrInvalid, "driver \"containerd\": seccomp profile %s: "+format+" (write an OCI seccomp object: {\"defaultAction\": \"SCMP_ACT_ERRNO\", \"syscalls\": [...]}, or use %q, %q or %q)", append(append([]any{path}, args...), SeccompNative, SeccompDocker, SeccompUnconfined)...)
	}
	f, err := os.Open(path)
	if err != nil {
		return bad("%v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return bad("%v", err)
	}
	if !fi.Mode().IsRegular() {
		return bad("not a regular file")
	}
	if fi.Size() > maxSeccompFile {
		return bad("%d bytes, more than the limit of %d", fi.Size(), maxSeccompFile)
	}
	var p specs.LinuxSeccomp
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return bad("not an OCI seccomp object: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return bad("more than one JSON value")
	}
	if p.DefaultAction == "" {
		return bad("no defaultAction")
	}
	if err := checkAction(p.DefaultAction, "defaultAction"); err != nil {
		return bad("%v", err)
	}
	for _, a := range p.Architectures {
		if !slices.Contains(knownArches, a) {
			return bad("architecture %q is not one of the OCI runtime spec (SCMP_ARCH_X86_64, SCMP_ARCH_AARCH64, ...)", a)
		}
	}
	for i, sc := range p.Syscalls {
		if len(sc.Names) == 0 {
			return bad("syscalls[%d] names no system call", i)
		}
		if err := checkAction(sc.Action, fmt.Sprintf("syscalls[%d] (%s) action", i, sc.Names[0])); err != nil {
			return bad("%v", err)
		}
	}
	return &p, nil
}

// seccompOpt returns the spec option that applies setting v ("" is DefaultSeccomp),
// or nil for SeccompUnconfined. A profile file is read now, so that a bad one fails
// before anything is made. Errors wrap backend.ErrInvalid.
func seccompOpt(v string) (oci.SpecOpts, error) {
	switch v {
	case SeccompUnconfined:
		return nil, nil
	case SeccompDocker:
		return seccomp.WithDefaultProfile(), nil
	case "", SeccompNative:
		return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			s.Linux.Seccomp = seccomp.DefaultProfile(s)
			// With no architectures listed the filter covers the native ABI only
			// (libseccomp's seccomp_init); a call through another ABI gets the filter's
			// bad-architecture action (runc: kill).
			s.Linux.Seccomp.Architectures = nil
			return nil
		}, nil
	}
	if err := checkSeccomp(v); err != nil {
		return nil, err
	}
	p, err := readSeccomp(v)
	if err != nil {
		return nil, err
	}
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Linux.Seccomp = p
		return nil
	}, nil
}

// profileHint returns, when the driver's seccomp setting is a profile file, a hint for
// the error of a task that could not start: runc and the agent make calls that a
// profile's defaultAction may refuse (a profile that refuses everything it does not
// list makes runc fail with "cannot start a stopped process"). "" otherwise.
func (d *Driver) profileHint() string {
	switch v := d.seccompSetting(); v {
	case SeccompNative, SeccompDocker, SeccompUnconfined:
		return ""
	default:
		return fmt.Sprintf("; the seccomp profile %s may refuse a system call that runc or berth's agent needs at start (its defaultAction applies to every call it does not list): allow those calls, or start from seccomp = %q", v, SeccompNative)
	}
}

// seccompSetting returns the driver's seccomp setting, DefaultSeccomp when unset.
func (d *Driver) seccompSetting() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seccomp == "" {
		return DefaultSeccomp
	}
	return d.seccomp
}
