package executor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
)

// recorded is what a test server saw of one request.
type recorded struct {
	method string
	path   string
	host   string
	header http.Header
	body   string
}

// recorder is a test server that records requests and answers with a
// fixed status and body.
type recorder struct {
	mu     sync.Mutex // guards reqs
	reqs   []recorded
	status int
	body   string
	srv    *httptest.Server
	conns  atomic.Int64 // connections accepted
}

func newRecorder(t *testing.T, status int, body string) *recorder {
	t.Helper()
	r := &recorder{status: status, body: body}
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.reqs = append(r.reqs, recorded{req.Method, req.URL.RequestURI(), req.Host, req.Header.Clone(), string(b)})
		r.mu.Unlock()
		w.WriteHeader(r.status)
		_, _ = io.WriteString(w, r.body)
	}))
	r.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			r.conns.Add(1)
		}
	}
	r.srv.Start()
	t.Cleanup(r.srv.Close)
	return r
}

func (r *recorder) last(t *testing.T) recorded {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reqs) == 0 {
		t.Fatal("server got no request")
	}
	return r.reqs[len(r.reqs)-1]
}

// newTestClient returns NewClient's client, closing its idle connections
// at the end of the test so that goleak sees no connection goroutines.
func newTestClient(t testing.TB) *http.Client {
	t.Helper()
	c, err := NewClient(ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func mustHTTP(t testing.TB, c *http.Client, spec HTTPSpec) Executor {
	t.Helper()
	e, err := NewHTTP(c, spec)
	if err != nil {
		t.Fatalf("NewHTTP(%+v): %v", spec, err)
	}
	return e
}

func TestHTTP_Request(t *testing.T) {
	srv := newRecorder(t, http.StatusNoContent, "")
	c := newTestClient(t)
	tests := []struct {
		name       string
		spec       HTTPSpec
		wantMethod string
		wantPath   string
		wantBody   string
	}{
		{"default method is POST", HTTPSpec{URL: srv.srv.URL + "/hook", Body: `{"k":1}`}, "POST", "/hook", `{"k":1}`},
		{"GET without body", HTTPSpec{URL: srv.srv.URL + "/a/b?x=1&y=%2F", Method: "GET"}, "GET", "/a/b?x=1&y=%2F", ""},
		{"PUT with body", HTTPSpec{URL: srv.srv.URL, Method: "PUT", Body: "hello"}, "PUT", "/", "hello"},
		{"POST without body", HTTPSpec{URL: srv.srv.URL + "/p", Method: "POST"}, "POST", "/p", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustHTTP(t, c, tt.spec)
			if err := e.Execute(context.Background(), testFire()); err != nil {
				t.Fatalf("Execute: %v", err)
			}
			got := srv.last(t)
			if got.method != tt.wantMethod || got.path != tt.wantPath || got.body != tt.wantBody {
				t.Errorf("server got %s %s %q, want %s %s %q", got.method, got.path, got.body, tt.wantMethod, tt.wantPath, tt.wantBody)
			}
		})
	}
}

func TestHTTP_Headers(t *testing.T) {
	srv := newRecorder(t, http.StatusOK, "ok")
	c := newTestClient(t)
	ours := map[string]string{
		"Idempotency-Key":        "billing/invoice-42@1774746000000",
		"Shardcron-Task":         "billing/invoice-42",
		"Shardcron-Scheduled-At": "2026-03-29T01:00:00.000Z",
		"Shardcron-Attempt":      "2",
		"Shardcron-Node":         "node-a",
		"Shardcron-Fence":        "12345",
	}
	tests := []struct {
		name    string
		headers map[string]string
		ua      string
		want    map[string]string // besides ours
		host    string
	}{
		{
			name: "default user agent",
			want: map[string]string{"User-Agent": defaultUserAgent()},
		},
		{
			name:    "task headers passed, canonicalised",
			headers: map[string]string{"X-Team": "billing", "x-lower": "v", "Content-Type": "application/json"},
			want:    map[string]string{"X-Team": "billing", "X-Lower": "v", "Content-Type": "application/json", "User-Agent": defaultUserAgent()},
		},
		{
			name: "task cannot override ours",
			headers: map[string]string{"Idempotency-Key": "forged", "shardcron-task": "forged",
				"Shardcron-Fence": "999999", "SHARDCRON-NODE": "forged", "Shardcron-Other": "x"},
			want: map[string]string{"User-Agent": defaultUserAgent()},
		},
		{
			name:    "task sets user agent",
			headers: map[string]string{"user-agent": "billing-bot/1"},
			ua:      "shardcron/9",
			want:    map[string]string{"User-Agent": "billing-bot/1"},
		},
		{
			name: "spec user agent",
			ua:   "shardcron/1.2.3",
			want: map[string]string{"User-Agent": "shardcron/1.2.3"},
		},
		{
			name:    "host header sets the request host",
			headers: map[string]string{"Host": "billing.internal"},
			want:    map[string]string{"User-Agent": defaultUserAgent()},
			host:    "billing.internal",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustHTTP(t, c, HTTPSpec{URL: srv.srv.URL, Headers: tt.headers, UserAgent: tt.ua})
			if err := e.Execute(context.Background(), testFire()); err != nil {
				t.Fatalf("Execute: %v", err)
			}
			got := srv.last(t)
			want := map[string]string{}
			for k, v := range ours {
				want[k] = v
			}
			for k, v := range tt.want {
				want[k] = v
			}
			for k, v := range want {
				if vs := got.header[k]; len(vs) != 1 || vs[0] != v {
					t.Errorf("header %s = %q, want [%q]", k, vs, v)
				}
			}
			// Nothing else but what Go's transport adds itself.
			for k := range got.header {
				if _, ok := want[k]; !ok && k != "Content-Length" && k != "Accept-Encoding" {
					t.Errorf("unexpected header %s: %q", k, got.header[k])
				}
			}
			if tt.host != "" && got.host != tt.host {
				t.Errorf("Host = %q, want %q", got.host, tt.host)
			}
		})
	}
	if ua := defaultUserAgent(); !strings.HasPrefix(ua, "shardcron/") || len(ua) == len("shardcron/") {
		t.Errorf("default User-Agent %q, want shardcron/<version>", ua)
	}
}

