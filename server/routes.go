package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/server/apiv1"
)

// Route is one operation the server answers: a method and a path in net/http's
// pattern syntax ("/v1/sessions/{name}/exec"; {name} is one path segment, percent-
// decoded).
type Route struct {
	Method string
	Path   string
}

// route is a Route with its handler.
type route struct {
	Route
	h func(s *Server, w http.ResponseWriter, r *http.Request)
}

// table is every route the server answers; Routes reports it and routes() serves it.
var table = []route{
	{Route{http.MethodGet, "/v1/health"}, (*Server).health},
	{Route{http.MethodGet, "/v1/sessions"}, (*Server).listSessions},
	{Route{http.MethodGet, "/v1/sessions/{name}"}, (*Server).getSession},
	{Route{http.MethodGet, "/v1/pools"}, (*Server).listPools},
	{Route{http.MethodDelete, "/v1/sessions/{name}"}, (*Server).removeSession},
	{Route{http.MethodPost, "/v1/sessions/{name}/exec"}, (*Server).exec},
	{Route{http.MethodPost, "/v1/sessions/{name}/close"}, (*Server).closeSession},
	{Route{http.MethodPost, "/v1/sessions/{name}/stop"}, (*Server).stopSession},
	{Route{http.MethodPost, "/v1/sessions/{name}/recreate"}, (*Server).recreateSession},
	{Route{http.MethodPost, "/v1/sessions/{name}/jobs"}, (*Server).startJob},
	{Route{http.MethodGet, "/v1/sessions/{name}/jobs"}, (*Server).listJobs},
	{Route{http.MethodGet, "/v1/sessions/{name}/jobs/{id}/logs"}, (*Server).jobLogs},
	{Route{http.MethodPost, "/v1/sessions/{name}/jobs/{id}/kill"}, (*Server).killJob},
	{Route{http.MethodGet, "/v1/sessions/{name}/archive"}, (*Server).getArchive},
	{Route{http.MethodPut, "/v1/sessions/{name}/archive"}, (*Server).putArchive},
	{Route{http.MethodGet, "/v1/sessions/{name}/files"}, (*Server).getFile},
	{Route{http.MethodPut, "/v1/sessions/{name}/files"}, (*Server).putFile},
	{Route{http.MethodGet, "/v1/sessions/{name}/tty"}, (*Server).tty},
	{Route{http.MethodPost, "/v1/prune"}, (*Server).prune},
	{Route{http.MethodGet, "/v1/drivers"}, (*Server).drivers},
	{Route{http.MethodGet, "/v1/config/explain"}, (*Server).explain},
	{Route{http.MethodPost, "/v1/config/check"}, (*Server).configCheck},
	{Route{http.MethodGet, "/metrics"}, (*Server).serveMetrics},
	{Route{http.MethodGet, "/v1/status"}, (*Server).status},
}

// Routes returns every route the server answers, sorted by path and method.
func Routes() []Route {
	out := make([]Route, 0, len(table))
	for _, rt := range table {
		out = append(out, rt.Route)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Path != out[j].Path {
			return out[i].Path < out[j].Path
		}
		return out[i].Method < out[j].Method
	})
	return out
}

