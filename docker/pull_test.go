package docker_test

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/docker"
	"github.com/berth-sh/berth/internal/testsupport/testregistry"
)

// holds reports whether the engine at host holds ref.
func holds(t *testing.T, host, ref string) bool {
	t.Helper()
	api, err := client.NewClientWithOpts(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	_, err = api.ImageInspect(context.Background(), ref)
	return err == nil
}

// noDockerConfig points DOCKER_CONFIG at an empty directory for the test.
func noDockerConfig(t *testing.T) string {
	dir := t.TempDir()
	t.Setenv("DOCKER_CONFIG", dir)
	return dir
}

func TestPullPolicies(t *testing.T) {
	host := engine(t)
	noDockerConfig(t)
	reg := testregistry.Start(t, testregistry.Options{})
	ref := reg.Push(t, host, "berth-test/pulled:1")
	d := docker.New(docker.WithHost(host))
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var events []backend.PullProgress
	record := func(p backend.PullProgress) { events = append(events, p) }

	err := d.PullImage(ctx, ref, backend.PullNever, record)
	if !errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), `pull = "never"`) {
		t.Fatalf("pull never of an absent image: %v, want ErrNotFound naming the policy", err)
	}
	if len(events) != 0 || holds(t, host, ref) {
		t.Fatalf("pull never pulled: events %v", events)
	}

	if err := d.PullImage(ctx, ref, backend.PullMissing, record); err != nil {
		t.Fatalf("pull missing: %v", err)
	}
	if !holds(t, host, ref) {
		t.Fatalf("after pull missing the engine does not hold %s", ref)
	}
	sawLayer, sawBytes := false, false
	for _, e := range events {
		sawLayer = sawLayer || e.Layer != "" && e.Status == "Pull complete"
		sawBytes = sawBytes || e.Layer != "" && e.Total > 0 && e.Current > 0
	}
	if !sawLayer || !sawBytes {
		t.Fatalf("pull events %+v: want a layer with byte counts and a \"Pull complete\"", events)
	}

	events = nil
	if err := d.PullImage(ctx, ref, backend.PullMissing, record); err != nil || len(events) != 0 {
		t.Fatalf("pull missing of a present image: %v, events %v; want no pull", err, events)
	}
	if err := d.PullImage(ctx, ref, backend.PullNever, record); err != nil || len(events) != 0 {
		t.Fatalf("pull never of a present image: %v, events %v", err, events)
	}
	if err := d.PullImage(ctx, ref, backend.PullAlways, record); err != nil || len(events) == 0 {
		t.Fatalf("pull always of a present image: %v, events %v; want the registry asked again", err, events)
	}
}

func TestPullBadInput(t *testing.T) {
	host := engine(t)
	noDockerConfig(t)
	reg := testregistry.Start(t, testregistry.Options{})
	d := docker.New(docker.WithHost(host))
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	missing := reg.Addr + "/berth-test/nothing:1"
	err := d.PullImage(ctx, missing, backend.PullMissing, nil)
	if !errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), missing) {
		t.Errorf("pulling an image the registry lacks: %v, want ErrNotFound naming it", err)
	}
	if holds(t, host, missing) {
		t.Errorf("a failed pull left %s in the engine", missing)
	}
	down := "127.0.0.1:1/berth-test/busybox:1"
	if err := d.PullImage(ctx, down, backend.PullMissing, nil); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("pulling from a registry that does not answer: %v, want an error naming it", err)
	}
	if err := d.PullImage(ctx, "Not A Ref", backend.PullMissing, nil); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("bad reference: %v, want ErrInvalid", err)
	}
	if err := d.PullImage(ctx, missing, "sometimes", nil); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "sometimes") {
		t.Errorf("bad policy: %v, want ErrInvalid naming it", err)
	}
}

func TestPullCredentialsFromDockerConfig(t *testing.T) {
	host := engine(t)
	cfgDir := noDockerConfig(t)
	reg := testregistry.Start(t, testregistry.Options{Auth: true})
	ref := reg.Push(t, host, "berth-test/private:1")
	d := docker.New(docker.WithHost(host))
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	err := d.PullImage(ctx, ref, backend.PullMissing, nil)
	if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "docker login "+reg.Addr) {
		t.Fatalf("pull without credentials: %v, want ErrInvalid that says docker login %s", err, reg.Addr)
	}
	if holds(t, host, ref) {
		t.Fatalf("a refused pull left %s in the engine", ref)
	}

	auth := base64.StdEncoding.EncodeToString([]byte(reg.User + ":" + reg.Password))
	cfg := `{"auths": {"` + reg.Addr + `": {"auth": "` + auth + `"}}}`
	if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.PullImage(ctx, ref, backend.PullMissing, nil); err != nil {
		t.Fatalf("pull with credentials in DOCKER_CONFIG: %v", err)
	}
	if !holds(t, host, ref) {
		t.Fatalf("after the pull the engine does not hold %s", ref)
	}
}
