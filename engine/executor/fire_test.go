package executor

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestFire_IdempotencyKey(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no tz database: %v", err)
	}
	tests := []struct {
		name string
		fire Fire
		want string
	}{
		{"utc", Fire{TaskID: "billing/invoice-42", ScheduledAt: time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC)},
			"billing/invoice-42@1774746000000"},
		{"zone does not matter", Fire{TaskID: "t", ScheduledAt: time.Date(2026, 3, 29, 3, 0, 0, 0, berlin)},
			"t@1774746000000"},
		{"milliseconds kept", Fire{TaskID: "t", ScheduledAt: time.UnixMilli(1774746000123)},
			"t@1774746000123"},
		{"epoch", Fire{TaskID: "@", ScheduledAt: time.Unix(0, 0)}, "@@0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.fire.IdempotencyKey(); got != tt.want {
				t.Errorf("IdempotencyKey() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestFire_Values(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no tz database: %v", err)
	}
	f := &Fire{TaskID: "x", ScheduledAt: time.Date(2026, 3, 29, 3, 0, 0, 7_000_000, berlin), Attempt: 1, Fence: -1}
	v := f.values()
	want := fireValues{key: "x@1774746000007", scheduledAt: "2026-03-29T01:00:00.007Z", attempt: "1", fence: "-1"}
	if v != want {
		t.Errorf("values() = %+v, want %+v", v, want)
	}
	if v.key != f.IdempotencyKey() {
		t.Errorf("values().key %q != IdempotencyKey() %q", v.key, f.IdempotencyKey())
	}
}

func TestInterrupted(t *testing.T) {
	errReplaced := errors.New("replaced")
	deadline, cancel := context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	canceled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	caused, cancel3 := context.WithCancelCause(context.Background())
	cancel3(errReplaced)

	tests := []struct {
		name string
		ctx  context.Context
		is   []error
		msg  string
	}{
		{"deadline", deadline, []error{context.DeadlineExceeded}, "http: context deadline exceeded: detail"},
		{"cancel", canceled, []error{context.Canceled}, "http: context canceled: detail"},
		{"cause", caused, []error{context.Canceled, errReplaced}, "http: context canceled (replaced): detail"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := interrupted(tt.ctx, "http", "detail")
			ns := notStarted(tt.ctx, "http", "detail")
			for _, target := range tt.is {
				if !errors.Is(err, target) || !errors.Is(ns, target) {
					t.Errorf("errors.Is(%v, %v) = false", err, target)
				}
			}
			if err.Error() != tt.msg || ns.Error() != tt.msg {
				t.Errorf("message %q (not started: %q), want %q", err, ns, tt.msg)
			}
			if errors.Is(err, ErrNotStarted) || !errors.Is(ns, ErrNotStarted) {
				t.Errorf("interrupted's error wraps ErrNotStarted %t, notStarted's %t; want false, true",
					errors.Is(err, ErrNotStarted), errors.Is(ns, ErrNotStarted))
			}
		})
	}
}
