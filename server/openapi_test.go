package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/local"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

// openAPI is the part of docs/openapi.yaml that the checks read.
type openAPI struct {
	OpenAPI    string                    `yaml:"openapi"`
	Paths      map[string]map[string]any `yaml:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]struct {
				Enum []string `yaml:"enum"`
			} `yaml:"properties"`
		} `yaml:"schemas"`
	} `yaml:"components"`
}

func loadOpenAPI(t *testing.T) openAPI {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPI
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("docs/openapi.yaml: openapi %q, want 3.1.0", doc.OpenAPI)
	}
	return doc
}

// documented returns the document's operations as "METHOD PATH", sorted.
func (doc openAPI) documented() []string {
	var out []string
	for path, item := range doc.Paths {
		for key := range item {
			switch key {
			case "get", "put", "post", "delete", "patch", "head", "options", "trace":
				out = append(out, strings.ToUpper(key)+" "+path)
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestOpenAPIRoutes checks docs/openapi.yaml against the server both ways: every
// route the server serves is documented, and every documented operation is served
// (asked of the real handler, it is answered by a route, not as an unknown path or
// method); the error kinds documented are server.Kinds.
func TestOpenAPIRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	var served []string
	for _, r := range Routes() {
		served = append(served, r.Method+" "+r.Path)
	}
	sort.Strings(served)
	documented := doc.documented()
	for _, r := range served {
		if !slices.Contains(documented, r) {
			t.Errorf("served but not in docs/openapi.yaml: %s", r)
		}
	}
	for _, r := range documented {
		if !slices.Contains(served, r) {
			t.Errorf("in docs/openapi.yaml but not served: %s", r)
		}
	}

	// Ask the handler itself for every documented operation.
	reg, err := registry.Open(context.Background(), nil, registry.WithStateDir(t.TempDir()),
		registry.WithDriver(local.Name, func() backend.TerminalBackend { return local.New() }))
	if err != nil {
		t.Fatal(err)
	}
	s := New(reg)
	defer s.Shutdown(context.Background())
	for _, op := range documented {
		method, path, _ := strings.Cut(op, " ")
		req := httptest.NewRequest(method, "http://berth"+strings.ReplaceAll(path, "{name}", "t:1"), nil)
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, req)
		var eb apiv1.ErrorBody
		json.Unmarshal(w.Body.Bytes(), &eb)
		if w.Code == http.StatusMethodNotAllowed || (w.Code == http.StatusNotFound && strings.Contains(eb.Error.Message, "no such API path")) {
			t.Errorf("%s: the handler does not serve it: %d %s", op, w.Code, w.Body)
		}
	}
	// And a path that is not documented is not served.
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, httptest.NewRequest("GET", "http://berth/v1/nothing", nil))
	if w.Code != http.StatusNotFound {
		t.Errorf("GET /v1/nothing: %d %s", w.Code, w.Body)
	}

	var kinds []string
	for _, k := range Kinds {
		kinds = append(kinds, k.Name)
	}
	if got := doc.Components.Schemas["ErrorInfo"].Properties["kind"].Enum; !slices.Equal(got, kinds) {
		t.Errorf("docs/openapi.yaml's ErrorInfo kinds %v, want server.Kinds %v", got, kinds)
	}
}

// TestEmptySessionSegment: a session path whose name is empty, "." or ".." is
// refused as the registry refuses the name (400, kind invalid, the rule named), not
// redirected to a cleaned path, which a streamed exec's client cannot follow.
func TestEmptySessionSegment(t *testing.T) {
	s := New(nil)
	for _, seg := range []string{"", ".", ".."} {
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, httptest.NewRequest("POST", "http://berth/v1/sessions/"+seg+"/exec", strings.NewReader(`{"argv":["true"]}`)))
		var eb apiv1.ErrorBody
		json.Unmarshal(w.Body.Bytes(), &eb)
		if w.Code != http.StatusBadRequest || eb.Error.Kind != "invalid" || !strings.Contains(eb.Error.Message, "session name") {
			t.Errorf("POST /v1/sessions/%s/exec: %d %s, want 400 invalid naming the session name", seg, w.Code, w.Body)
		}
	}
}
