package density

import (
	"os"
	"testing"
)

func TestReadProcSelf(t *testing.T) {
	p, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.PID != os.Getpid() || p.PPID != os.Getppid() || p.Threads < 1 || p.RSS <= 0 || p.Pss <= 0 || p.FDs < 3 {
		t.Errorf("ReadProc(self) = %+v", p)
	}
	if _, err := ReadProc(-1); err == nil {
		t.Error("ReadProc(-1) succeeded")
	}
	if a, err := MemAvailable(); err != nil || a <= 0 {
		t.Errorf("MemAvailable() = %d, %v", a, err)
	}
	if n := HostThreads(); n < p.Threads {
		t.Errorf("HostThreads() = %d, fewer than this process's %d", n, p.Threads)
	}
	if LoadAvg() == "" {
		t.Error("LoadAvg() is empty")
	}
}

func TestCgroupID(t *testing.T) {
	for path, want := range map[string]string{
		"/docker/0123abcd":                      "0123abcd",
		"/berth/sb-1":                           "sb-1",
		"/system.slice/docker-0123abcd.scope":   "0123abcd",
		"/kubepods/pod1/cri-containerd-x.scope": "x",
	} {
		if got := cgroupID(path); got != want {
			t.Errorf("cgroupID(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestNsPid(t *testing.T) {
	for status, want := range map[string]int{
		"Name:\tx\nNSpid:\t4242\t1\n": 1,
		"NSpid:\t4242\n":              4242,
		"Name:\tx\n":                  0,
	} {
		if got := nsPid([]byte(status)); got != want {
			t.Errorf("nsPid(%q) = %d, want %d", status, got, want)
		}
	}
}
