package main

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestNewHTTPServer_Bounds: what a client without a token can hold of a
// node's API listener before any handler refuses it. The server waited
// for an idle keep-alive connection's next request for ever (no
// IdleTimeout: one request to the open /healthz, then nothing, kept a
// descriptor and a goroutine each, until the node ran out of descriptors
// for etcd and its cache), and read 1 MiB of request headers (Go's
// default) from each.
func TestNewHTTPServer_Bounds(t *testing.T) {
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), slog.New(slog.DiscardHandler))
	if srv.ReadHeaderTimeout <= 0 || srv.ReadHeaderTimeout > 30*time.Second {
		t.Errorf("ReadHeaderTimeout %v, want 0 < it <= 30s (slowloris)", srv.ReadHeaderTimeout)
	}
	if srv.IdleTimeout <= 0 || srv.IdleTimeout > 5*time.Minute {
		t.Errorf("IdleTimeout %v, want 0 < it <= 5m: an idle connection is closed", srv.IdleTimeout)
	}
	if srv.MaxHeaderBytes <= 0 || srv.MaxHeaderBytes > 64<<10 {
		t.Errorf("MaxHeaderBytes %d, want 0 < it <= 64 KiB", srv.MaxHeaderBytes)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: %s\r\nX-Big: %s\r\n\r\n", ln.Addr(), strings.Repeat("a", 128<<10))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 431") {
		t.Errorf("a request with 128 KiB of headers: %q (%v), want 431", line, err)
	}
}
