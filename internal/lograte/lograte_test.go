package lograte

import (
	"testing"
	"time"
)

// A key passes once an Every, the next line saying how many were held
// back; each key on its own.
func TestLimiter_OnceAnEveryAKey(t *testing.T) {
	l := Limiter{Every: 10 * time.Second}
	at := time.Unix(1000, 0)
	for i, step := range []struct {
		after    time.Duration
		ok       bool
		heldBack int
	}{{0, true, 0}, {time.Second, false, 0}, {2 * time.Second, false, 0}, {10 * time.Second, true, 2}, {11 * time.Second, false, 0}} {
		if ok, held := l.Pass("m", at.Add(step.after)); ok != step.ok || held != step.heldBack {
			t.Errorf("line %d, %v after the first: pass %v, %d held back; want %v, %d", i, step.after, ok, held, step.ok, step.heldBack)
		}
	}
	if ok, _ := l.Pass("other", at.Add(time.Second)); !ok {
		t.Error("another key was held back")
	}
}
