package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/berth-sh/berth"

// group is a set of the module's packages (paths relative to the module; "x/..."
// is x and everything under it) and the groups their non-test code may import.
type group struct {
	name    string
	members []string
	imports []string // group names; a group imports itself only when listed
}

// groups is the layering rule, lowest first. Arrows point one way:
// cmd → cli → server → registry → backends → backend ← drivers → agent, with config,
// the API's wire types and internal's leaves at the bottom. Test support (and the
// conformance suite, which is a test suite that berth's CLI can run) is the only
// code that imports test support; the CLI imports only the suite's test image.
var groups = []group{
	{"backend", []string{"backend"}, nil},
	{"leaf", []string{"internal/filehash", "internal/flock", "internal/hostpaths", "internal/imagearchive", "internal/output", "internal/phase", "internal/rpcerr", "internal/sigstart/...", "internal/layering"}, []string{"backend", "leaf"}},
	// The one catalog of built-in drivers and the discovery of berth-driver-NAME
	// executables: data and files, no plugin code, so config reads it.
	{"catalog", []string{"backends/catalog"}, []string{"backend", "leaf"}},
	{"config", []string{"config/..."}, []string{"backend", "leaf", "catalog", "config"}},
	{"wire", []string{"server/apiv1"}, []string{"backend"}},
	{"agent", []string{"agent", "agent/internal/..."}, []string{"backend", "leaf", "agent"}},
	{"backends", []string{"backends/..."}, []string{"backend", "leaf", "catalog", "backends"}},
	{"driver-shared", []string{"internal/containerutil"}, []string{"backend", "leaf", "agent"}},
	// Each driver registers its constructor in the catalog (catalog.Register).
	{"driver", []string{"local", "docker", "containerd", "kubernetes"}, []string{"backend", "leaf", "catalog", "agent", "driver-shared"}},
	{"registry", []string{"registry/..."}, []string{"backend", "leaf", "config", "agent", "catalog", "backends"}},
	// The test image the conformance suite runs in: `berth conformance` imports it too.
	{"suite-image", []string{"internal/testsupport/testimage"}, []string{"backend", "leaf"}},
	{"conformance", []string{"conformance/..."}, []string{"backend", "leaf", "config", "agent", "registry", "suite-image", "testsupport"}},
	{"server", []string{"server", "server/apiconv"}, []string{"backend", "leaf", "config", "wire", "agent", "catalog", "backends", "registry", "server"}},
	{"client", []string{"client"}, []string{"backend", "leaf", "wire"}},
	{"cli", []string{"cli/..."}, []string{"backend", "leaf", "config", "wire", "agent", "catalog", "backends", "driver", "registry", "conformance", "suite-image", "server", "client", "cli"}},
	{"cmd", []string{"cmd/..."}, []string{"backend", "leaf", "config", "wire", "agent", "catalog", "backends", "driver-shared", "driver", "registry", "conformance", "server", "client", "cli"}},
	{"testsupport", []string{"internal/testsupport/...", "agent/agenttest"}, []string{"backend", "leaf", "config", "wire", "agent", "catalog", "backends", "driver-shared", "driver", "registry", "conformance", "suite-image", "server", "client", "testsupport"}},
}

// pending lists the imports that break the rule today, each with the step of issue 31
// (Layout) that removes it. The test fails when one of them is gone (so that the list
// shrinks with the code) and for any import not listed.
var pending = map[string]string{}

// groupOf returns the group of package rel (a path relative to the module).
func groupOf(rel string) (string, bool) {
	for _, g := range groups {
		for _, m := range g.members {
			if rel == m || (strings.HasSuffix(m, "/...") && (rel == strings.TrimSuffix(m, "/...") || strings.HasPrefix(rel, strings.TrimSuffix(m, "...")))) {
				return g.name, true
			}
		}
	}
	return "", false
}

func allowed(from, to string) bool {
	for _, g := range groups {
		if g.name == from {
			return slices.Contains(g.imports, to)
		}
	}
	return false
}

