package cli

// Files and the TTY through a real `berth serve`: the API's routes (/archive, /files,
// /tty) and the CLI's client side of them (daemonClient: berth cp and berth shell
// through the daemon).

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/client"
	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/server/apiv1"
)

// api returns the CLI's client of d: over its unix socket, or its TCP listener
// with its token (and the TLS config of d's own client).
func (d *daemon) api() *daemonClient {
	d.t.Helper()
	addr, opts := d.sock, []client.Opt(nil)
	if addr == "" {
		addr = d.base
		if d.token != "" {
			opts = append(opts, client.WithToken(d.token))
		}
		if tr, ok := d.client.Transport.(*http.Transport); ok && tr.TLSClientConfig != nil {
			opts = append(opts, client.WithTLSConfig(tr.TLSClientConfig))
		}
	}
	c, err := client.New(addr, opts...)
	if err != nil {
		d.t.Fatal(err)
	}
	return &daemonClient{Client: c}
}

// sandboxDir returns the default directory of session's sandbox (creating it).
func (d *daemon) sandboxDir(session string) string {
	d.t.Helper()
	res := d.exec(session, `{"argv":["pwd"]}`)
	return strings.TrimSpace(res.Stdout)
}

// sampleTree makes a tree under dir/tree: files with modes 0750 and 0600, a
// directory 0700, a relative symlink, and a 1 MiB file that is a hole but for its
// last 5 bytes.
func sampleTree(t *testing.T, dir string) string {
	t.Helper()
	root := filepath.Join(dir, "tree")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "sub"), 0o755))
	must(os.WriteFile(filepath.Join(root, "run.sh"), []byte("#!/bin/sh\necho run\n"), 0o750))
	must(os.WriteFile(filepath.Join(root, "sub", "secret"), []byte("s3cret\n"), 0o600))
	must(os.Chmod(filepath.Join(root, "run.sh"), 0o750))
	must(os.Chmod(filepath.Join(root, "sub", "secret"), 0o600))
	must(os.Symlink("sub/secret", filepath.Join(root, "link")))
	f, err := os.Create(filepath.Join(root, "sparse"))
	must(err)
	_, err = f.WriteAt([]byte("tail\n"), 1<<20-5)
	must(err)
	must(f.Close())
	must(os.Chmod(filepath.Join(root, "sub"), 0o700))
	return root
}

