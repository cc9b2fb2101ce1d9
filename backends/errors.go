package backends

// wrapError is an error with its own text that wraps another (a context error the
// caller tests with errors.Is). The mapping of error kinds to gRPC codes is package
// internal/rpcerr's.
type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg }
func (e *wrapError) Unwrap() error { return e.err }
