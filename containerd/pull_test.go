package containerd_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/core/remotes/docker"

	"golang.org/x/crypto/bcrypt"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// Basic-auth credentials of startRegistry with auth.
const (
	registryUser     = "berth"
	registryPassword = "s3cret"
)

// startRegistry starts Debian's docker-registry on a free port of 127.0.0.1 and
// returns its host:port; it is stopped when t ends. With auth it requires basic auth
// as registryUser, registryPassword. Without the binary the test is skipped (failed
// under CI=true).
func startRegistry(t *testing.T, auth bool) string {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		msg := "no docker-registry binary (Debian: apt-get install docker-registry) to serve the pull test"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), host)
	if auth {
		hash, err := bcrypt.GenerateFromPassword([]byte(registryPassword), bcrypt.DefaultCost)
		if err != nil {
			t.Fatal(err)
		}
		htpasswd := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(htpasswd, []byte(registryUser+":"+string(hash)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg += fmt.Sprintf("auth:\n  htpasswd:\n    realm: berth-test\n    path: %s\n", htpasswd)
	}
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", cfgPath)
	logf, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		logf.Close()
	})
	deadline := time.Now().Add(testwait.Limit)
	for {
		resp, err := http.Get("http://" + host + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || auth && resp.StatusCode == http.StatusUnauthorized {
				return host
			}
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("docker-registry exited: %v\n%s", err, log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("docker-registry on %s did not answer within %v\n%s", host, testwait.Limit, log)
		}
	}
}

// TestPullImage pushes the test image to a registry on 127.0.0.1 (plain HTTP) and
// pulls it through the driver with each policy, checking the progress events.
func TestPullImage(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		host := startRegistry(t, false)
		ref := host + "/berth-test/busybox:1"
		// Push the imported test image to the registry with the client itself.
		img, err := f.cli.GetImage(f.ctx, "docker.io/"+testimage.Ref)
		if err != nil {
			t.Fatal(err)
		}
		resolver := docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(docker.MatchLocalhost))})
		if err := f.cli.Push(f.ctx, ref, img.Target(), client.WithResolver(resolver)); err != nil {
			t.Fatalf("pushing the test image to %s: %v", host, err)
		}
		t.Cleanup(func() { f.cli.ImageService().Delete(context.WithoutCancel(f.ctx), ref) })

		type rec struct {
			mu     sync.Mutex
			events []backend.PullProgress
		}
		pull := func(policy backend.PullPolicy) ([]backend.PullProgress, error) {
			var r rec
			err := f.d.PullImage(f.ctx, ref, policy, func(p backend.PullProgress) {
				r.mu.Lock()
				r.events = append(r.events, p)
				r.mu.Unlock()
			})
			return r.events, err
		}
		statuses := func(ev []backend.PullProgress) []string {
			var s []string
			for _, e := range ev {
				s = append(s, e.Status)
			}
			return s
		}

		if _, err := pull(backend.PullNever); !errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), "never") {
			t.Errorf("policy never, image missing: %v, want ErrNotFound naming the policy", err)
		}
		ev, err := pull(backend.PullMissing)
		if err != nil {
			t.Fatalf("policy missing, image missing: %v", err)
		}
		complete := slices.IndexFunc(ev, func(e backend.PullProgress) bool {
			return e.Status == "Pull complete" && e.Layer != "" && e.Total > 0 && e.Current == e.Total
		})
		if len(ev) == 0 || !strings.HasPrefix(ev[0].Status, "Resolving") || complete < 0 {
			t.Errorf("progress of a pull: %v, want Resolving first and a layer's Pull complete", statuses(ev))
		}
		if _, err := f.cli.GetImage(f.ctx, ref); err != nil {
			t.Errorf("after the pull the image is not there: %v", err)
		}
		ev, err = pull(backend.PullMissing)
		if err != nil || len(ev) != 0 {
			t.Errorf("policy missing, image present: %v %v, want no pull and no events", statuses(ev), err)
		}
		ev, err = pull(backend.PullNever)
		if err != nil || len(ev) != 0 {
			t.Errorf("policy never, image present: %v %v, want no pull and no events", statuses(ev), err)
		}
		ev, err = pull(backend.PullAlways)
		if err != nil || !slices.Contains(statuses(ev), "Pull complete") {
			t.Errorf("policy always, image present: %v %v, want a pull", statuses(ev), err)
		}
		// A sandbox runs from the pulled image.
		name := "bconf-pulled-" + strings.ReplaceAll(strings.Split(host, ":")[1], ".", "")
		req := f.request(name)
		req.Spec.Image = ref
		if _, err := f.d.Create(f.ctx, req); err != nil {
			t.Fatalf("Create from the pulled image: %v", err)
		}
		if got := f.run(name, "echo", "pulled"); got != "pulled\n" {
			t.Errorf("exec in a sandbox of the pulled image: %q", got)
		}
		missing := host + "/berth-test/busybox:no-such-tag"
		if err := f.d.PullImage(f.ctx, missing, backend.PullMissing, nil); !errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), host) {
			t.Errorf("pull of a tag the registry lacks: %v, want ErrNotFound naming %s", err, host)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closed := l.Addr().String()
		l.Close() // nothing listens there now
		if err := f.d.PullImage(f.ctx, closed+"/x/y:1", backend.PullAlways, nil); !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), closed) {
			t.Errorf("pull from a registry that does not answer: %v, want ErrUnavailable naming %s", err, closed)
		}
		if err := f.d.PullImage(f.ctx, ref, "sometimes", nil); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("policy sometimes: %v, want ErrInvalid", err)
		}
	})
}

