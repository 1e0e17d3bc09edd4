package membership

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// quiet drops the sessions' logs: tests assert behaviour, not log lines.
var quiet = slog.New(slog.DiscardHandler)

// testConfig is a Config for id with short timings so that tests that wait
// for a lease to expire stay quick.
func testConfig(cli *clientv3.Client, id string) Config {
	return Config{
		Client: cli,
		NodeID: id,
		Info:   NodeInfo{APIAddr: "127.0.0.1:80", StartedAt: time.Unix(1700000000, 0).UTC(), Version: "test"},
		TTL:    2 * time.Second,
		Logger: quiet,
	}
}

// join joins with cfg and closes the session when the test ends.
func join(t *testing.T, cfg Config) *Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := Join(ctx, cfg)
	if err != nil {
		t.Fatalf("join %s: %v", cfg.NodeID, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// crash stops the session's goroutines and keep-alives without revoking its
// lease, as kill -9 would: the lease expires on its own.
func (s *Session) crash() {
	s.end(errCrashed)
	s.wg.Wait()
	<-s.mutexes.Done()
}

var errCrashed = errors.New("membership test: process crashed")

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitClosed fails the test unless ch is closed within timeout.
func waitClosed(t *testing.T, ch <-chan struct{}, timeout time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(timeout):
		t.Fatalf("%s not closed within %v", what, timeout)
	}
}
