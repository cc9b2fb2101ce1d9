package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
)

// Supervision defaults (SupervisePolicy's zero fields).
const (
	// DefaultRestartDelay is the delay before the first restart of a crashed plugin.
	DefaultRestartDelay = 100 * time.Millisecond
	// DefaultMaxRestartDelay caps the delay, which doubles with each crash in a row.
	DefaultMaxRestartDelay = 30 * time.Second
	// DefaultHealthyAfter is how long a plugin must have run before it crashed for
	// its restart to count as the first again (the delay resets).
	DefaultHealthyAfter = time.Minute
	// restartWaitMax is the longest a call waits for a pending restart; a call that
	// meets a plugin whose next restart is further away fails at once with a
	// *DriverCrashedError saying when.
	restartWaitMax = 2 * time.Second
)

// SupervisePolicy is how a registry made WithSupervision restarts a driver plugin
// that crashed: after Initial, then twice as long for each crash in a row, at most
// Max; a plugin that ran for HealthyAfter before it crashed starts the series again.
type SupervisePolicy struct {
	// Initial, Max and HealthyAfter are durations; zero means DefaultRestartDelay,
	// DefaultMaxRestartDelay and DefaultHealthyAfter.
	Initial      time.Duration
	Max          time.Duration
	HealthyAfter time.Duration
	// OnRestart, when set, is called after each restart attempt of driver, with nil
	// for a plugin that is up again or the launch's error (the next attempt follows
	// after the next delay). It is called from the supervising goroutine.
	OnRestart func(driver string, err error)
}

// WithSupervision makes the registry supervise the plugins it launches, as a
// long-lived host (berth serve) wants: a plugin process that exits without the
// registry stopping it (a crash, or kill -9 from outside) is restarted at once,
// with p's exponential backoff, instead of at the next call that needs it; calls
// that meet the restart wait for it (up to 2 s, within their context); and the
// registry's idempotent driver calls (Create, which adopts a sandbox of its name,
// Stop and Remove) that fail because the plugin crashed under them are made once
// more on the restarted plugin, so a create in flight is completed or reported,
// never left half done. Calls that may not be repeated (an exec through the plugin)
// are not retried. Either way a failed call's error is a *DriverCrashedError.
// Without this option a crashed plugin is launched again by the next call that
// needs it. In-process drivers (WithDriver) are not supervised.
func WithSupervision(p SupervisePolicy) Option {
	return func(o *options) error {
		if p.Initial < 0 || p.Max < 0 || p.HealthyAfter < 0 {
			return backend.Errorf(backend.ErrInvalid, "registry.WithSupervision: negative duration in %+v", p)
		}
		if p.Initial == 0 {
			p.Initial = DefaultRestartDelay
		}
		if p.Max == 0 {
			p.Max = DefaultMaxRestartDelay
		}
		if p.HealthyAfter == 0 {
			p.HealthyAfter = DefaultHealthyAfter
		}
		p.Max = max(p.Max, p.Initial)
		o.supervise = &p
		return nil
	}
}

// delay is the wait before restart number attempt+1 of a series of crashes in a
// row: Initial doubled attempt times, at most Max.
func (p *SupervisePolicy) delay(attempt int) time.Duration {
	d := p.Initial << min(attempt, 30)
	if d > p.Max || d <= 0 {
		d = p.Max
	}
	return d
}

// DriverCrashedError is the error of a call that met a crashed driver plugin. It
// wraps backend.ErrUnavailable (errors.Is) and the error the call got.
type DriverCrashedError struct {
	// Driver is the driver's name; Op what the call was doing ("create sandbox X").
	Driver string
	Op     string
	// Retried says whether the call was made again on the restarted plugin (and
	// failed again); false for calls that may not be repeated, and for calls that
	// found the plugin still down.
	Retried bool
	// Err is the error the call got (the last one when retried).
	Err error
}

func (e *DriverCrashedError) Error() string {
	how := "not retried"
	if e.Retried {
		how = "retried once on the restarted plugin, which failed too"
	}
	return fmt.Sprintf("driver %s crashed during %s (%s): %v", e.Driver, e.Op, how, e.Err)
}

// Unwrap returns backend.ErrUnavailable and Err.
func (e *DriverCrashedError) Unwrap() []error { return []error{backend.ErrUnavailable, e.Err} }

// crashWatcher is what supervision needs of a plugin client (backends.Client).
type crashWatcher interface {
	Done() <-chan struct{}
	Killed() bool
}