func TestHTTP_Status(t *testing.T) {
	long := strings.Repeat("x", 300)
	tests := []struct {
		name     string
		status   int
		body     string
		location string
		want     string
	}{
		{"503 with body", 503, "overloaded\n", "", "http: 503 Service Unavailable: overloaded"},
		{"404 without body", 404, "", "", "http: 404 Not Found"},
		{"500 json", 500, `{"error": "db down"}`, "", `http: 500 Internal Server Error: {"error": "db down"}`},
		{"multiline body on one line", 400, "line one\r\n\tline two\x00!", "", "http: 400 Bad Request: line one line two\uFFFD!"},
		{"long body truncated", 502, long, "", "http: 502 Bad Gateway: " + strings.Repeat("x", 256) + "…"},
		{"redirect not followed", 302, "", "/elsewhere", `http: 302 Found (redirect to "/elsewhere" not followed)`},
		{"unknown status", 599, "", "", "http: 599 status code 599"},
	}
	c := newTestClient(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.location != "" {
					w.Header().Set("Location", tt.location)
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			err := mustHTTP(t, c, HTTPSpec{URL: srv.URL}).Execute(context.Background(), testFire())
			if err == nil {
				t.Fatal("Execute succeeded, want an error")
			}
			if err.Error() != tt.want {
				t.Errorf("error %q\nwant      %q", err, tt.want)
			}
			var se *StatusError
			if !errors.As(err, &se) || se.Code != tt.status {
				t.Errorf("errors.As StatusError: %#v, want code %d", se, tt.status)
			}
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				t.Errorf("status error %v counts as a timeout or cancel", err)
			}
		})
	}
}

func TestHTTP_Success2xx(t *testing.T) {
	c := newTestClient(t)
	for _, status := range []int{200, 201, 202, 204, 299} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(status)
				if status != 204 {
					// A body bigger than what is drained: still a success.
					_, _ = io.WriteString(w, strings.Repeat("y", maxDrain+1000))
				}
			}))
			defer srv.Close()
			if err := mustHTTP(t, c, HTTPSpec{URL: srv.URL}).Execute(context.Background(), testFire()); err != nil {
				t.Errorf("Execute: %v", err)
			}
		})
	}
}

