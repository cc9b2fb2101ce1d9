package containerd_test

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/containerd"
)

// i386Program returns a minimal static 32-bit x86 ELF executable (a real i386
// program, as the kernel's IA-32 emulation runs it) that calls getpid and then
// exit(42) through int $0x80. Exit 42 says both calls went through the filter; a
// filter that covers only the native x86_64 ABI kills it with SIGSYS at the first.
func i386Program() []byte {
	code := []byte{
		0xb8, 20, 0, 0, 0, // mov eax, 20 (getpid)
		0xcd, 0x80, // int 0x80
		0xb8, 1, 0, 0, 0, // mov eax, 1 (exit)
		0xbb, 42, 0, 0, 0, // mov ebx, 42
		0xcd, 0x80, // int 0x80
	}
	const base, ehsize, phsize = 0x08048000, 52, 32
	size := uint32(ehsize + phsize + len(code))
	var b bytes.Buffer
	b.Write([]byte{0x7f, 'E', 'L', 'F', 1 /* 32-bit */, 1 /* little-endian */, 1 /* version */, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	// e_type EXEC, e_machine 386, e_version, e_entry, e_phoff, e_shoff, e_flags,
	// e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx.
	binary.Write(&b, binary.LittleEndian, struct {
		Type, Machine                uint16
		Version, Entry, Phoff, Shoff uint32
		Flags                        uint32
		Ehsize, Phentsize, Phnum     uint16
		Shentsize, Shnum, Shstrndx   uint16
	}{2, 3, 1, base + ehsize + phsize, ehsize, 0, 0, ehsize, phsize, 1, 0, 0, 0})
	// One PT_LOAD of the whole file, read + execute.
	binary.Write(&b, binary.LittleEndian, [8]uint32{1, 0, base, base, size, size, 5, 0x1000})
	b.Write(code)
	return b.Bytes()
}

// hostRunsI386 reports whether this host's kernel runs i386Program at all, outside
// any sandbox: it needs IA-32 emulation compiled in and enabled (CONFIG_IA32_EMULATION,
// not turned off by ia32_emulation=false or CONFIG_IA32_EMULATION_DEFAULT_DISABLED).
// Where it does not, execve fails with ENOEXEC on the host as in every sandbox, so a
// run of the program cannot tell a filter's SIGSYS from a kernel that refuses 32-bit
// code; reason then says what the probe saw.
func hostRunsI386(t *testing.T) (ok bool, reason string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "i386")
	if err := os.WriteFile(path, i386Program(), 0o755); err != nil {
		t.Fatal(err)
	}
	err := exec.Command(path).Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.ExitCode() == 42:
		return true, ""
	case errors.Is(err, syscall.ENOEXEC):
		return false, "this kernel does not run 32-bit x86 programs (IA-32 emulation compiled out or disabled): execve of the i386 program on the host fails with ENOEXEC"
	default:
		// Exit 42 is the only success; anything else is a broken probe, not a host
		// without IA-32, and must not turn into a silent skip.
		t.Fatalf("probing IA-32 emulation: the i386 program on the host gave %v, want exit 42 or ENOEXEC", err)
		return false, ""
	}
}

