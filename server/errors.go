package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/berth-sh/berth/internal/rpcerr"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

// Kind is one error kind of the API: its name (ErrorInfo.Kind) and the HTTP status
// of an answer that carries it.
type Kind struct {
	Name   string
	Status int
}

// Kinds is the one table from error kinds to HTTP statuses. The first six are
// berth's own kinds (package backend's ErrNotFound ... ErrTimeout, named as on
// berth's wire protocols, rpcerr.KindName); the rest are the HTTP layer's.
var Kinds = []Kind{
	{"not_found", http.StatusNotFound},
	{"conflict", http.StatusConflict},
	{"unavailable", http.StatusServiceUnavailable},
	{"unsupported", http.StatusNotImplemented},
	{"invalid", http.StatusBadRequest},
	{"timeout", http.StatusGatewayTimeout},
	// The HTTP layer's kinds.
	{apiv1.KindUnauthorized, http.StatusUnauthorized},
	{apiv1.KindTooLarge, http.StatusRequestEntityTooLarge},
	{apiv1.KindRequestTimeout, http.StatusRequestTimeout},
	{apiv1.KindMediaType, http.StatusUnsupportedMediaType},
	{apiv1.KindMethod, http.StatusMethodNotAllowed},
	{apiv1.KindShuttingDown, http.StatusServiceUnavailable},
	{apiv1.KindCanceled, 499}, // the client went away; nobody reads this answer
	{apiv1.KindInternal, http.StatusInternalServerError},
	// A driver plugin crashed during the call (registry.DriverCrashedError; berth
	// serve restarts it): ErrorInfo.Retried says whether the call was made again.
	{apiv1.KindDriverCrashed, http.StatusServiceUnavailable},
}

// statusOf returns the HTTP status of kind; 500 for a name not in Kinds.
func statusOf(kind string) int {
	for _, k := range Kinds {
		if k.Name == kind {
			return k.Status
		}
	}
	return http.StatusInternalServerError
}

// httpError is an error of the HTTP layer, of one of its kinds.
type httpError struct {
	kind string
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func errorf(kind, format string, args ...any) error {
	return &httpError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// errorInfo classifies err: the HTTP layer's kind, else berth's kind, else
// canceled for a cancelled context, timeout for an expired one, internal otherwise.
func errorInfo(err error, session string) apiv1.ErrorInfo {
	info := apiv1.ErrorInfo{Message: err.Error(), Session: session}
	var he *httpError
	var dc *registry.DriverCrashedError
	switch {
	case errors.As(err, &he):
		info.Kind = he.kind
	case errors.As(err, &dc):
		info.Kind, info.Retried = apiv1.KindDriverCrashed, &dc.Retried
	case rpcerr.KindName(err) != "":
		info.Kind = rpcerr.KindName(err)
	case errors.Is(err, context.Canceled):
		info.Kind = apiv1.KindCanceled
	case errors.Is(err, context.DeadlineExceeded):
		info.Kind = "timeout"
	default:
		info.Kind = apiv1.KindInternal
	}
	return info
}

// writeError answers with err as an ErrorBody and the status of its kind.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error, session string) {
	info := errorInfo(err, session)
	auditError(r, info.Kind)
	status := statusOf(info.Kind)
	if status >= 500 && info.Kind != apiv1.KindShuttingDown {
		s.log.Warn("call failed", "method", r.Method, "path", r.URL.EscapedPath(), "kind", info.Kind, "error", info.Message)
	}
	writeJSON(w, status, apiv1.ErrorBody{Error: info})
}