// checkTree checks a copy of sampleTree at root.
func checkTree(t *testing.T, root string) {
	t.Helper()
	for name, want := range map[string]os.FileMode{"run.sh": 0o750, "sub/secret": 0o600, "sub": 0o700 | os.ModeDir, "sparse": 0o644} {
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "link")); err != nil || string(b) != "s3cret\n" {
		t.Errorf("link: %q %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(root, "link")); err != nil || l != "sub/secret" {
		t.Errorf("link is %q (%v), want a symlink to sub/secret", l, err)
	}
	fi, err := os.Stat(filepath.Join(root, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Size() != 1<<20 || st.Blocks*512 >= 1<<20 {
		t.Errorf("sparse: size %d, %d bytes allocated: want 1 MiB with a hole", fi.Size(), st.Blocks*512)
	}
	b, _ := os.ReadFile(filepath.Join(root, "sparse"))
	if !bytes.HasSuffix(b, []byte("tail\n")) || bytes.Count(b, []byte{0}) != 1<<20-5 {
		t.Errorf("sparse: wrong content")
	}
}

// An upload and a download through the daemon (the CLI's client, berth cp's rules)
// keep modes, symlinks and holes; in between the sandbox sees the tree.
func TestServeCopyRoundTrip(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	api := d.api()
	ctx := context.Background()
	src := sampleTree(t, e.dir)
	sbx := d.sandboxDir("files")
	if err := api.upload(ctx, "files", src, "up"); err != nil {
		t.Fatalf("upload: %v", err)
	}
	checkTree(t, filepath.Join(sbx, "up"))
	res := d.exec("files", `{"argv":["sh","-c","cat up/link; ./up/run.sh"]}`)
	if res.Stdout != "s3cret\nrun\n" {
		t.Errorf("the sandbox sees %+v", res)
	}
	out := filepath.Join(e.dir, "down")
	if err := api.download(ctx, "files", "up", out, false, -1); err != nil {
		t.Fatalf("download: %v", err)
	}
	checkTree(t, out)
	// Into an existing directory: the copy goes inside it under its own name.
	if err := api.download(ctx, "files", "up/sub/secret", out+"/", false, -1); err != nil {
		t.Fatalf("download into a directory: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "secret")); err != nil || string(b) != "s3cret\n" {
		t.Errorf("downloaded file: %q %v", b, err)
	}
	// Errors are the embedded ones, and leave nothing.
	err := copyDaemon(ctx, api, "files", "nothere", filepath.Join(e.dir, "x"), false, false, -1)
	var ee *execrun.ExitError
	if !errors.As(err, &ee) || ee.Code != execrun.ExitInternal || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "nothing was written") {
		t.Errorf("download of a missing path: %v, want exit 125 saying it does not exist and nothing was written", err)
	}
	if r := e.run("cp", "-s", "files", ":nothere", filepath.Join(e.dir, "x")); r.code != 125 || !strings.Contains(r.stderr, err.Error()) {
		t.Errorf("the embedded berth cp says otherwise:\n%v\nthrough the daemon: %v", r, err)
	}
	if err := api.download(ctx, "files", "up", filepath.Join(e.dir, "small"), false, 1000); err == nil || !strings.Contains(err.Error(), "limit of 1000 bytes") {
		t.Errorf("download over --max-size: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(e.dir, "small")); err == nil {
		t.Errorf("a refused download wrote its destination")
	}
	// curl: a raw tar each way.
	if curl, err := exec.LookPath("curl"); err == nil {
		tarFile := filepath.Join(e.dir, "up.tar")
		out, err := exec.Command(curl, "-sS", "--fail-with-body", "--unix-socket", d.sock, "-o", tarFile, "http://berth/v1/sessions/files/archive?path=up/sub").CombinedOutput()
		if err != nil {
			t.Fatalf("curl download: %v %s", err, out)
		}
		names := tarNames(t, tarFile)
		if strings.Join(names, ",") != "sub/,sub/secret" {
			t.Errorf("curl's tar holds %v", names)
		}
		out, err = exec.Command(curl, "-sS", "--fail-with-body", "--unix-socket", d.sock, "-T", tarFile, "http://berth/v1/sessions/files/archive?path=.").CombinedOutput()
		if err != nil || !strings.Contains(string(out), `"entries":2`) || !strings.Contains(string(out), `"bytes":7`) {
			t.Errorf("curl upload: %v %s", err, out)
		}
		if b, err := os.ReadFile(filepath.Join(sbx, "sub", "secret")); err != nil || string(b) != "s3cret\n" {
			t.Errorf("curl upload wrote %q %v", b, err)
		}
	}
}

// tarNames lists the entry names of the tar file.
func tarNames(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
}

// tarOfHeaders builds a tar stream of hdrs, each regular file with its Size of 'x' bytes.
func tarOfHeaders(hdrs ...*tar.Header) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		tw.WriteHeader(h)
		if h.Typeflag == tar.TypeReg {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	return b.Bytes()
}

// A hostile upload is refused whole, wherever its bad entry is: nothing is written,
// the error names the entry; over max_size is 413.
func TestServeUploadHostile(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	sbx := d.sandboxDir("up")
	good := &tar.Header{Typeflag: tar.TypeReg, Name: "good", Mode: 0o644, Size: 3}
	for _, c := range []struct {
		name   string
		bad    *tar.Header
		query  string
		status int
		kind   string
		msg    string
	}{
		{"hardlink", &tar.Header{Typeflag: tar.TypeLink, Name: "hl", Linkname: "/etc/passwd"}, "", 400, "invalid", "hl: refused: a hard link"},
		{"fifo", &tar.Header{Typeflag: tar.TypeFifo, Name: "fifo", Mode: 0o644}, "", 400, "invalid", "fifo: refused: a FIFO"},
		{"device", &tar.Header{Typeflag: tar.TypeChar, Name: "null", Mode: 0o644, Devmajor: 1, Devminor: 3}, "", 400, "invalid", "null: refused: a device"},
		{"escape", &tar.Header{Typeflag: tar.TypeReg, Name: "../../escape", Mode: 0o644, Size: 1}, "", 400, "invalid", "leaves the destination"},
		{"too-large", &tar.Header{Typeflag: tar.TypeReg, Name: "big", Mode: 0o644, Size: 100}, "&max_size=64", 413, "too_large", "limit of 64 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := tarOfHeaders(good, c.bad)
			status, b := d.call("PUT", "/v1/sessions/up/archive?path=."+c.query, string(body))
			wantError(t, c.name, status, b, c.status, c.kind, c.msg, "nothing was written")
			ents, _ := os.ReadDir(sbx)
			for _, ent := range ents {
				if ent.Name() == "good" || ent.Name() == "fifo" || ent.Name() == "hl" {
					t.Errorf("a refused upload wrote %s", ent.Name())
				}
			}
		})
	}
	// A sparse entry, as GNU tar writes one (archive/tar writes none), after a good file.
	sp := filepath.Join(e.dir, "sp")
	os.Mkdir(sp, 0o755)
	os.WriteFile(filepath.Join(sp, "good"), []byte("abc"), 0o644)
	f, _ := os.Create(filepath.Join(sp, "sparse"))
	f.WriteAt([]byte("x"), 1<<20)
	f.Close()
	for _, format := range []string{"posix", "gnu"} {
		out, err := exec.Command("tar", "-S", "--format="+format, "-cf", "-", "-C", sp, "good", "sparse").Output()
		if err != nil {
			t.Fatalf("GNU tar: %v", err)
		}
		status, b := d.call("PUT", "/v1/sessions/up/archive?path=.", string(out))
		wantError(t, "sparse "+format, status, b, 400, "invalid", "sparse: refused: a sparse file", "nothing was written")
		if _, err := os.Lstat(filepath.Join(sbx, "good")); err == nil {
			t.Errorf("a refused sparse upload wrote good")
		}
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(filepath.Dir(sbx)), "escape")); err == nil {
		t.Errorf("the escaping entry was written")
	}
	status, b := d.call("PUT", "/v1/sessions/up/archive?path=.", "this is no tar stream, and longer than a block? no")
	wantError(t, "not a tar", status, b, 400, "invalid", "reading the tar stream")
	status, b = d.call("PUT", "/v1/sessions/up/archive", string(tarOfHeaders(good)))
	wantError(t, "no path", status, b, 400, "invalid", "query parameter path")
	status, b = d.call("PUT", "/v1/sessions/up/archive?path=nodir", string(tarOfHeaders(good)))
	wantError(t, "missing dir", status, b, 404, "not_found", "does not exist")
	// The spool is unlinked: nothing is left in STATE/tmp.
	ents, _ := os.ReadDir(filepath.Join(e.state, "tmp"))
	for _, ent := range ents {
		if strings.HasPrefix(ent.Name(), ".upload-") {
			t.Errorf("left in the state dir: %s", ent.Name())
		}
	}
}

// A download from a sandbox that holds what berth cp refuses (a FIFO; an absolute
// symlink) is refused on the client, naming the entry, and its destination is left
// as it was.
func TestServeDownloadHostile(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	api := d.api()
	d.exec("dl", `{"argv":["sh","-c","mkdir -p a b && echo ok > a/file && mkfifo a/zfifo && echo ok > b/file && ln -s /etc/passwd b/zpasswd"]}`)
	for _, c := range []struct{ src, msg string }{{"a", "a/zfifo: refused: a FIFO"}, {"b", "b/zpasswd: refused: a symlink to /etc/passwd: its target is absolute"}} {
		dst := filepath.Join(e.dir, "dst-"+c.src)
		os.Mkdir(dst, 0o755)
		err := api.download(context.Background(), "dl", c.src, dst+"/", false, -1)
		if err == nil || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), "nothing was written") {
			t.Errorf("download of %s: %v, want %q", c.src, err, c.msg)
		}
		if ents, _ := os.ReadDir(dst); len(ents) != 0 {
			t.Errorf("download of %s left %v", c.src, ents)
		}
	}
}