func TestHTTP_ContextEnds(t *testing.T) {
	errReplaced := errors.New("replaced by a newer fire")
	tests := []struct {
		name string
		// ctx returns the fire's context and a function that ends it once
		// the server holds the request (nil: it ends by itself).
		ctx  func(t *testing.T) (context.Context, func())
		want []error
	}{
		{"timeout", func(t *testing.T) (context.Context, func()) {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			t.Cleanup(cancel)
			return ctx, nil
		}, []error{context.DeadlineExceeded}},
		{"cancel", func(t *testing.T) (context.Context, func()) {
			ctx, cancel := context.WithCancel(context.Background())
			return ctx, cancel
		}, []error{context.Canceled}},
		{"cancel with cause", func(t *testing.T) (context.Context, func()) {
			ctx, cancel := context.WithCancelCause(context.Background())
			return ctx, func() { cancel(errReplaced) }
		}, []error{context.Canceled, errReplaced}},
	}
	c := newTestClient(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			held := make(chan struct{}, 1)
			release := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				held <- struct{}{}
				select {
				case <-r.Context().Done(): // the client gave up
				case <-release:
				}
			}))
			defer srv.Close()
			defer close(release)
			ctx, end := tt.ctx(t)
			errc := make(chan error, 1)
			go func() { errc <- mustHTTP(t, c, HTTPSpec{URL: srv.URL}).Execute(ctx, testFire()) }()
			// A timeout can end the call before the server holds it (a loaded
			// machine): the error must say so all the same, and the test
			// must not wait for a request that never comes.
			var err error
			select {
			case <-held:
				if end != nil {
					end()
				}
				err = <-errc
			case err = <-errc:
				if end != nil {
					t.Fatalf("Execute returned %v before the server held the request", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the server never got the request")
			}
			for _, target := range tt.want {
				if !errors.Is(err, target) {
					t.Errorf("Execute = %v, want an error wrapping %v", err, target)
				}
			}
			if end != nil && errors.Is(err, ErrNotStarted) {
				t.Errorf("Execute = %v, a request the server held, wraps ErrNotStarted", err)
			}
		})
	}
	t.Run("already ended", func(t *testing.T) {
		srv := newRecorder(t, 200, "")
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := mustHTTP(t, c, HTTPSpec{URL: srv.srv.URL}).Execute(ctx, testFire())
		if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrNotStarted) {
			t.Errorf("Execute = %v, want context.Canceled and ErrNotStarted", err)
		}
		if srv.conns.Load() != 0 {
			t.Errorf("a request was sent with an ended context")
		}
	})
}

