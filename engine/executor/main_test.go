package executor

import (
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// helperEnv makes the test binary a helper command instead of running
// tests: the exec tests run it to see exactly what a command receives.
const helperEnv = "EXECUTOR_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
	case "env":
		// Write the environment, one variable a line, to the file in argv[1].
		err := os.WriteFile(os.Args[1], []byte(strings.Join(os.Environ(), "\n")), 0o600)
		if err != nil {
			os.Exit(2)
		}
		os.Exit(0)
	default:
		os.Exit(3)
	}
	goleak.VerifyTestMain(m)
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testFire is a fire with every field set to a recognisable value.
func testFire() *Fire {
	return &Fire{
		TaskID:      "billing/invoice-42",
		ScheduledAt: time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC),
		Attempt:     2,
		Node:        "node-a",
		Fence:       12345,
	}
}
