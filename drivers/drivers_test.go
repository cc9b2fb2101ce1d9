package drivers_test

import (
	"context"
	"testing"

	"github.com/berth-sh/berth/backends/catalog"
	"github.com/berth-sh/berth/drivers"
)

// The in-process catalog and package catalog (backends/catalog) name the same drivers in the
// same order, and each constructor makes the driver its entry names.
func TestCatalogMatchesBuiltins(t *testing.T) {
	names := catalog.BuiltinNames()
	if len(drivers.Catalog) != len(names) {
		t.Fatalf("Catalog has %d drivers, catalog.Builtins %d (%v)", len(drivers.Catalog), len(names), names)
	}
	for i, d := range drivers.Catalog {
		if d.Name != names[i] {
			t.Errorf("Catalog[%d] = %s, catalog.Builtins[%d] = %s", i, d.Name, i, names[i])
		}
		b := d.New()
		info, err := b.Info(context.Background())
		if err != nil || info.Name != d.Name {
			t.Errorf("%s: Info = %+v, %v", d.Name, info, err)
		}
		b.Close()
		if got, ok := drivers.Lookup(d.Name); !ok || got.Name != d.Name {
			t.Errorf("Lookup(%s) = %+v, %v", d.Name, got, ok)
		}
	}
	if _, ok := drivers.Lookup("nope"); ok {
		t.Error("Lookup(nope) found one")
	}
}
