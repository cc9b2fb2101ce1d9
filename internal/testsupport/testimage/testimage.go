// Package testimage builds berth's test image without a network: a `docker save`
// archive holding one layer made from the host's static busybox (Debian's
// busybox-static), which Docker 20.10 (`docker load`, ImageLoad) and containerd 1.6
// (`ctr images import`) both accept.
//
// The layer has /bin/busybox with a symbolic link for every applet it lists (sh, cat,
// sleep, kill, grep, head, stty, ...), /etc/passwd and /etc/group with root (0) and
// user (1234), /root, /home/user (owned by 1234), /tmp (mode 1777) and the empty
// directories a container needs. Every timestamp is fixed, so the same busybox gives
// the same archive, byte for byte, and so the same image id.
package testimage

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"

	"github.com/berth-sh/berth/internal/imagearchive"
)

// Ref is the reference the archive tags its image with.
const Ref = "berth-test/busybox:1"

// UserID is the uid and gid of the unprivileged user in the image ("user").
const UserID = 1234

// BusyboxPaths are where Busybox looks for a static busybox, in order.
var BusyboxPaths = []string{"/bin/busybox", "/usr/bin/busybox"}

// epoch is every file's modification time and the image's creation time.
var epoch = imagearchive.Epoch

// Busybox returns the path of a statically linked busybox on this host (BERTH_BUSYBOX
// first, then BusyboxPaths). The error says how to get one.
func Busybox() (string, error) {
	paths := BusyboxPaths
	if p := os.Getenv("BERTH_BUSYBOX"); p != "" {
		paths = []string{p}
	}
	var why []string
	for _, p := range paths {
		f, err := elf.Open(p)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %v", p, err))
			continue
		}
		static := true
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				static = false
			}
		}
		f.Close()
		if !static {
			why = append(why, p+" is dynamically linked")
			continue
		}
		return p, nil
	}
	return "", fmt.Errorf("no static busybox for the test image (%s): install one (Debian: apt-get install busybox-static) or set BERTH_BUSYBOX", strings.Join(why, "; "))
}

var (
	once    sync.Once
	archive []byte
	onceErr error
)

// Archive returns the test image archive built from Busybox(), building it once per
// process.
func Archive() ([]byte, error) {
	once.Do(func() {
		var bb string
		if bb, onceErr = Busybox(); onceErr == nil {
			archive, onceErr = Build(bb)
		}
	})
	return archive, onceErr
}

// Build returns the `docker save` archive of the test image made from the static
// busybox at busyboxPath. It runs `busybox --list` to learn the applets.
func Build(busyboxPath string) ([]byte, error) {
	return build(busyboxPath, Ref, "")
}

// Variant returns a `docker save` archive like Archive's, tagged ref (NAME:TAG), whose
// one layer also holds /etc/berth-variant with marker, so that images with different
// markers share no layer: pull tests use it to make an engine download every byte.
func Variant(ref, marker string) ([]byte, error) {
	bb, err := Busybox()
	if err != nil {
		return nil, err
	}
	return build(bb, ref, marker)
}

func build(busyboxPath, ref, marker string) ([]byte, error) {
	bin, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, fmt.Errorf("test image: %w", err)
	}
	out, err := exec.Command(busyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("test image: %s --list: %w", busyboxPath, err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			applets = append(applets, a)
		}
	}
	if len(applets) == 0 {
		return nil, errors.New("test image: busybox --list printed no applets")
	}
	sort.Strings(applets)
	layer, err := buildLayer(bin, applets, marker)
	if err != nil {
		return nil, err
	}
	return buildArchive(layer, ref)
}

// buildLayer writes the root filesystem tar; a non-empty marker goes into
// /etc/berth-variant.
func buildLayer(busybox []byte, applets []string, marker string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(h *tar.Header) error {
		h.ModTime = epoch
		h.Format = tar.FormatPAX
		if h.Uname == "" && h.Uid == 0 {
			h.Uname, h.Gname = "root", "root"
		}
		return tw.WriteHeader(h)
	}
	dir := func(name string, mode int64, uid int) error {
		return hdr(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: uid, Gid: uid})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := hdr(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []struct {
		name string
		mode int64
		uid  int
	}{
		{"bin", 0o755, 0}, {"dev", 0o755, 0}, {"etc", 0o755, 0}, {"home", 0o755, 0},
		{"home/user", 0o755, UserID}, {"proc", 0o555, 0}, {"root", 0o700, 0},
		{"sys", 0o555, 0}, {"tmp", 0o1777, 0}, {"usr", 0o755, 0}, {"usr/bin", 0o755, 0},
		{"usr/sbin", 0o755, 0}, {"sbin", 0o755, 0}, {"var", 0o755, 0}, {"var/tmp", 0o1777, 0},
	} {
		if err := dir(d.name, d.mode, d.uid); err != nil {
			return nil, err
		}
	}
	if err := file("bin/busybox", 0o755, busybox); err != nil {
		return nil, err
	}
	for _, a := range applets {
		if err := hdr(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777}); err != nil {
			return nil, err
		}
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\nuser:x:%d:%d:user:/home/user:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n", UserID, UserID)
	group := fmt.Sprintf("root:x:0:\nuser:x:%d:\nnogroup:x:65534:\n", UserID)
	for _, f := range []struct{ name, data string }{
		{"etc/passwd", passwd},
		{"etc/group", group},
		{"etc/hostname", "berth-test\n"},
		{"etc/berth-variant", marker},
	} {
		if f.name == "etc/berth-variant" && marker == "" {
			continue
		}
		if err := file(f.name, 0o644, []byte(f.data)); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// buildArchive wraps the layer in the `docker save` format (internal/imagearchive).
func buildArchive(layer []byte, ref string) ([]byte, error) {
	a, err := imagearchive.Archive(ref, layer, imagearchive.Config{
		Cmd:       []string{"sh"},
		CreatedBy: "berth internal/testsupport/testimage: static busybox",
	})
	if err != nil {
		return nil, fmt.Errorf("test image: %w", err)
	}
	return a, nil
}
