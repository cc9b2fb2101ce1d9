package docker_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/docker"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
)

// A Create whose context is cancelled while the engine makes the container (the
// engine finishes it; the answer never reaches the driver) leaves no container: the
// engine is reached through a proxy that passes the create on, lets the test cancel
// once the engine has answered, and never answers the driver. Before, the container
// was left, created and unrecorded, under the sandbox's name.
func TestCreateCancelledAfterTheEngineMadeIt(t *testing.T) {
	host := engine(t)
	sock, ok := strings.CutPrefix(host, "unix://")
	if !ok {
		t.Skipf("the engine is at %s; this test proxies a unix socket", host)
	}
	made := make(chan struct{}, 1)
	proxyPath := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", proxyPath)
	if err != nil {
		t.Fatal(err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.Out.URL.Scheme, r.Out.URL.Host = "http", "docker" },
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}},
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/containers/create") {
			rp.ServeHTTP(httptest.NewRecorder(), r.Clone(context.WithoutCancel(r.Context())))
			made <- struct{}{}
			<-r.Context().Done() // the driver gave up: it never hears back
			return
		}
		rp.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	opts := options(t.TempDir())
	name := conformance.SandboxName()
	files, err := conformance.DefaultPrepareAgent(berthBin)(opts.StateDir, name)
	if err != nil {
		t.Fatal(err)
	}
	direct := docker.New(docker.WithHost(host))
	t.Cleanup(func() {
		direct.Remove(context.Background(), name)
		direct.Close()
	})
	d := docker.New(docker.WithHost("unix://" + proxyPath))
	t.Cleanup(func() { d.Close() })
	if err := d.Configure(t.Context(), backend.DriverSetup{StateDir: filepath.Join(opts.StateDir, "drivers", "docker"), Owner: opts.Owner}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		select {
		case <-made:
			cancel()
		case <-ctx.Done():
		}
	}()
	spec := backend.SandboxSpec{Name: name, Image: testimage.Ref, Labels: map[string]string{backend.LabelOwner: opts.Owner}}
	if _, err := d.Create(ctx, backend.CreateRequest{Spec: spec, Agent: files}); err == nil {
		t.Fatal("Create answered although its create request never was")
	}
	if sb, err := direct.Inspect(t.Context(), name); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("after the cancelled Create the engine holds %s: %+v %v", name, sb, err)
	}
}
