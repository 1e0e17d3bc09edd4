package etcdtest

import (
	"testing"
	"time"
)

// pollInterval is how often WaitFor evaluates its condition.
const pollInterval = 10 * time.Millisecond

// WaitFor polls cond until it returns true and fails the test (t.Fatalf) if
// that does not happen within timeout. cond is always evaluated at least once
// and is called from the test goroutine only; WaitFor must be called from the
// test goroutine too, as t.Fatalf requires.
func WaitFor(t testing.TB, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcdtest: condition not met within %v", timeout)
		}
		time.Sleep(pollInterval)
	}
}
