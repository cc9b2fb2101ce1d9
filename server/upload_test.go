package server

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// tarOf is a tar stream of headers; a regular file's body is as many x as its size.
func tarOf(t *testing.T, hdrs ...*tar.Header) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

// do sends a request to ts and returns its status and body.
func do(t *testing.T, ts *httptest.Server, method, path string, body io.Reader) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, ts.URL+path, body)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// An upload's answer counts only what was written: a "." directory entry (the
// destination itself) is not counted, a file named "." is refused, and an upload that
// the agent refuses halfway (a write through a link out of the destination) leaves
// nothing behind, the link included, and puts back what it replaced.
func TestUploadAnswersWhatWasWritten(t *testing.T) {
	ts := inProcess(t)
	if status, b := do(t, ts, "PUT", "/v1/sessions/s/files?path=keep", strings.NewReader("old")); status != 204 {
		t.Fatalf("writing keep: %d %s", status, b)
	}
	status, b := do(t, ts, "PUT", "/v1/sessions/s/archive?path=.", tarOf(t,
		&tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755},
		&tar.Header{Typeflag: tar.TypeReg, Name: "./a", Mode: 0o644, Size: 1}))
	if status != 200 || b != `{"entries":1,"bytes":1}`+"\n" {
		t.Errorf("./ and ./a: %d %s, want 200 and one entry of one byte", status, b)
	}
	status, b = do(t, ts, "PUT", "/v1/sessions/s/archive?path=.", tarOf(t, &tar.Header{Typeflag: tar.TypeReg, Name: ".", Mode: 0o644, Size: 1}))
	if status != 400 || !strings.Contains(b, "named . would be the destination directory itself") || !strings.Contains(b, "nothing was written") {
		t.Errorf("a file named .: %d %s, want 400 naming why", status, b)
	}
	status, b = do(t, ts, "PUT", "/v1/sessions/s/archive?path=.", tarOf(t,
		&tar.Header{Typeflag: tar.TypeReg, Name: "keep", Mode: 0o644, Size: 3},
		&tar.Header{Typeflag: tar.TypeReg, Name: "new", Mode: 0o644, Size: 1},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "esc", Linkname: "/etc"},
		&tar.Header{Typeflag: tar.TypeReg, Name: "esc/berth-upload-test", Mode: 0o644, Size: 1}))
	if status != 400 || !strings.Contains(b, "esc/berth-upload-test") {
		t.Errorf("a write through a link out: %d %s, want 400 naming the entry", status, b)
	}
	for _, p := range []string{"esc", "new"} {
		if status, b := do(t, ts, "GET", "/v1/sessions/s/archive?path="+p, nil); status != 404 {
			t.Errorf("%s after the refused upload: %d %.200s, want 404", p, status, b)
		}
	}
	if status, b := do(t, ts, "GET", "/v1/sessions/s/files?path=keep", nil); status != 200 || b != "old" {
		t.Errorf("keep after the refused upload: %d %q, want old", status, b)
	}
}