// /files: a small file's bytes each way, with its mode; a directory or symlink is
// 400, a file or body over 16 MiB 413, a missing file 404.
func TestServeFiles(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	sbx := d.sandboxDir("f")
	content := "line 1\n\x00binary\xff\n"
	if status, b := d.call("PUT", "/v1/sessions/f/files?path=notes.txt&mode=0640", content, "Content-Type", "text/plain"); status != http.StatusNoContent {
		t.Fatalf("PUT: %d %s", status, b)
	}
	if fi, err := os.Stat(filepath.Join(sbx, "notes.txt")); err != nil || fi.Mode() != 0o640 {
		t.Errorf("written file: %v %v", fi.Mode(), err)
	}
	resp, err := d.do(context.Background(), "GET", "/v1/sessions/f/files?path="+url.QueryEscape(filepath.Join(sbx, "notes.txt")), "")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != content || resp.Header.Get(apiv1.ModeHeader) != "0640" || resp.Header.Get("Last-Modified") == "" || resp.ContentLength != int64(len(content)) {
		t.Errorf("GET: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	// Replacing a symlink replaces it, never writes through it.
	os.WriteFile(filepath.Join(e.dir, "outside"), []byte("keep"), 0o644)
	os.Symlink(filepath.Join(e.dir, "outside"), filepath.Join(sbx, "ln"))
	if status, b := d.call("PUT", "/v1/sessions/f/files?path=ln", "new"); status != http.StatusNoContent {
		t.Errorf("PUT over a symlink: %d %s", status, b)
	}
	if b, _ := os.ReadFile(filepath.Join(e.dir, "outside")); string(b) != "keep" {
		t.Errorf("PUT wrote through a symlink: %q", b)
	}
	d.exec("f", `{"argv":["sh","-c","mkdir -p dir && ln -s notes.txt link && truncate -s 17M big"]}`)
	for _, c := range []struct {
		path   string
		status int
		kind   string
		msg    string
	}{
		{"dir", 400, "invalid", "is a directory"},
		{"link", 400, "invalid", `is a symlink (to "notes.txt")`},
		{"big", 413, "too_large", "16 MiB"},
		{"missing", 404, "not_found", "does not exist"},
	} {
		status, b := d.call("GET", "/v1/sessions/f/files?path="+c.path, "")
		wantError(t, "GET "+c.path, status, b, c.status, c.kind, c.msg)
	}
	big := strings.Repeat("y", apiv1.MaxFileBytes+1)
	status, b := d.call("PUT", "/v1/sessions/f/files?path=toobig", big)
	wantError(t, "PUT over 16 MiB", status, b, 413, "too_large", "16 MiB")
	// Chunked (no Content-Length): refused once the body passes the cap.
	req, _ := http.NewRequest("PUT", d.base+"/v1/sessions/f/files?path=toobig", io.MultiReader(strings.NewReader(big)))
	req.ContentLength = -1
	resp, err = d.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	wantError(t, "chunked PUT over 16 MiB", resp.StatusCode, b, 413, "too_large")
	if _, err := os.Lstat(filepath.Join(sbx, "toobig")); err == nil {
		t.Errorf("a refused PUT wrote its file")
	}
	for q, msg := range map[string]string{"path=x&mode=999": "octal", "path=dir/": "names no file", "mode=0644": "query parameter path"} {
		status, b := d.call("PUT", "/v1/sessions/f/files?"+q, "x")
		wantError(t, "PUT "+q, status, b, 400, "invalid", msg)
	}
}

// A TTY over the WebSocket: sh with a terminal of the asked size, input, a resize
// applied in order with the input, SIGINT to the command, and the exit code.
func TestServeTTY(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	ctx := context.Background()
	// The signal interrupts the read builtin, which runs the trap at once (a sleep
	// would race: a signal before it starts leaves the trap waiting for its end).
	script := `stty size; read go; stty size; trap 'echo got-INT; exit 7' INT; echo ready; read never; echo not-interrupted`
	tc, started, err := d.api().openTTY(ctx, "tty", ttyOptions{argv: []string{"sh", "-c", script}, size: backend.WindowSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	if started.Session != "tty" || started.Driver != "local" || started.Sandbox == "" {
		t.Errorf("started %+v", started)
	}
	var out testwait.Buffer
	type result struct {
		res apiv1.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := tc.wait(&out)
		done <- result{res, err}
	}()
	out.WaitFor(t, "24 80")
	if err := tc.resize(backend.WindowSize{Rows: 50, Cols: 132}); err != nil {
		t.Fatal(err)
	}
	tc.Write([]byte("go\n"))
	out.WaitFor(t, "ready")
	if !strings.Contains(out.String(), "50 132") {
		t.Errorf("stty size after the resize: %q", out.String())
	}
	if err := tc.signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.res.ExitCode != 7 || !strings.Contains(out.String(), "got-INT") || strings.Contains(out.String(), "not-interrupted") {
		t.Errorf("result %+v %v; output %q", r.res, r.err, out.String())
	}
}

// A TTY client that goes away kills the command's tree; a client that breaks the
// protocol gets an error message and the tree is killed too; the upgrade's
// parameters are checked before it.
func TestServeTTYDisconnect(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	ctx := context.Background()
	for _, how := range []string{"close", "bad-message"} {
		t.Run(how, func(t *testing.T) {
			mark := newMark()
			tc, _, err := d.api().openTTY(ctx, "tty", ttyOptions{argv: []string{"sh", "-c", "sleep 300 & sleep 300"}, env: []string{markEnv(mark)}})
			if err != nil {
				t.Fatal(err)
			}
			testwait.Until(t, "both sleeps of the TTY", func() bool { return len(marked(mark)) >= 2 })
			if how == "close" {
				tc.close()
			} else {
				tc.conn.Write(ctx, websocket.MessageText, []byte(`{"type":"launch"}`))
				_, err := tc.wait(io.Discard)
				var de *client.APIError
				if !errors.As(err, &de) || de.Info.Kind != "invalid" || !strings.Contains(de.Info.Message, `"launch"`) {
					t.Errorf("after a bad message: %v", err)
				}
			}
			testwait.Until(t, "the TTY's tree to die after the client went away", func() bool { return len(marked(mark)) == 0 })
		})
	}
	for q, msg := range map[string]string{"rows=0": "rows", "argv=": "empty program name", "bogus=1": "unknown query parameter"} {
		status, b := d.call("GET", "/v1/sessions/tty/tty?"+q, "")
		wantError(t, "tty?"+q, status, b, 400, "invalid", msg)
	}
	status, b := d.call("GET", "/v1/sessions/tty/tty", "")
	wantError(t, "no upgrade", status, b, 400, "invalid", "takes a WebSocket")
	// A web page's request (an Origin that is not the Host) is refused.
	_, resp, err := websocket.Dial(ctx, "ws://berth/v1/sessions/tty/tty", &websocket.DialOptions{HTTPClient: d.client, HTTPHeader: http.Header{"Origin": {"http://evil.example"}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin upgrade: %v %v", resp, err)
	}
	if status, _ := d.call("GET", "/v1/health", ""); status != http.StatusOK {
		t.Errorf("health after: %d", status)
	}
}

// berth shell's client (daemonClient.shell) runs the login shell through the daemon
// and returns its exit code; a TCP listener's TTY needs the token.
func TestServeShellClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tokenFile, token := e.tokenFile()
	d := e.serve("--listen", "tcp://127.0.0.1:0", "--token-file", tokenFile)
	api := d.api()
	if _, _, err := api.openTTY(context.Background(), "main", ttyOptions{}); err == nil || !strings.Contains(err.Error(), "Authorization: Bearer") {
		t.Errorf("a TTY without the token: %v", err)
	}
	d.token = token
	api = d.api()
	var out testwait.Buffer
	noSignals := make(chan os.Signal)
	res, err := api.shell(context.Background(), "main", false, strings.NewReader("echo via-$((40+2)); exit 5\n"), &out,
		backend.WindowSize{Rows: 30, Cols: 100}, func() (backend.WindowSize, bool) { return backend.WindowSize{}, false }, noSignals, noSignals,
		func() (func(), error) { return func() {}, nil })
	if err != nil || res.ExitCode != 5 || !strings.Contains(out.String(), "via-42") {
		t.Errorf("shell: %+v %v; output %q", res, err, out.String())
	}
	// Without a terminal on stdin (this test's), berth shell through the daemon
	// refuses as the embedded one does, before it dials.
	err = runShellDaemon(context.Background(), api, "main", false)
	var ee *execrun.ExitError
	if !errors.As(err, &ee) || ee.Code != execrun.ExitInternal || !strings.Contains(err.Error(), "needs a terminal on stdin") {
		t.Errorf("shell without a terminal: %v", err)
	}
}

// Files and the TTY on docker: a tree's round trip and stty size in a container.
func TestServeFilesDocker(t *testing.T) {
	e, d := serveDocker(t)
	api := d.api()
	ctx := context.Background()
	if err := api.upload(ctx, "c", sampleTree(t, e.dir), "/tmp/up"); err != nil {
		t.Fatalf("upload: %v", err)
	}
	res := d.exec("c", `{"argv":["sh","-c","cat /tmp/up/link; stat -c %a /tmp/up/run.sh /tmp/up/sub"]}`)
	if res.Stdout != "s3cret\n750\n700\n" || res.Driver != "docker" {
		t.Errorf("in the container: %+v", res)
	}
	out := filepath.Join(e.dir, "down")
	if err := api.download(ctx, "c", "/tmp/up", out, false, -1); err != nil {
		t.Fatalf("download: %v", err)
	}
	checkTree(t, out)
	tc, _, err := api.openTTY(ctx, "c", ttyOptions{argv: []string{"stty", "size"}, size: backend.WindowSize{Rows: 33, Cols: 99}})
	if err != nil {
		t.Fatal(err)
	}
	var tout testwait.Buffer
	r, err := tc.wait(&tout)
	if err != nil || r.ExitCode != 0 || strings.TrimSpace(tout.String()) != "33 99" {
		t.Errorf("stty size in a container: %+v %v %q", r, err, tout.String())
	}
}

// BenchmarkServeCopy measures copying one 100 MB file (random bytes) into and out of
// a warm local session through berth serve (the CLI's client: PUT and GET /archive,
// extracted on the client) and with the whole embedded `berth cp`, interleaved; p50
// and p95 in ms.
//
//	go test ./cli -run '^$' -bench ServeCopy -benchtime 10x
func BenchmarkServeCopy(b *testing.B) {
	environ, _, sock := benchServe(b, "")
	c, err := client.New(sock)
	if err != nil {
		b.Fatal(err)
	}
	api := &daemonClient{Client: c}
	dir := b.TempDir()
	src := filepath.Join(dir, "big")
	data := make([]byte, 100_000_000)
	for i := range data {
		data[i] = byte(i*7 + i>>9)
	}
	if err := os.WriteFile(src, data, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli(environ, "rm", "bench").Run() })
	ctx := context.Background()
	if err := api.upload(ctx, "bench", src, "big"); err != nil {
		b.Fatal(err)
	}
	n := 0
	fresh := func() string { n++; return filepath.Join(dir, fmt.Sprintf("out%d", n)) }
	run := func(args ...string) error {
		if out, err := cli(environ, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %v: %s", args, err, out)
		}
		return nil
	}
	rmOut := func(err error, p string) error { os.Remove(p); return err }
	start := time.Now()
	benchutil.Interleave(b, []benchutil.Way{
		{Name: "serve-upload", Run: func() error { return api.upload(ctx, "bench", src, "big") }},
		{Name: "cli-upload", Run: func() error { return run("cp", "-s", "bench", src, ":big") }},
		{Name: "serve-download", Run: func() error { p := fresh(); return rmOut(api.download(ctx, "bench", "big", p, false, -1), p) }},
		{Name: "cli-download", Run: func() error {
			p := fresh()
			return rmOut(run("cp", "-s", "bench", ":big", p, "--max-size", "unlimited"), p)
		}},
	})
	b.Logf("%v", time.Since(start))
}

// pyFilesClient is a standard-library Python client of the files routes: it writes
// and reads one file, uploads a tar stream built by tarfile, and downloads it again,
// printing what it got as JSON.
const pyFilesClient = `
import http.client, io, json, socket, sys, tarfile

class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("berth")
        self.path = path
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)

def call(method, url, body=None):
    c = UnixConnection(sys.argv[1])
    c.request(method, url, body=body)
    r = c.getresponse()
    return r.status, r.getheader("X-Berth-Mode"), r.read()

out = {}
out["put"] = call("PUT", "/v1/sessions/py%3A1/files?path=hello.txt&mode=0600", b"hi from python\n")[0]
status, mode, body = call("GET", "/v1/sessions/py%3A1/files?path=hello.txt")
out["get"] = [status, mode, body.decode()]
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w") as tf:
    info = tarfile.TarInfo("pkg/run.sh"); data = b"echo run\n"; info.size = len(data); info.mode = 0o755
    tf.addfile(info, io.BytesIO(data))
status, _, body = call("PUT", "/v1/sessions/py%3A1/archive?path=.", buf.getvalue())
out["upload"] = [status, json.loads(body)]
status, _, body = call("GET", "/v1/sessions/py%3A1/archive?path=pkg")
with tarfile.open(fileobj=io.BytesIO(body)) as tf:
    out["download"] = [status, sorted(m.name for m in tf.getmembers()), oct(tf.getmember("pkg/run.sh").mode)]
status, _, body = call("GET", "/v1/sessions/py%3A1/files?path=nothere")
out["missing"] = [status, json.loads(body)["error"]["kind"]]
print(json.dumps(out))
`

// A standard-library Python client uses the files routes.
func TestServeFilesPython(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 in PATH: TestServeFiles covers the same routes from Go")
	}
	e := newEnv(t)
	d := e.serve()
	out, err := exec.Command(py, "-c", pyFilesClient, d.sock).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	want := `{"put": 204, "get": [200, "0600", "hi from python\n"], "upload": [200, {"entries": 1, "bytes": 9}], "download": [200, ["pkg", "pkg/run.sh"], "0o755"], "missing": [404, "not_found"]}`
	if strings.TrimSpace(string(out)) != want {
		t.Errorf("python client printed\n%s\nwant\n%s", out, want)
	}
}

// A TTY that outlives the daemon's shutdown grace is killed like any call: the
// client gets the result (143) and the tree is gone when berth serve has exited.
func TestServeTTYShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve("--shutdown-grace", "1s")
	mark := newMark()
	tc, _, err := d.api().openTTY(context.Background(), "main", ttyOptions{argv: []string{"sh", "-c", "echo started; sleep 300 & sleep 300"}, env: []string{markEnv(mark)}})
	if err != nil {
		t.Fatal(err)
	}
	var out testwait.Buffer
	done := make(chan apiv1.ExecResult, 1)
	go func() {
		res, err := tc.wait(&out)
		if err != nil {
			t.Errorf("TTY: %v", err)
		}
		done <- res
	}()
	out.WaitFor(t, "started")
	testwait.Until(t, "both sleeps of the TTY", func() bool { return len(marked(mark)) >= 2 })
	d.cmd.Process.Signal(syscall.SIGTERM)
	if res := <-done; res.ExitCode != 143 {
		t.Errorf("the TTY's result after the grace: %+v", res)
	}
	if code := d.wait(); code != 0 {
		t.Errorf("berth serve exited %d\n%s", code, d.stderr)
	}
	if left := marked(mark); len(left) > 0 {
		t.Errorf("the TTY's tree survives the shutdown:\n%s", describe(left))
	}
}

// The embedded berth shell on local in a pseudo-terminal (its terminal handling is
// shared with the daemon's client): the shell's output and exit code.
func TestShellEmbeddedPTY(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	out, code := runShellPTY(t, e, "main", "echo shell-$((6*7)); exit 3\n")
	if code != 3 || !strings.Contains(out, "shell-42") {
		t.Errorf("berth shell: exit %d, output %q; want exit 3 and shell-42", code, out)
	}
}

// Copies are streamed: a 128 MiB upload and its download through the daemon grow
// its peak memory by a few MiB, not by the copy's size (the upload's spool is a
// file; the download is passed on as it comes).
func TestServeCopyMemory(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	api := d.api()
	ctx := context.Background()
	src := filepath.Join(e.dir, "big")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB, no zero blocks
	for range 128 {
		f.Write(chunk)
	}
	f.Close()
	d.exec("mem", `{"argv":["true"]}`) // the sandbox exists: measure only the copies
	before := vmHWM(t, d.cmd.Process.Pid)
	if err := api.upload(ctx, "mem", src, "big"); err != nil {
		t.Fatal(err)
	}
	if err := api.download(ctx, "mem", "big", filepath.Join(e.dir, "back"), false, -1); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(e.dir, "back")); err != nil || fi.Size() != 128<<20 {
		t.Fatalf("downloaded %v %v", fi, err)
	}
	grew := vmHWM(t, d.cmd.Process.Pid) - before
	t.Logf("the daemon's peak RSS grew by %d KiB during a 128 MiB upload and download", grew>>10)
	if grew > 32<<20 {
		t.Errorf("the daemon's peak memory grew by %d MiB during a 128 MiB upload and download", grew>>20)
	}
}

// An upload whose body stops arriving (a pause of --request-timeout) is 408 with
// nothing written, however long the body said it would be; the daemon stays up.
func TestServeUploadStalls(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve("--request-timeout", "1s")
	sbx := d.sandboxDir("slow")
	good := tarOfHeaders(&tar.Header{Typeflag: tar.TypeReg, Name: "first", Mode: 0o644, Size: 3}, &tar.Header{Typeflag: tar.TypeReg, Name: "second", Mode: 0o644, Size: 1 << 20})
	for _, route := range []string{"archive?path=.", "files?path=stalled"} {
		conn, err := dialUnix(context.Background(), d.sock)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "PUT /v1/sessions/slow/%s HTTP/1.1\r\nHost: berth\r\nContent-Length: %d\r\n\r\n", route, len(good))
		conn.Write(good[:2048]) // the first file whole, then the body stalls
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: no answer to a stalled body: %v", route, err)
		}
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		wantError(t, route+" stalled", resp.StatusCode, b, 408, apiv1.KindRequestTimeout, "no data for 1s")
	}
	for _, n := range []string{"first", "second", "stalled"} {
		if _, err := os.Lstat(filepath.Join(sbx, n)); err == nil {
			t.Errorf("a stalled upload wrote %s", n)
		}
	}
	if status, b := d.call("GET", "/v1/health", ""); status != http.StatusOK {
		t.Fatalf("health after stalled uploads: %d %s", status, b)
	}
}

