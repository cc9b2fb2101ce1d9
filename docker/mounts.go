package docker

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/containerutil"
)

// checkMount applies the host-path policy (containerutil.CheckMount) to a mount of
// the sandbox whose agent files are a: unless allowHost, neither /, nor a unix
// socket, nor a directory holding a runtime socket (containerutil.RuntimeSockets with
// the engine's socket and the containerd socket that the engine runs on), nor one
// that is, contains or lies inside a berth directory (containerutil.BerthDirs).
func (d *Driver) checkMount(m backend.Mount, allowHost bool, a backend.AgentFiles) error {
	if allowHost {
		return containerutil.CheckMount(m, true, nil, nil)
	}
	var inUse []containerutil.Socket
	if p, err := checkHost(d.engineHost()); err == nil {
		inUse = append(inUse, containerutil.Socket{Path: p, What: "Docker socket"})
		for _, c := range engineContainerd(p) {
			inUse = append(inUse, containerutil.Socket{Path: c, What: "containerd socket (the Docker engine's)"})
		}
	}
	d.mu.Lock()
	stateDir := d.stateDir
	d.mu.Unlock()
	return containerutil.CheckMount(m, false, containerutil.RuntimeSockets(inUse...), containerutil.BerthDirs(stateDir, a))
}

// engineContainerd returns where the containerd of the engine listening on sock may
// be: the engine's --containerd (flag or daemon.json "containerd") when it has one,
// else /run/containerd/containerd.sock (covered anyway) and the one dockerd starts for
// itself under its exec root (--exec-root or daemon.json "exec-root", default
// /var/run/docker). The engine's process is found by the socket's peer credentials;
// when it cannot be found or read, nil.
func engineContainerd(sock string) []string {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return nil
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return nil
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil || cred.Pid <= 0 {
		return nil
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(cred.Pid)) + "/cmdline")
	if err != nil {
		return nil
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	flag := func(name string) string {
		for i, a := range args {
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
			if a == name && i+1 < len(args) {
				return args[i+1]
			}
		}
		return ""
	}
	containerd, execRoot := flag("--containerd"), flag("--exec-root")
	cfgFile := flag("--config-file")
	if cfgFile == "" {
		cfgFile = "/etc/docker/daemon.json"
	}
	if b, err := os.ReadFile(cfgFile); err == nil {
		var cfg struct {
			Containerd string `json:"containerd"`
			ExecRoot   string `json:"exec-root"`
		}
		if json.Unmarshal(b, &cfg) == nil {
			if containerd == "" {
				containerd = cfg.Containerd
			}
			if execRoot == "" {
				execRoot = cfg.ExecRoot
			}
		}
	}
	if containerd = strings.TrimPrefix(containerd, "unix://"); filepath.IsAbs(containerd) {
		return []string{filepath.Clean(containerd)}
	}
	if !filepath.IsAbs(execRoot) {
		execRoot = "/var/run/docker"
	}
	return []string{filepath.Join(execRoot, "containerd", "containerd.sock")}
}