func TestHTTP_TransportError(t *testing.T) {
	url := "http://" + etcdtest.RefusedAddr(t) // nothing listens there
	err := mustHTTP(t, newTestClient(t), HTTPSpec{URL: url}).Execute(context.Background(), testFire())
	if err == nil {
		t.Fatal("Execute succeeded against an address that refuses connections")
	}
	if !strings.HasPrefix(err.Error(), "http: ") || strings.Contains(err.Error(), url) {
		t.Errorf("error %q: want an \"http: \" prefix and no repeated URL", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) {
		t.Errorf("error %v does not wrap a net.Error", err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Errorf("connection error %v counts as a timeout or cancel", err)
	}
}

func TestHTTP_ConnectionReuse(t *testing.T) {
	ok := newRecorder(t, 200, "fine")
	failing := newRecorder(t, 500, strings.Repeat("e", 1000))
	c := newTestClient(t)
	okExec := mustHTTP(t, c, HTTPSpec{URL: ok.srv.URL, Body: "b"})
	failExec := mustHTTP(t, c, HTTPSpec{URL: failing.srv.URL})
	for range 20 {
		if err := okExec.Execute(context.Background(), testFire()); err != nil {
			t.Fatal(err)
		}
		if err := failExec.Execute(context.Background(), testFire()); err == nil {
			t.Fatal("500 succeeded")
		}
	}
	if n := ok.conns.Load(); n != 1 {
		t.Errorf("20 sequential fires (2xx) used %d connections, want 1", n)
	}
	if n := failing.conns.Load(); n != 1 {
		t.Errorf("20 sequential fires (500 with a body) used %d connections, want 1", n)
	}
}

func TestHTTP_Concurrent(t *testing.T) {
	srv := newRecorder(t, 200, "")
	e := mustHTTP(t, newTestClient(t), HTTPSpec{URL: srv.srv.URL, Headers: map[string]string{"X-A": "1"}})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			f := testFire()
			f.Attempt = i + 1
			if err := e.Execute(context.Background(), f); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	srv.mu.Lock()
	defer srv.mu.Unlock()
	seen := map[string]bool{}
	for _, r := range srv.reqs {
		seen[r.header.Get(HeaderAttempt)] = true
		if r.header.Get("X-A") != "1" || len(r.header["X-A"]) != 1 {
			t.Errorf("X-A = %q", r.header["X-A"])
		}
	}
	if len(seen) != 16 {
		t.Errorf("saw %d distinct attempts, want 16", len(seen))
	}
}

func TestNewHTTP_Invalid(t *testing.T) {
	c := newTestClient(t)
	tests := []struct {
		name   string
		client *http.Client
		spec   HTTPSpec
	}{
		{"nil client", nil, HTTPSpec{URL: "http://x/"}},
		{"empty url", c, HTTPSpec{}},
		{"relative url", c, HTTPSpec{URL: "/hook"}},
		{"no host", c, HTTPSpec{URL: "http:///hook"}},
		{"ftp", c, HTTPSpec{URL: "ftp://x/"}},
		{"unparsable", c, HTTPSpec{URL: "http://x/%zz"}},
		{"bad method", c, HTTPSpec{URL: "http://x/", Method: "GE T"}},
		{"bad header name", c, HTTPSpec{URL: "http://x/", Headers: map[string]string{"X Y": "1"}}},
		{"control in header value", c, HTTPSpec{URL: "http://x/", Headers: map[string]string{"X": "a\r\nInjected: 1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := NewHTTP(tt.client, tt.spec)
			if !errors.Is(err, ErrInvalidSpec) || e != nil {
				t.Errorf("NewHTTP = %v, %v; want nil, an error wrapping ErrInvalidSpec", e, err)
			}
		})
	}
	if _, err := NewHTTP(c, HTTPSpec{URL: "HTTPS://x:8443/p", Headers: map[string]string{"X": "tab\tok"}}); err != nil {
		t.Errorf("valid spec refused: %v", err)
	}
}

func TestNewClient(t *testing.T) {
	c, err := NewClient(ClientConfig{MaxConnsPerHost: 8})
	if err != nil {
		t.Fatal(err)
	}
	tr := c.Transport.(*http.Transport)
	d := DefaultClientConfig()
	if tr.MaxIdleConnsPerHost != d.MaxIdleConnsPerHost || tr.MaxIdleConns != d.MaxIdleConns ||
		tr.TLSHandshakeTimeout != d.TLSHandshakeTimeout || tr.MaxConnsPerHost != 8 || c.Timeout != 0 {
		t.Errorf("transport not configured from defaults and cfg: %+v", tr)
	}
	for _, cfg := range []ClientConfig{{DialTimeout: -1}, {MaxIdleConnsPerHost: -1}, {ResponseHeaderTimeout: -time.Second}} {
		if _, err := NewClient(cfg); err == nil {
			t.Errorf("NewClient(%+v) accepted a negative field", cfg)
		}
	}
}

func TestOneLine(t *testing.T) {
	tests := []struct {
		in        string
		truncated bool
		want      string
	}{
		{"", false, ""},
		{"  a  b\n\nc  ", false, "a b c"},
		{"\x1b[31mred", false, "\uFFFD[31mred"},
		{"bad \xff utf8", false, "bad \uFFFD utf8"},
		{"cut é"[:len("cut é")-1], true, "cut…"},
	}
	for _, tt := range tests {
		if got := oneLine([]byte(tt.in), tt.truncated); got != tt.want {
			t.Errorf("oneLine(%q, %v) = %q, want %q", tt.in, tt.truncated, got, tt.want)
		}
	}
}

// BenchmarkHTTP measures whole fires against a local server: request
// building, the round trip over a pooled connection, and draining.
func BenchmarkHTTP(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	for _, conc := range []int{1, 32} {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			c := newTestClient(b)
			e := mustHTTP(b, c, HTTPSpec{URL: srv.URL + "/hook", Body: `{"k":1}`,
				Headers: map[string]string{"X-Team": "billing", "Content-Type": "application/json"}})
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			if conc == 1 {
				f := testFire()
				for range b.N {
					if err := e.Execute(ctx, f); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.SetParallelism(max(1, conc/max(1, runtime.GOMAXPROCS(0))))
				b.RunParallel(func(pb *testing.PB) {
					f := testFire()
					for pb.Next() {
						if err := e.Execute(ctx, f); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "fires/s")
		})
	}
}

// BenchmarkHTTPRequest measures building a fire's request alone.
func BenchmarkHTTPRequest(b *testing.B) {
	c := newTestClient(b)
	e := mustHTTP(b, c, HTTPSpec{URL: "http://127.0.0.1:1/hook", Body: `{"k":1}`,
		Headers: map[string]string{"X-Team": "billing", "Content-Type": "application/json"}}).(*httpExec)
	ctx := context.Background()
	f := testFire()
	b.ReportAllocs()
	for b.Loop() {
		_ = e.request(ctx, f)
	}
}

// TestHTTP_StatusReasonIsOneLine: the reason phrase of a status line is
// the target's to write, and Go's client takes any byte but a line break
// in it. The error quoted it as sent, escape sequences included: into the
// history, the task's last_error and its alert, and from there onto the
// terminal of whoever ran task history or task get. It is made one line of
// printable text, as the body's start is.
func TestHTTP_StatusReasonIsOneLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_, _ = http.ReadRequest(bufio.NewReader(conn))
				_, _ = io.WriteString(conn, "HTTP/1.1 500 Oops\x1b]0;owned\x07\x1b[2J\tnow\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			}()
		}
	}()
	err = mustHTTP(t, newTestClient(t), HTTPSpec{URL: "http://" + ln.Addr().String() + "/"}).Execute(context.Background(), testFire())
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 500 {
		t.Fatalf("Execute: %v, want a StatusError 500", err)
	}
	if want := "http: 500 Oops\uFFFD]0;owned\uFFFD\uFFFD[2J now"; err.Error() != want {
		t.Errorf("error %q\nwant      %q", err, want)
	}
}