// seccompArches returns the seccomp filter of the container name's OCI spec, as
// containerd hands it to runc: applied reports whether there is one, and arches its
// architectures (none listed: the native ABI only, as libseccomp's seccomp_init).
func (f *fixture) seccompArches(name string) (applied bool, arches []specs.Arch) {
	f.t.Helper()
	c, err := f.cli.LoadContainer(f.ctx, name)
	if err != nil {
		f.t.Fatal(err)
	}
	s, err := c.Spec(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	if s.Linux == nil || s.Linux.Seccomp == nil {
		return false, nil
	}
	return true, s.Linux.Seccomp.Architectures
}

// tarOf returns a tar stream with one executable file.
func tarOf(t *testing.T, name string, data []byte) *bytes.Buffer {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write(data)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// The seccomp setting, seen from inside a sandbox: "native" (the default) filters and
// kills a 32-bit program (SIGSYS, 128+31); "docker" filters and lets it run; a
// profile file is applied as written (one that refuses mkdir with EPERM and, listing
// no architectures, covers the native ABI only); "unconfined" has no filter. Which
// ABIs a filter covers is read from the spec runc is given on every host; the i386
// program proves it only where the host's kernel runs 32-bit code at all
// (hostRunsI386), and the test says so where it cannot.
func TestSeccompSettings(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the 32-bit program is i386 code: amd64 hosts only")
	}
	runsI386, noI386 := hostRunsI386(t)
	if !runsI386 {
		t.Logf("not running the i386 program in the sandboxes: %s; the filters' architectures are checked in the containers' specs", noI386)
	}
	profile := filepath.Join(t.TempDir(), "no-mkdir.json")
	if err := os.WriteFile(profile, []byte(`{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		for _, c := range []struct {
			setting  string
			filtered bool
			i386Exit int
		}{
			{"", true, 128 + 31}, // the default is native
			{containerd.SeccompNative, true, 128 + 31},
			{containerd.SeccompDocker, true, 42},
			{containerd.SeccompUnconfined, false, 42},
			{profile, true, 128 + 31}, // it lists no architectures: native only
		} {
			d := containerd.New(containerd.WithAddress(addr), containerd.WithNamespace(testNamespace), containerd.WithSeccomp(c.setting))
			defer d.Close()
			name := conformance.SandboxName()
			if _, err := d.Create(f.ctx, f.request(name)); err != nil {
				t.Fatalf("seccomp %q: Create: %v", c.setting, err)
			}
			run := func(argv ...string) (int, string) {
				var out bytes.Buffer
				p, err := f.exec(name, backend.ExecRequest{Argv: argv, Stdout: &out, Stderr: &out})
				if err != nil {
					t.Fatalf("seccomp %q: Exec %q: %v", c.setting, argv, err)
				}
				res, err := p.Wait()
				if err != nil {
					t.Fatalf("seccomp %q: %q: %v", c.setting, argv, err)
				}
				return res.ExitCode, out.String()
			}
			applied, arches := f.seccompArches(name)
			if applied != c.filtered {
				t.Errorf("seccomp %q: the container's spec has a filter: %v, want %v", c.setting, applied, c.filtered)
			}
			// Docker's profile lists the 32-bit ABIs beside the native one; native and
			// the profile file list none, so libseccomp covers the native ABI only.
			if has32 := slices.Contains(arches, specs.ArchX86); has32 != (c.i386Exit == 42 && c.filtered) {
				t.Errorf("seccomp %q: the filter's architectures are %v: covers i386 %v, want %v", c.setting, arches, has32, !has32)
			}
			_, status := run("grep", "^Seccomp:", "/proc/self/status")
			if want := map[bool]string{true: "Seccomp:\t2", false: "Seccomp:\t0"}[c.filtered]; !strings.Contains(status, want) {
				t.Errorf("seccomp %q: /proc/self/status says %q, want %q", c.setting, status, want)
			}
			if runsI386 {
				ac, err := agent.Connect(f.ctx, f.files[name])
				if err != nil {
					t.Fatal(err)
				}
				err = ac.CopyIn(f.ctx, "/tmp", tarOf(t, "i386", i386Program()))
				ac.Close()
				if err != nil {
					t.Fatal(err)
				}
				if code, out := run("/tmp/i386"); code != c.i386Exit {
					t.Errorf("seccomp %q: the i386 program exited %d (%q), want %d", c.setting, code, out, c.i386Exit)
				}
			}
			code, out := run("mkdir", "/tmp/d")
			if c.setting == profile {
				if code == 0 || !strings.Contains(out, "not permitted") {
					t.Errorf("profile refusing mkdir: mkdir exited %d (%q), want a failure with EPERM", code, out)
				}
			} else if code != 0 {
				t.Errorf("seccomp %q: mkdir exited %d: %s", c.setting, code, out)
			}
			if err := d.Remove(f.ctx, name); err != nil {
				t.Error(err)
			}
		}
	})
}

// A profile file that refuses what runc or the agent needs at start fails Create with
// a hint that names the profile, and leaves nothing (the fixture's leak check).
func TestSeccompProfileTooStrict(t *testing.T) {
	profile := filepath.Join(t.TempDir(), "deny-all.json")
	if err := os.WriteFile(profile, []byte(`{"defaultAction": "SCMP_ACT_ERRNO"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		d := containerd.New(containerd.WithAddress(addr), containerd.WithNamespace(testNamespace), containerd.WithSeccomp(profile))
		defer d.Close()
		name := conformance.SandboxName()
		_, err := d.Create(f.ctx, f.request(name))
		if err == nil || !strings.Contains(err.Error(), "the seccomp profile "+profile+" may refuse") {
			t.Fatalf("Create under a deny-all profile: %v; want a failure naming the profile", err)
		}
		f.absent(name)
	})
}
