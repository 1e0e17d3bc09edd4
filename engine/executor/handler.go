package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
)

// HandlerFunc is an in-process handler: it runs one fire, gets the task's
// payload in f.Payload, and returns nil on success. It must return promptly
// when ctx ends, preferably with an error wrapping ctx.Err().
type HandlerFunc func(ctx context.Context, f Fire) error

// Handlers is a set of handlers registered by name. The zero value is an
// empty set ready to use; it is safe for concurrent use, and Lookup takes no
// lock, so every fire can look its handler up.
type Handlers struct {
	mu sync.Mutex // serialises Handle; Lookup reads m without it
	// m is replaced, never modified, by Handle (copy on write): handlers are
	// registered a few times at start and looked up on every fire.
	m atomic.Pointer[map[string]HandlerFunc]
}

// Handle registers fn under name, replacing any handler of that name; a nil
// fn removes it. Fires that already looked the old handler up still run it.
func (h *Handlers) Handle(name string, fn HandlerFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var m map[string]HandlerFunc
	if old := h.m.Load(); old != nil {
		m = maps.Clone(*old)
	} else {
		m = make(map[string]HandlerFunc, 1)
	}
	if fn == nil {
		delete(m, name)
	} else {
		m[name] = fn
	}
	h.m.Store(&m)
}

// Names returns the names of the registered handlers, sorted. A nil
// *Handlers has none.
func (h *Handlers) Names() []string {
	if h == nil {
		return nil
	}
	m := h.m.Load()
	if m == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(*m))
}

// Lookup returns the handler registered under name. A nil *Handlers has
// none.
func (h *Handlers) Lookup(name string) (HandlerFunc, bool) {
	if h == nil {
		return nil, false
	}
	m := h.m.Load()
	if m == nil {
		return nil, false
	}
	fn, ok := (*m)[name]
	return fn, ok
}

// PanicError is the error of a handler that panicked.
type PanicError struct {
	// Handler is the handler's name.
	Handler string
	// Value is what it panicked with.
	Value any
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

// Error returns `handler "name" panicked: <value>`.
func (e *PanicError) Error() string {
	return fmt.Sprintf("handler %q panicked: %v", e.Handler, e.Value)
}

// notRegisteredError says which handler is missing, and is ErrNotRegistered
// for errors.Is.
type notRegisteredError struct{ name string }

func (e *notRegisteredError) Error() string {
	return fmt.Sprintf("handler %q is not registered on this node", e.name)
}

func (e *notRegisteredError) Is(target error) bool { return target == ErrNotRegistered }

// handlerExec is a handler executor; immutable.
type handlerExec struct {
	handlers *Handlers
	name     string
	payload  json.RawMessage
}

// NewHandler returns an executor that calls the handler registered in h
// under name, with payload as the fire's Payload unless the fire carries
// one of its own (a trigger's override). The handler is looked up
// at each Execute, so one registered after the task was loaded is found;
// when none is registered, Execute fails with an error wrapping
// ErrNotRegistered ("handler %q is not registered on this node").
//
// A panicking handler is recovered into a *PanicError. When ctx has ended
// and the handler returns an error that does not already wrap ctx.Err(),
// Execute wraps both, so that a handler failing because of its timeout
// counts as a timeout. A handler that returns nil succeeded, even late.
func NewHandler(h *Handlers, name string, payload json.RawMessage) Executor {
	return &handlerExec{handlers: h, name: name, payload: payload}
}

// Execute runs the handler once.
func (e *handlerExec) Execute(ctx context.Context, f *Fire) (err error) {
	fn, ok := e.handlers.Lookup(e.name)
	if !ok {
		return &notRegisteredError{name: e.name}
	}
	if ctx.Err() != nil {
		return notStarted(ctx, fmt.Sprintf("handler %q", e.name), "not started")
	}
	fire := *f
	if fire.Payload == nil { // set: a trigger's override for this fire
		fire.Payload = e.payload
	}
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Handler: e.name, Value: r, Stack: debug.Stack()}
		}
	}()
	err = fn(ctx, fire)
	if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%w: %w", interrupted(ctx, fmt.Sprintf("handler %q", e.name), ""), err)
	}
	return err
}
