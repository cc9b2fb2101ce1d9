// Package k8stest connects tests to the Kubernetes cluster that scripts/kubernetes.sh
// starts: it reads the cluster's export lines from the environment (FromEnv), runs a
// test binary inside the cluster's network namespace (Main), and skips or fails a test
// when there is no cluster (Require): under CI (CI=true) a missing cluster fails the
// test, elsewhere it skips with StartHint.
//
// The cluster's API server, kubelet and Pods are reachable only inside the network
// namespace the script creates (BERTH_K8S_NETNS). setns(2) moves one thread only, and
// client-go dials from any goroutine's thread, so the whole test process must start
// inside it: Main re-executes the test binary under `nsenter --net=/run/netns/NAME`
// (never `ip netns exec`, which remounts /sys). A package whose tests use the cluster
// calls it from its TestMain:
//
//	func TestMain(m *testing.M) { k8stest.Main(m) }
package k8stest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// StartHint is what tests print when no cluster is there.
const StartHint = `start one with: eval "$(sudo scripts/kubernetes.sh)" (it prints KUBECONFIG, BERTH_K8S_NETNS and the other BERTH_K8S_ variables), then run the tests as root`

// The environment variables scripts/kubernetes.sh prints, and inEnv, which Main sets
// in the re-executed process.
const (
	EnvNetns      = "BERTH_K8S_NETNS"
	EnvKubeconfig = "KUBECONFIG"
	inEnv         = "BERTH_K8S_IN_NETNS"
)

// Cluster is a running cluster of scripts/kubernetes.sh, as its export lines describe
// it.
type Cluster struct {
	// Kubeconfig is the kubeconfig of the ServiceAccount berth, which holds only the
	// Role of docs/kubernetes-rbac.yaml in Namespace (KUBECONFIG).
	Kubeconfig string
	// AdminKubeconfig is the cluster admin's (system:masters) kubeconfig, for what a
	// test checks behind berth's back (BERTH_K8S_ADMIN_KUBECONFIG).
	AdminKubeconfig string
	// Netns is the network namespace the cluster lives in, /run/netns/Netns
	// (BERTH_K8S_NETNS).
	Netns string
	// Namespace is the Kubernetes namespace for the tests' objects
	// (BERTH_K8S_NAMESPACE).
	Namespace string
	// StorageClass provisions a host-directory volume per claim and deletes it with
	// the claim (BERTH_K8S_STORAGE_CLASS).
	StorageClass string
	// TestImage is internal/testsupport/testimage's busybox image and AgentImage the image of
	// `berth image agent`, both present on the node for imagePullPolicy Never
	// (BERTH_K8S_TEST_IMAGE, BERTH_K8S_AGENT_IMAGE).
	TestImage, AgentImage string
	// ContainerdAddress is the socket of the node's containerd, whose k8s.io namespace
	// holds the Pods' images: a test imports its own there (BERTH_K8S_CONTAINERD_ADDRESS).
	ContainerdAddress string
	// Kubectl is the kubectl of the cluster's version (BERTH_K8S_KUBECTL).
	Kubectl string
}

// FromEnv returns the cluster the environment describes, and false when
// BERTH_K8S_NETNS or KUBECONFIG is unset (no cluster).
func FromEnv() (Cluster, bool) {
	c := Cluster{
		Kubeconfig:        os.Getenv(EnvKubeconfig),
		AdminKubeconfig:   os.Getenv("BERTH_K8S_ADMIN_KUBECONFIG"),
		Netns:             os.Getenv(EnvNetns),
		Namespace:         os.Getenv("BERTH_K8S_NAMESPACE"),
		StorageClass:      os.Getenv("BERTH_K8S_STORAGE_CLASS"),
		TestImage:         os.Getenv("BERTH_K8S_TEST_IMAGE"),
		AgentImage:        os.Getenv("BERTH_K8S_AGENT_IMAGE"),
		ContainerdAddress: os.Getenv("BERTH_K8S_CONTAINERD_ADDRESS"),
		Kubectl:           os.Getenv("BERTH_K8S_KUBECTL"),
	}
	return c, c.Netns != "" && c.Kubeconfig != ""
}

// NetnsPath is the file of the network namespace named name, as `ip netns add`
// makes it.
func NetnsPath(name string) string { return "/run/netns/" + name }