// routes builds the handler: one mux pattern per path (so that a method the path
// does not serve gets a JSON 405 with Allow, not net/http's text), a JSON 404 for
// every other path, and around it the token check and the count of calls in flight.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	byPath := map[string][]route{}
	var paths []string
	for _, rt := range table {
		if byPath[rt.Path] == nil {
			paths = append(paths, rt.Path)
		}
		byPath[rt.Path] = append(byPath[rt.Path], rt)
	}
	for _, p := range paths {
		rts := byPath[p]
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			var allow []string
			for _, rt := range rts {
				if r.Method == rt.Method {
					rt.h(s, w, r)
					return
				}
				allow = append(allow, rt.Method)
			}
			w.Header().Set("Allow", strings.Join(allow, ", "))
			s.writeError(w, r, errorf(apiv1.KindMethod, "%s %s: method not allowed; this path takes %s", r.Method, r.URL.EscapedPath(), strings.Join(allow, ", ")), "")
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errorf("not_found", "no such API path: %s (see docs/api.md; every path starts with /v1/)", r.URL.EscapedPath()), "")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		r, entry := s.startAudit(r, start)
		defer func() {
			s.log.Debug("request", "method", r.Method, "path", r.URL.EscapedPath(), "status", sw.status, "duration", time.Since(start))
			s.endAudit(r, entry, sw.status, start)
		}()
		if !s.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="berth"`)
			// Close the connection after the answer: net/http would otherwise read
			// the unread request body first, and a streamed exec's body stays open
			// while its client waits for the answer (a deadlock until it ends).
			w.Header().Set("Connection", "close")
			s.writeError(sw, r, errorf(apiv1.KindUnauthorized, "this listener needs the header Authorization: Bearer TOKEN with the token of berth serve's --token-file"), "")
			return
		}
		if !s.enter() {
			w.Header().Set("Connection", "close")
			s.writeError(sw, r, errorf(apiv1.KindShuttingDown, "berth serve is shutting down; try again when it is back"), "")
			return
		}
		defer s.leave()
		if err := badSessionSegment(r); err != nil {
			w.Header().Set("Connection", "close") // the body is not read (see above)
			s.writeError(sw, r, err, "")
			return
		}
		mux.ServeHTTP(sw, r)
	})
}

// badSessionSegment returns the registry's error for a session path whose name is
// empty, "." or ".." (/v1/sessions//exec), nil for every other path. net/http's mux
// would answer such a path with a redirect to the cleaned one (307), which no client
// of a session's call means, and which a streamed exec's client cannot follow (its
// body is a stream): it hung there, while embedded berth refused the name at once.
func badSessionSegment(r *http.Request) error {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/v1/sessions/")
	if !ok {
		return nil
	}
	seg, _, _ := strings.Cut(rest, "/")
	if seg != "" && seg != "." && seg != ".." {
		return nil
	}
	if err := config.ValidateSession(seg); err != nil {
		return err
	}
	return nil
}

// statusWriter records the status of an answer for the request log. It passes
// Flush and the rest of ResponseController's calls on (Unwrap).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writeJSON answers with v as JSON and status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		b.Reset()
		fmt.Fprintf(&b, `{"error":{"kind":"internal","message":%q}}`+"\n", "encoding the answer: "+err.Error())
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// readJSON reads r's body, declared as application/json, within the server's size
// and time limits, into v, refusing unknown fields, trailing data and anything but
// one JSON object. Errors are the HTTP layer's (unsupported_media_type, too_large,
// request_timeout) or invalid, each saying what is wrong.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return errorf(apiv1.KindMediaType, "the request body must be JSON, sent with Content-Type: application/json (got %q)", r.Header.Get("Content-Type"))
	}
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(s.bodyTimeout))
	// No deadline once the body is in: net/http's read that notices a client going
	// away (which cancels the call) must not time out during a long exec.
	defer rc.SetReadDeadline(time.Time{})
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	var tooLarge *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &tooLarge):
		w.Header().Set("Connection", "close")
		return errorf(apiv1.KindTooLarge, "the request body is larger than the limit of %d bytes (berth serve --max-request-body); send large input another way", tooLarge.Limit)
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		w.Header().Set("Connection", "close")
		return errorf(apiv1.KindRequestTimeout, "the request body did not arrive within %v", s.bodyTimeout)
	case err != nil:
		return errorf("invalid", "reading the request body: %v", err)
	}
	if err := decodeStrict(data, v); err != nil {
		return errorf("invalid", "request body: %v", err)
	}
	return nil
}

// decodeStrict decodes data, one JSON object, into v, refusing unknown fields,
// trailing data and a second value; the error says what is wrong.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errors.New(jsonProblem(err))
	}
	if dec.More() {
		return errors.New("more than one JSON value; send one object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON object")
	}
	return nil
}

// jsonProblem says what is wrong with a body that did not decode.
func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("not valid JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return fmt.Sprintf("field %q: want %s, got JSON %s", typ.Field, typ.Type, typ.Value)
		}
		return fmt.Sprintf("want a JSON object, got JSON %s", typ.Value)
	case errors.Is(err, io.EOF):
		return "empty; send a JSON object"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "the JSON ends early"
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return "unknown field " + f + "; see docs/api.md for the fields it takes"
	}
	return msg
}