// With berth serve running, the berth cp and berth shell commands go through it
// (its log says so) with the embedded results: the tree both ways, a refused hostile
// download naming the entry, the shell's output and exit code.
func TestServeCLICopyAndShell(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	src := sampleTree(t, e.dir)
	if r := e.run("cp", "-s", "cli", src, ":up"); r.code != 0 || r.stderr != "" {
		t.Fatalf("cp upload: %v", r)
	}
	// berth serve logs an upload before it answers, but its stderr reaches this
	// process through a pipe that a goroutine copies: wait for the line.
	d.waitLog("upload", 1)
	out := filepath.Join(e.dir, "down")
	if r := e.run("cp", "-s", "cli", ":up", out); r.code != 0 || r.stderr != "" {
		t.Fatalf("cp download: %v", r)
	}
	checkTree(t, out)
	d.exec("cli", `{"argv":["sh","-c","mkdir -p bad && mkfifo bad/fifo"]}`)
	r := e.run("cp", "-s", "cli", ":bad", filepath.Join(e.dir, "bad"))
	if r.code != 125 || !strings.Contains(r.stderr, "bad/fifo: refused: a FIFO") || !strings.Contains(r.stderr, "nothing was written") {
		t.Errorf("cp of a FIFO through the daemon: %v", r)
	}
	if r := e.run("cp", "--no-daemon", "-s", "cli", ":bad", filepath.Join(e.dir, "bad")); r.code != 125 || !strings.Contains(r.stderr, "bad/fifo: refused: a FIFO") {
		t.Errorf("the same cp embedded: %v", r)
	}
	outp, code := runShellPTY(t, e, "cli", "echo shell-$((6*7)); exit 3\n")
	if code != 3 || !strings.Contains(outp, "shell-42") {
		t.Errorf("berth shell through the daemon: exit %d, output %q; want exit 3 and shell-42", code, outp)
	}
	// berth serve logs a TTY's end before it sends the result (the line is copied
	// from its stderr pipe after that: wait for it).
	if l := d.waitLog("tty", 1); l["exit_code"] != float64(3) {
		t.Errorf("the shell through berth serve's TTY: logged %v; want exit_code 3\n%s", l, d.stderr)
	}
}
