package catalog_test

import (
	"context"
	"slices"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/catalog"

	// Each built-in driver registers itself when linked.
	_ "github.com/berth-sh/berth/containerd"
	_ "github.com/berth-sh/berth/docker"
	_ "github.com/berth-sh/berth/kubernetes"
	_ "github.com/berth-sh/berth/local"
)

// Importing the four built-in drivers links exactly catalog.Builtins, and each
// constructor makes the driver its name says.
func TestLinkedMatchesBuiltins(t *testing.T) {
	want := catalog.BuiltinNames()
	slices.Sort(want)
	if got := catalog.LinkedNames(); !slices.Equal(got, want) {
		t.Fatalf("LinkedNames = %v, want the built-in names %v", got, want)
	}
	for _, name := range want {
		mk, ok := catalog.Linked(name)
		if !ok {
			t.Fatalf("Linked(%s) not found", name)
		}
		b := mk()
		info, err := b.Info(context.Background())
		if err != nil || info.Name != name {
			t.Errorf("%s: Info = %+v, %v", name, info, err)
		}
		b.Close()
	}
	if _, ok := catalog.Linked("nope"); ok {
		t.Error("Linked(nope) found one")
	}
}

// Register refuses a second driver under a taken name and a nil constructor.
func TestRegisterRefuses(t *testing.T) {
	for name, f := range map[string]func(){
		"duplicate": func() {
			catalog.Register("local", func() backend.TerminalBackend { return nil })
		},
		"nil": func() { catalog.Register("test-nil", nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Register did not panic", name)
				}
			}()
			f()
		}()
	}
	if _, ok := catalog.Linked("test-nil"); ok {
		t.Error("a nil constructor was registered")
	}
}
