package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/rpcerr"
	"github.com/berth-sh/berth/server/apiv1"
)

// Every backend kind has its name (as on berth's wire protocols) and an HTTP status
// in Kinds, the names are unique, and classification goes through wrapping.
func TestKinds(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range Kinds {
		if seen[k.Name] {
			t.Errorf("kind %q twice in Kinds", k.Name)
		}
		seen[k.Name] = true
	}
	want := map[error]int{
		backend.ErrNotFound: 404, backend.ErrConflict: 409, backend.ErrUnavailable: 503,
		backend.ErrUnsupported: 501, backend.ErrInvalid: 400, backend.ErrTimeout: 504,
	}
	for _, kind := range backend.Kinds {
		err := fmt.Errorf("session %q: %w", "s", backend.Errorf(kind, "what"))
		info := errorInfo(err, "s")
		if info.Kind != rpcerr.KindName(kind) || statusOf(info.Kind) != want[kind] {
			t.Errorf("%v: kind %q status %d, want %q %d", kind, info.Kind, statusOf(info.Kind), rpcerr.KindName(kind), want[kind])
		}
	}
	for _, c := range []struct {
		err    error
		kind   string
		status int
	}{
		{errorf(apiv1.KindTooLarge, "big"), apiv1.KindTooLarge, http.StatusRequestEntityTooLarge},
		{fmt.Errorf("x: %w", context.Canceled), apiv1.KindCanceled, 499},
		{context.DeadlineExceeded, "timeout", http.StatusGatewayTimeout},
		{errors.New("no kind"), apiv1.KindInternal, http.StatusInternalServerError},
	} {
		if info := errorInfo(c.err, ""); info.Kind != c.kind || statusOf(info.Kind) != c.status {
			t.Errorf("%v: kind %q status %d, want %q %d", c.err, info.Kind, statusOf(info.Kind), c.kind, c.status)
		}
	}
}
