package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestHandler_Registered(t *testing.T) {
	var h Handlers
	var got Fire
	h.Handle("billing.invoice", func(ctx context.Context, f Fire) error {
		got = f
		return nil
	})
	payload := json.RawMessage(`{"customer":42}`)
	in := testFire()
	if err := NewHandler(&h, "billing.invoice", payload).Execute(context.Background(), in); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	want := *in
	want.Payload = payload
	if got.TaskID != want.TaskID || !got.ScheduledAt.Equal(want.ScheduledAt) || got.Attempt != want.Attempt ||
		got.Node != want.Node || got.Fence != want.Fence || string(got.Payload) != string(payload) {
		t.Errorf("handler got %+v, want %+v", got, want)
	}
	if in.Payload != nil {
		t.Error("Execute modified the caller's Fire")
	}
}

func TestHandler_Results(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name    string
		fn      HandlerFunc // nil: not registered
		wantMsg string
		is      []error
	}{
		{"not registered", nil, `handler "h" is not registered on this node`, []error{ErrNotRegistered}},
		{"error returned as is", func(context.Context, Fire) error { return errBoom }, "boom", []error{errBoom}},
		{"panic", func(context.Context, Fire) error { panic("oops") }, `handler "h" panicked: oops`, nil},
		{"panic with error", func(context.Context, Fire) error { panic(errBoom) }, `handler "h" panicked: boom`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Handlers
			if tt.fn != nil {
				h.Handle("h", tt.fn)
			}
			err := NewHandler(&h, "h", nil).Execute(context.Background(), testFire())
			if err == nil || err.Error() != tt.wantMsg {
				t.Fatalf("Execute = %v, want %q", err, tt.wantMsg)
			}
			for _, target := range tt.is {
				if !errors.Is(err, target) {
					t.Errorf("errors.Is(%v, %v) = false", err, target)
				}
			}
			if strings.Contains(tt.name, "panic") {
				var pe *PanicError
				if !errors.As(err, &pe) || pe.Handler != "h" || !strings.Contains(string(pe.Stack), "handler_test.go") {
					t.Errorf("want a *PanicError with the panic's stack, got %#v", err)
				}
			}
		})
	}
}

func TestHandler_RegisteredLater(t *testing.T) {
	var h Handlers
	e := NewHandler(&h, "late", nil)
	if err := e.Execute(context.Background(), testFire()); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("before Handle: %v, want ErrNotRegistered", err)
	}
	h.Handle("late", func(context.Context, Fire) error { return nil })
	if err := e.Execute(context.Background(), testFire()); err != nil {
		t.Fatalf("after Handle: %v", err)
	}
	h.Handle("late", nil)
	if err := e.Execute(context.Background(), testFire()); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("after removal: %v, want ErrNotRegistered", err)
	}
	if err := NewHandler(nil, "x", nil).Execute(context.Background(), testFire()); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("nil Handlers: %v, want ErrNotRegistered", err)
	}
}

func TestHandler_ContextEnds(t *testing.T) {
	errClosed := errors.New("db: connection closed")
	tests := []struct {
		name    string
		fn      HandlerFunc
		wantNil bool
	}{
		// A handler that reports the ctx error as is.
		{"returns ctx.Err", func(ctx context.Context, _ Fire) error { <-ctx.Done(); return ctx.Err() }, false},
		// One that fails with an error of its own because ctx ended: still
		// a timeout for the caller.
		{"returns its own error", func(ctx context.Context, _ Fire) error { <-ctx.Done(); return errClosed }, false},
		// One that finished its work anyway: a success.
		{"returns nil", func(ctx context.Context, _ Fire) error { <-ctx.Done(); return nil }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Handlers
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			started := make(chan struct{})
			h.Handle("h", func(ctx context.Context, f Fire) error { close(started); return tt.fn(ctx, f) })
			go func() { errc <- NewHandler(&h, "h", nil).Execute(ctx, testFire()) }()
			<-started
			cancel()
			err := <-errc
			if tt.wantNil {
				if err != nil {
					t.Errorf("Execute = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, context.Canceled) || errors.Is(err, ErrNotStarted) {
				t.Errorf("Execute = %v, want an error wrapping context.Canceled, not ErrNotStarted: the handler was called", err)
			}
			if tt.name == "returns its own error" && !errors.Is(err, errClosed) {
				t.Errorf("Execute = %v, want the handler's error wrapped too", err)
			}
			t.Log(err)
		})
	}
	t.Run("already ended", func(t *testing.T) {
		var h Handlers
		called := false
		h.Handle("h", func(context.Context, Fire) error { called = true; return nil })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := NewHandler(&h, "h", nil).Execute(ctx, testFire()); !errors.Is(err, context.Canceled) || !errors.Is(err, ErrNotStarted) || called {
			t.Errorf("Execute = %v (called %v), want context.Canceled and ErrNotStarted without calling", err, called)
		}
	})
}

func TestHandlers_Concurrent(t *testing.T) {
	var h Handlers
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			name := fmt.Sprint("h", i)
			for range 100 {
				h.Handle(name, func(context.Context, Fire) error { return nil })
				if _, ok := h.Lookup(name); !ok {
					t.Errorf("%s not found right after Handle", name)
					return
				}
				_ = NewHandler(&h, "h0", nil).Execute(context.Background(), testFire())
			}
		})
	}
	wg.Wait()
	for i := range 8 {
		if _, ok := h.Lookup(fmt.Sprint("h", i)); !ok {
			t.Errorf("h%d lost", i)
		}
	}
}

func BenchmarkHandler(b *testing.B) {
	var h Handlers
	for i := range 100 {
		h.Handle(fmt.Sprint("h", i), func(context.Context, Fire) error { return nil })
	}
	e := NewHandler(&h, "h42", json.RawMessage(`{}`))
	ctx := context.Background()
	f := testFire()
	b.ReportAllocs()
	for b.Loop() {
		_ = e.Execute(ctx, f)
	}
}