// InNetns reports whether this process's network namespace is the one named name:
// /proc/self/ns/net and NetnsPath(name) are the same namespace (device and inode).
// Errors: the namespace file cannot be read (no such namespace).
func InNetns(name string) (bool, error) {
	var self, want syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &self); err != nil {
		return false, fmt.Errorf("network namespace of this process: %w", err)
	}
	if err := syscall.Stat(NetnsPath(name), &want); err != nil {
		return false, fmt.Errorf("network namespace %s (%s): %w", name, NetnsPath(name), err)
	}
	return self.Dev == want.Dev && self.Ino == want.Ino, nil
}

// Main runs m's tests inside the cluster's network namespace and exits with their
// status. When BERTH_K8S_NETNS names a namespace that exists, this process is not in
// it and it runs as root, Main replaces the process (execve, same pid, arguments and
// environment) with `nsenter --net=/run/netns/NAME -- TESTBINARY ARGS...`. Otherwise
// (no cluster, not root, already inside) it runs m here, and Require reports why a
// test cannot use the cluster.
func Main(m interface{ Run() int }) {
	if name := os.Getenv(EnvNetns); name != "" && os.Getenv(inEnv) == "" && os.Geteuid() == 0 {
		if in, err := InNetns(name); err == nil && !in {
			if err := reexec(name); err != nil {
				fmt.Fprintf(os.Stderr, "k8stest: entering network namespace %s: %v\n", name, err)
				os.Exit(1)
			}
		}
	}
	raiseParallel()
	os.Exit(m.Run())
}

// Parallel is how many parallel tests (t.Parallel) Main lets run at once unless
// -test.parallel is given. Tests against the cluster spend their time waiting for
// its node to start Pods and attach volumes, not on this machine's CPUs, which go
// test's default (GOMAXPROCS) counts: with it, the conformance suites' cases waited
// for each other through most of the kubernetes package's 17 minutes.
const Parallel = 6

// raiseParallel sets -test.parallel to Parallel when the command line did not set it.
func raiseParallel() {
	if !flag.Parsed() {
		flag.Parse()
	}
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given && flag.Lookup("test.parallel") != nil {
		flag.Set("test.parallel", strconv.Itoa(Parallel))
	}
}

// reexec replaces this process with itself run by nsenter in the namespace name;
// it returns only on failure.
func reexec(name string) error {
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return fmt.Errorf("%w (Debian: apt-get install util-linux)", err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	argv := append([]string{nsenter, "--net=" + NetnsPath(name), "--", self}, os.Args[1:]...)
	return syscall.Exec(nsenter, argv, append(os.Environ(), inEnv+"=1"))
}

// Require returns the cluster of the environment when a test can use it: it is
// described, this process is inside its network namespace (see Main) and its API
// server answers /readyz within a minute. Otherwise it fails t under CI (CI=true) and
// skips it elsewhere, saying why and StartHint.
func Require(t testing.TB) Cluster {
	t.Helper()
	c, ok := FromEnv()
	msg := ""
	switch in, err := InNetns(c.Netns); {
	case !ok:
		msg = EnvNetns + " or " + EnvKubeconfig + " is not set"
	case err != nil:
		msg = err.Error() + " (is the cluster running?)"
	case !in:
		msg = "this test process is not in the network namespace " + c.Netns + ": run the tests as root, and call k8stest.Main from the package's TestMain"
	default:
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, c.Kubectl, "--kubeconfig", c.Kubeconfig, "get", "--raw", "/readyz").CombinedOutput()
		if err == nil {
			return c
		}
		msg = fmt.Sprintf("the API server does not answer (%s get --raw /readyz: %v: %s)", c.Kubectl, err, strings.TrimSpace(string(out)))
	}
	msg = "no Kubernetes cluster: " + msg + "; " + StartHint
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return c
}

// KubectlAs runs the cluster's kubectl with kubeconfig (c.Kubeconfig or
// c.AdminKubeconfig) in c.Namespace and returns its standard output; a failure is an
// error holding its standard error. stdin, when not "", is its input.
func (c Cluster) KubectlAs(ctx context.Context, kubeconfig, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.Kubectl, append([]string{"--kubeconfig", kubeconfig, "-n", c.Namespace}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
