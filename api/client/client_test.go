package client

import (
	"testing"

	"github.com/shardcron/shardcron/internal/depcheck"
)

func TestError(t *testing.T) {
	e := &Error{Status: 404, Message: `task "a" not found`}
	if got := e.Error(); got != `task "a" not found (HTTP 404)` {
		t.Fatalf("Error() = %q", got)
	}
	if got := (&Error{Status: 502}).Error(); got != "Bad Gateway (HTTP 502)" {
		t.Fatalf("Error() without message = %q", got)
	}
	for body, want := range map[string]string{
		`{"error":"x"}`:                         "x",
		`{"status":"not ready","reason":"why"}`: "why",
		"plain text\n":                          "plain text",
	} {
		if got := errorMessage([]byte(body)); got != want {
			t.Errorf("errorMessage(%q) = %q, want %q", body, got, want)
		}
	}
}

// TestDeps_Thin fails when a program that uses the client links the
// server: the API server, the engine, the registry or the store, etcd or
// Badger. The task model (package task) is all it shares with them.
func TestDeps_Thin(t *testing.T) {
	depcheck.Refuse(t, []string{
		"github.com/dgraph-io/badger",
		"go.etcd.io/etcd",
		"google.golang.org/grpc",
		"github.com/shardcron/shardcron/api",
		"github.com/shardcron/shardcron/engine",
		"github.com/shardcron/shardcron/registry",
		"github.com/shardcron/shardcron/store",
	}, []string{
		"github.com/shardcron/shardcron/api/client",
		"github.com/shardcron/shardcron/engine/schedule",
		"github.com/shardcron/shardcron/engine/executor",
	})
}