// violations returns, for imports (package → its non-test imports, full paths), every
// import of a module package that the rule refuses, as "FROM -> TO (group a imports
// group b)", sorted, and the packages that belong to no group.
func violations(imports map[string][]string) (bad []string, ungrouped []string) {
	for pkg, imps := range imports {
		rel, ok := relative(pkg)
		if !ok {
			continue
		}
		from, ok := groupOf(rel)
		if !ok {
			ungrouped = append(ungrouped, rel)
			continue
		}
		for _, imp := range imps {
			irel, ok := relative(imp)
			if !ok {
				continue
			}
			to, ok := groupOf(irel)
			if !ok {
				continue // reported as ungrouped by its own entry
			}
			if !allowed(from, to) {
				bad = append(bad, fmt.Sprintf("%s -> %s (group %s may not import group %s)", rel, irel, from, to))
			}
		}
	}
	slices.Sort(bad)
	slices.Sort(ungrouped)
	return bad, ungrouped
}

func relative(pkg string) (string, bool) {
	if pkg == module {
		return "", true
	}
	rel, ok := strings.CutPrefix(pkg, module+"/")
	return rel, ok
}

type listed struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// list runs go list over the module and returns its packages.
func list(t *testing.T) []listed {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages of %s, want the whole module", len(pkgs), module)
	}
	return pkgs
}

// No package of the module imports upward, and every package has a group.
func TestLayering(t *testing.T) {
	imports := map[string][]string{}
	for _, p := range list(t) {
		imports[p.ImportPath] = p.Imports
	}
	bad, ungrouped := violations(imports)
	for _, u := range ungrouped {
		t.Errorf("package %s belongs to no group: give it one in internal/layering/layering_test.go (and a row in docs/architecture.md)", u)
	}
	seen := map[string]bool{}
	for _, b := range bad {
		key, _, _ := strings.Cut(b, " (")
		if why, ok := pending[key]; ok {
			seen[key] = true
			t.Logf("known, to be removed (%s): %s", why, b)
			continue
		}
		t.Errorf("upward import: %s", b)
	}
	for key := range pending {
		if !seen[key] {
			t.Errorf("pending exception %q no longer happens: remove it from the list", key)
		}
	}
}

// Outside the module: backend imports the standard library only, and config's
// whole dependency tree has no plugin or gRPC code.
func TestLayeringOutsideTheModule(t *testing.T) {
	for _, p := range list(t) {
		rel, _ := relative(p.ImportPath)
		switch {
		case rel == "backend":
			for _, imp := range p.Imports {
				if first, _, _ := strings.Cut(imp, "/"); strings.Contains(first, ".") {
					t.Errorf("backend imports %s: the contract imports the standard library only", imp)
				}
			}
		case rel == "config" || strings.HasPrefix(rel, "config/"):
			for _, d := range p.Deps {
				for _, banned := range []string{"google.golang.org/grpc", "github.com/hashicorp/go-plugin"} {
					if d == banned || strings.HasPrefix(d, banned+"/") {
						t.Errorf("%s depends on %s: config imports no plugin or gRPC code", rel, d)
					}
				}
			}
		}
	}
}

// The rule refuses an upward import and a package without a group: the checker can
// fail.
func TestLayeringRefuses(t *testing.T) {
	bad, ungrouped := violations(map[string][]string{
		module + "/backend":  {"fmt", module + "/registry"},
		module + "/agent":    {module + "/backend", module + "/backends"},
		module + "/docker":   {module + "/containerd"},
		module + "/registry": {module + "/agent", module + "/config"},
		module + "/newthing": {module + "/backend"},
	})
	want := []string{
		"agent -> backends (group agent may not import group backends)",
		"backend -> registry (group backend may not import group registry)",
		"docker -> containerd (group driver may not import group driver)",
	}
	if !slices.Equal(bad, want) {
		t.Errorf("violations = %q, want %q", bad, want)
	}
	if !slices.Equal(ungrouped, []string{"newthing"}) {
		t.Errorf("ungrouped = %q, want [newthing]", ungrouped)
	}
}
