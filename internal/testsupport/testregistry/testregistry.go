// Package testregistry runs Debian's image registry (the docker-registry package, the
// CNCF distribution registry) on 127.0.0.1 for pull tests: a private process per test
// with its storage in the test's temp dir, optionally behind htpasswd basic auth.
// Nothing outside loopback is reached.
package testregistry

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/registry"
	"github.com/docker/docker/client"
	"golang.org/x/crypto/bcrypt"

	"github.com/berth-sh/berth/internal/testsupport/testimage"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// Binary is where Debian's docker-registry package installs the registry; the
// environment variable BERTH_TEST_REGISTRY overrides it.
const Binary = "/usr/bin/docker-registry"

// InstallHint is what tests print when the registry binary is missing.
const InstallHint = "install it with: sudo apt-get install docker-registry (sudo scripts/runtimes.sh does)"

// Registry is a running registry. Addr is "127.0.0.1:PORT"; User and Password are
// the basic-auth credentials it requires, or empty when it requires none.
type Registry struct {
	Addr     string
	User     string
	Password string
}

// Options configure Start.
type Options struct {
	// Auth makes the registry require basic auth as User "berth", Password "s3cret".
	Auth bool
}

// Start starts a registry on a free loopback port and waits (up to 30 s) until GET /v2/
// answers. It stops the registry when the test ends. A missing binary fails the test
// under CI (CI=true) and skips it elsewhere, with InstallHint.
func Start(t testing.TB, opts Options) *Registry {
	t.Helper()
	bin := os.Getenv("BERTH_TEST_REGISTRY")
	if bin == "" {
		bin = Binary
	}
	if _, err := os.Stat(bin); err != nil {
		msg := "no image registry binary at " + bin + "; " + InstallHint
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	r := &Registry{}
	auth := ""
	if opts.Auth {
		r.User, r.Password = "berth", "s3cret"
		hash, err := bcrypt.GenerateFromPassword([]byte(r.Password), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		htpasswd := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(htpasswd, []byte(r.User+":"+string(hash)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: berth-test\n    path: %s\n", htpasswd)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		cfg := filepath.Join(dir, "config.yml")
		body := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n%s",
			filepath.Join(dir, "data"), addr, auth)
		if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		var log bytes.Buffer
		cmd := exec.Command(bin, "serve", cfg)
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting %s: %v", bin, err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		if err := waitUp(addr, exited); err != nil {
			cmd.Process.Kill()
			<-exited
			lastErr = fmt.Errorf("%v; its log:\n%s", err, log.String())
			continue
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-exited
		})
		r.Addr = addr
		return r
	}
	t.Fatalf("the image registry did not come up: %v", lastErr)
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitUp polls GET http://addr/v2/ until it answers 200 or 401, the process exits, or
// testwait.Limit passes.
func waitUp(addr string, exited <-chan error) error {
	deadline := time.Now().Add(testwait.Limit)
	hc := &http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return nil
			}
			err = fmt.Errorf("GET /v2/ answered %s", resp.Status)
		}
		select {
		case e := <-exited:
			return fmt.Errorf("the registry exited: %v", e)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer on %s within %v: %v", addr, testwait.Limit, err)
		}
	}
}

// Push puts a variant of berth's test image (testimage.Variant) with a layer of its own
// into the registry as repo (NAME:TAG) through the Docker Engine at host (unix://...),
// then removes it from the engine with that layer, so that a pull has every byte to
// fetch. It returns "Addr/repo". Failures end the test.
func (reg *Registry) Push(t testing.TB, host, repo string) string {
	t.Helper()
	ref := reg.Addr + "/" + repo
	archive, err := testimage.Variant(ref, fmt.Sprintf("%s %d", t.Name(), time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	api, err := client.NewClientWithOpts(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := api.ImageLoad(ctx, bytes.NewReader(archive), client.ImageLoadWithQuiet(true))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	auth, err := registry.EncodeAuthConfig(registry.AuthConfig{Username: reg.User, Password: reg.Password, ServerAddress: reg.Addr})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := api.ImagePush(ctx, ref, image.PushOptions{RegistryAuth: auth})
	if err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	dec := json.NewDecoder(rc)
	for {
		var m struct {
			Error string `json:"error"`
		}
		if err := dec.Decode(&m); err != nil {
			break
		}
		if m.Error != "" {
			rc.Close()
			t.Fatalf("pushing %s: %s", ref, m.Error)
		}
	}
	rc.Close()
	untag(t, api, ref)
	t.Cleanup(func() {
		api, err := client.NewClientWithOpts(client.WithHost(host), client.WithAPIVersionNegotiation())
		if err == nil {
			untag(t, api, ref)
			api.Close()
		}
	})
	return ref
}

// untag removes ref from the engine, with its layers when no other image uses them.
func untag(t testing.TB, api *client.Client, ref string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := api.ImageRemove(ctx, ref, image.RemoveOptions{PruneChildren: true}); err != nil && !strings.Contains(err.Error(), "No such image") {
		t.Errorf("untagging %s: %v", ref, err)
	}
}
