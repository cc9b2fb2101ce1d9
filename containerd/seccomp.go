package containerd

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-sh/berth/backend"
)

// maxSeccompFile bounds a seccomp profile file (bytes); Docker's profile is ~20 KiB.
const maxSeccompFile = 1 << 20

// checkSeccomp validates a seccomp setting: one of the Seccomp* names, or the absolute
// path of a readable OCI seccomp JSON file with a defaultAction. Errors wrap
// backend.ErrInvalid and say what to write instead.
func checkSeccomp(v string) error {
	switch v {
	case SeccompNative, SeccompDocker, SeccompUnconfined:
		return nil
	}
	if !filepath.IsAbs(v) {
		return backend.Errorf(backend.ErrInvalid, "driver \"containerd\": seccomp %q is neither %q, %q, %q nor the absolute path of a JSON profile", v, SeccompNative, SeccompDocker, SeccompUnconfined)
	}
	_, err := readSeccomp(v)
	return err
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
	if p.DefaultAction == "" {
		return bad("no defaultAction")
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

// seccompSetting returns the driver's seccomp setting, DefaultSeccomp when unset.
func (d *Driver) seccompSetting() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seccomp == "" {
		return DefaultSeccomp
	}
	return d.seccomp
}
