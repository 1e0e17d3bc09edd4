package main

import (
	"bufio"
	"fmt"
	"io"
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

// TestNewHTTPServer_BodyDeadline: a client that sends its headers and part
// of its body, then nothing, has its connection closed at the body's
// deadline, whether its handler reads the body or answers without it (a
// request refused for its token); with no deadline it held the handler,
// or Go's server's read of the rest, and the connection for ever. A body
// that keeps coming at the pace asked has more time, and one read whole
// leaves the answer unbounded: a handler that answers later than the
// deadline keeps its request's context.
func TestNewHTTPServer_BodyDeadline(t *testing.T) {
	const wait = 500 * time.Millisecond
	firstHalf := make(chan struct{}, 1)
	canceled := make(chan bool, 1)
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/unread":
			w.WriteHeader(http.StatusUnauthorized)
			return
		case "/steady":
			if _, err := io.ReadFull(r.Body, make([]byte, 50)); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			firstHalf <- struct{}{}
		}
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if r.URL.Path == "/long" {
			select {
			case <-r.Context().Done():
				canceled <- true
			case <-time.After(3 * wait):
				canceled <- false
			}
		}
	}), slog.New(slog.DiscardHandler))
	b, ok := srv.Handler.(*bodyDeadline)
	if !ok {
		t.Fatalf("newHTTPServer's handler is a %T, want a *bodyDeadline", srv.Handler)
	}
	b.wait, b.rate = wait, 10 // 5 bytes buy no time more, 50 bytes 5 s

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	send := func(path string, length int, body string) net.Conn {
		t.Helper()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", path, ln.Addr(), length, body)
		return conn
	}

	five, half := "aaaaa", strings.Repeat("a", 50)
	for _, path := range []string{"/read", "/unread"} {
		// Its answer, and then the close.
		if _, err := io.ReadAll(send(path, 100, five)); err != nil {
			t.Errorf("%s: a body stalled after 5 of its 100 bytes: %v; want its connection closed", path, err)
		}
	}

	conn := send("/steady", 100, half)
	<-firstHalf
	time.Sleep(2 * wait) // past the wait, within the time its 50 bytes bought
	fmt.Fprint(conn, half)
	if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("a body whose second half came past the wait, within its pace: %v %v; want 200", resp, err)
	}

	conn = send("/long", 5, five)
	if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("a whole body answered late: %v %v; want 200", resp, err)
	}
	if <-canceled {
		t.Error("the request's context was canceled at the body's deadline, after its body was read")
	}
}
