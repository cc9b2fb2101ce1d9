package server

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"
)

// FuzzExecRequest feeds any body to the exec handler's decoding and checks
// (readJSON, then ExecRequest.check): it never panics; a refusal is an error of the
// HTTP layer, invalid (or too_large past the limit), with a printable message; an
// accepted body is exactly one of a plain exec and a shell-mode command, with
// environment entries NAME=VALUE (NAME non-empty, without '='), no NUL anywhere, no
// negative cap and no timeout below zero.
func FuzzExecRequest(f *testing.F) {
	for _, seed := range []string{
		`{"argv":["sh","-c","echo hi; exit 3"]}`,
		`{"command":"cd /tmp && export X=1","env":{"A":"b"},"cwd":"/","timeout":"30s","max_output":0}`,
		`{"argv":["cat"],"stdin":"x","stdin_base64":"eA=="}`,
		`{"argv":["cat"],"stdin_base64":"AAEC/w==","recreate":true,"user":"1000"}`,
		`{"argv":["true"],"argz":1}`, `{"argv":"true"}`, `{"argv":["true"]} {}`, `{}`, ``, `[`,
		`{"argv":["tr\u0000ue"]}`, `{"argv":["true"],"env":{"A=B":"c"}}`, `{"argv":["true"],"timeout":"-1s"}`,
		`{"argv":[""],"max_output":-1}`, `{"command":"   "}`, `{"command":"x","user":"root"}`,
	} {
		f.Add([]byte(seed))
	}
	s := New(nil, WithMaxRequestBody(4096))
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "http://berth/v1/sessions/s/exec", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		var req ExecRequest
		err := s.readJSON(httptest.NewRecorder(), r, &req)
		var c *execCall
		if err == nil {
			c, err = checkExec(&req)
		}
		if err != nil {
			var he *httpError
			if !errors.As(err, &he) || (he.kind != "invalid" && he.kind != KindTooLarge) {
				t.Fatalf("refusal %v (%T) is not invalid or too_large", err, err)
			}
			if he.kind == KindTooLarge && len(body) <= 4096 {
				t.Fatalf("a %d-byte body refused as too large", len(body))
			}
			for _, r := range err.Error() {
				if !unicode.IsPrint(r) {
					t.Fatalf("refusal %q holds %U", err, r)
				}
			}
			return
		}
		if (len(c.argv) > 0) == c.shell || (c.shell && strings.TrimSpace(c.command) == "") || (!c.shell && c.argv[0] == "") {
			t.Fatalf("accepted %q as %+v: want exactly one of argv and a command", body, c)
		}
		for _, kv := range c.env {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
				t.Fatalf("accepted env entry %q", kv)
			}
		}
		for _, v := range append(append(append([]string{}, c.argv...), c.env...), c.command, c.cwd, c.user) {
			if strings.ContainsRune(v, 0) {
				t.Fatalf("accepted a NUL in %q", v)
			}
		}
		if c.timeout < 0 || (c.max != nil && *c.max < 0) || (c.shell && c.user != "") {
			t.Fatalf("accepted %+v", c)
		}
	})
}
