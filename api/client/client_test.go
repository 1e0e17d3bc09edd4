package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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
		"plain text\n":                          "",
		`{"id":"a"}`:                            "",
	} {
		if got, ok := errorMessage([]byte(body)); got != want || ok != (want != "") {
			t.Errorf("errorMessage(%q) = %q, %v; want %q", body, got, ok, want)
		}
	}
}

// What answers but is not a shardcron node (a wrong address, a proxy) is
// said to be so, with what it answered summed up, not taken for the API's
// own error ("404 page not found" read as a task not found) or dumped.
func TestClient_ForeignAnswers(t *testing.T) {
	page := "<!DOCTYPE HTML>\n<html><head><title>Error response</title></head><body>" + strings.Repeat("x", 5000) + "</body></html>"
	for _, tc := range []struct {
		status      int
		contentType string
		body        string
		want        string
	}{
		{404, "text/plain; charset=utf-8", "404 page not found\n", `HTTP 404, not a shardcron node's answer: "404 page not found"`},
		{501, "text/html", page, `HTTP 501, not a shardcron node's answer: an HTML page, "Error response"`},
		{200, "text/html", page, `HTTP 200, not a shardcron node's answer: an HTML page, "Error response"`},
		{502, "text/plain", "", `HTTP 502, not a shardcron node's answer: no body`},
	} {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", tc.contentType)
			w.WriteHeader(tc.status)
			_, _ = io.WriteString(w, tc.body)
		}))
		_, err := NewClient(ts.URL, "").GetTask(context.Background(), "a")
		ts.Close()
		var ae *Error
		if !errors.As(err, &ae) || !ae.Foreign || ae.Status != tc.status || err.Error() != tc.want {
			t.Errorf("HTTP %d %s: %v, want %q", tc.status, tc.contentType, err, tc.want)
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