// supervised starts watching b, driver's freshly started plugin in e, when the
// registry supervises plugins. Call with e.mu held.
func (r *Registry) supervised(name string, e *driverEntry, b backend.TerminalBackend) {
	w, ok := b.(crashWatcher)
	if r.supervise == nil || !ok {
		return
	}
	e.started = time.Now()
	go func() {
		select {
		case <-w.Done():
		case <-r.life.Done():
			return
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.b == b && !w.Killed() {
			r.crashNoticed(name, e)
		}
	}()
}

// crashNoticed begins the restart of e's plugin, which has exited, unless one is
// pending. Call with e.mu held.
func (r *Registry) crashNoticed(name string, e *driverEntry) {
	if e.down != nil {
		return
	}
	if time.Since(e.started) >= r.supervise.HealthyAfter {
		e.attempt = 0 // it ran long enough: the series starts again
	}
	e.down = make(chan struct{})
	how := ""
	if x, ok := e.b.(interface{ Pid() int }); ok {
		how = fmt.Sprintf("pid %d", x.Pid())
	}
	closeDriver(e.b)
	e.b = nil
	r.log.Warn("driver plugin crashed; restarting it", "driver", name, "plugin", how, "restarts_in_a_row", e.attempt)
	go r.restart(name, e)
}

// restart launches e's plugin again after the backoff delay, until it is up or the
// registry is closed.
func (r *Registry) restart(name string, e *driverEntry) {
	p := r.supervise
	for {
		e.mu.Lock()
		delay := p.delay(e.attempt)
		e.attempt++
		attempt := e.attempt
		e.nextTry = time.Now().Add(delay)
		e.mu.Unlock()
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-r.life.Done():
			t.Stop()
			e.mu.Lock()
			close(e.down)
			e.down = nil
			e.mu.Unlock()
			return
		}
		e.mu.Lock()
		b, err := r.startDriver(r.life, name)
		if err == nil && r.life.Err() != nil {
			closeDriver(b)
			err = r.life.Err()
		}
		if err == nil {
			e.b = b
			r.supervised(name, e, b)
			close(e.down)
			e.down, e.lastErr = nil, nil
		} else {
			e.lastErr = err
		}
		e.mu.Unlock()
		if p.OnRestart != nil && r.life.Err() == nil {
			p.OnRestart(name, err)
		}
		if err == nil {
			r.log.Info("driver plugin restarted", "driver", name, "attempt", attempt)
			return
		}
		if r.life.Err() != nil {
			e.mu.Lock()
			close(e.down)
			e.down = nil
			e.mu.Unlock()
			return
		}
		r.log.Warn("driver plugin restart failed; trying again", "driver", name, "attempt", attempt, "error", err)
	}
}

// awaitRestart waits, with e.mu held (and held again on return), while a restart of
// e's plugin is pending: up to restartWaitMax, within ctx. It returns a
// *DriverCrashedError when the next attempt is further away, ctx's error when ctx
// ends first.
func (r *Registry) awaitRestart(ctx context.Context, name string, e *driverEntry) error {
	deadline := time.Now().Add(restartWaitMax)
	for e.down != nil {
		if e.nextTry.After(deadline) || !time.Now().Before(deadline) {
			err := fmt.Errorf("the plugin is being restarted; next attempt at %s", e.nextTry.UTC().Format(time.RFC3339))
			if e.lastErr != nil {
				err = fmt.Errorf("%w (the last one failed: %v)", err, e.lastErr)
			}
			return &DriverCrashedError{Driver: name, Op: "a call that needs it", Err: backend.Errorf(backend.ErrUnavailable, "%w", err)}
		}
		down := e.down
		e.mu.Unlock()
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-down:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		e.mu.Lock()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// isCrash reports whether err is a call's error because driver's plugin crashed
// under it (backends.ErrCrashed, or ErrUnavailable while the plugin b has exited).
func isCrash(b backend.TerminalBackend, err error) bool {
	if err == nil || !errors.Is(err, backend.ErrUnavailable) {
		return false
	}
	if errors.Is(err, backends.ErrCrashed) {
		return true
	}
	x, ok := b.(exiter)
	return ok && x.Exited()
}

// again makes f, an idempotent call named op on driver's plugin b, once more on the
// restarted plugin when it failed because b crashed and the registry supervises its
// plugins. It returns the backend the call ended on and f's error; a crash's error is
// a *DriverCrashedError (Retried when it was made again).
func (r *Registry) again(ctx context.Context, driver, op string, b backend.TerminalBackend, f func(backend.TerminalBackend) error) (backend.TerminalBackend, error) {
	err := f(b)
	if !isCrash(b, err) {
		return b, err
	}
	if r.supervise == nil {
		return b, &DriverCrashedError{Driver: driver, Op: op, Err: err}
	}
	r.log.Warn("driver plugin crashed during a call; retrying it on the restarted plugin", "driver", driver, "call", op, "error", err)
	nb, derr := r.driver(ctx, driver)
	if derr != nil {
		return b, &DriverCrashedError{Driver: driver, Op: op, Err: err}
	}
	if err := f(nb); err != nil {
		if isCrash(nb, err) {
			return nb, &DriverCrashedError{Driver: driver, Op: op, Retried: true, Err: err}
		}
		return nb, err
	}
	r.log.Info("call retried on the restarted driver plugin", "driver", driver, "call", op)
	return nb, nil
}