// An OCI layout archive (no manifest.json), as `ctr images export` writes it, imports
// under its full name and is reported as Docker writes it; an archive that is not one
// is ErrInvalid.
func TestImportOCILayout(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		var buf bytes.Buffer
		if err := f.cli.Export(f.ctx, &buf, archive.WithImage(f.cli.ImageService(), "docker.io/"+testimage.Ref), archive.WithSkipDockerManifest()); err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			names[h.Name] = true
		}
		if !names["index.json"] || !names["oci-layout"] || names["manifest.json"] {
			t.Fatalf("the export is not a bare OCI layout: %v", names)
		}
		refs, err := f.d.ImportImage(f.ctx, &buf)
		if err != nil || !slices.Equal(refs, []string{testimage.Ref}) {
			t.Errorf("ImportImage of an OCI layout: %v %v, want [%s]", refs, err, testimage.Ref)
		}
		if _, err := f.d.ImportImage(f.ctx, strings.NewReader("not a tar archive")); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("ImportImage of garbage: %v, want ErrInvalid", err)
		}
	})
}

// With a registry that requires basic auth, PullImage sends the credentials of the
// Docker config file ($DOCKER_CONFIG/config.json, as `docker login` writes it); without
// them the pull is ErrInvalid saying how to log in.
func TestPullWithCredentials(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		host := startRegistry(t, true)
		ref := host + "/berth-test/busybox:1"
		img, err := f.cli.GetImage(f.ctx, "docker.io/"+testimage.Ref)
		if err != nil {
			t.Fatal(err)
		}
		creds := docker.WithAuthCreds(func(string) (string, string, error) { return registryUser, registryPassword, nil })
		resolver := docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(
			docker.WithPlainHTTP(docker.MatchLocalhost), docker.WithAuthorizer(docker.NewDockerAuthorizer(creds)))})
		if err := f.cli.Push(f.ctx, ref, img.Target(), client.WithResolver(resolver)); err != nil {
			t.Fatalf("pushing the test image to %s: %v", host, err)
		}
		t.Cleanup(func() { f.cli.ImageService().Delete(context.WithoutCancel(f.ctx), ref) })

		cfgDir := t.TempDir()
		t.Setenv("DOCKER_CONFIG", cfgDir)
		write := func(auths string) {
			if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte(`{"auths":{`+auths+`}}`), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write(``)
		err = f.d.PullImage(f.ctx, ref, backend.PullAlways, nil)
		if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "docker login "+host) {
			t.Errorf("pull without credentials: %v, want ErrInvalid saying docker login %s", err, host)
		}
		write(fmt.Sprintf(`%q:{"auth":%q}`, host, base64.StdEncoding.EncodeToString([]byte(registryUser+":"+registryPassword))))
		if err := f.d.PullImage(f.ctx, ref, backend.PullAlways, nil); err != nil {
			t.Errorf("pull with the Docker config file's credentials: %v", err)
		}
		if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte("{not json"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := f.d.PullImage(f.ctx, ref, backend.PullAlways, nil); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), cfgDir) {
			t.Errorf("pull with a broken Docker config file: %v, want ErrInvalid naming %s", err, cfgDir)
		}
	})
}
