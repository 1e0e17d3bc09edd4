package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

func TestMain(m *testing.M) {
	// Nothing ignored: every test stops what it started (HTTP servers and
	// their clients' idle connections, API servers, engines, stores, etcd).
	goleak.VerifyTestMain(m)
}

// fireLog records the fires handler "h" saw.
type fireLog struct {
	mu    sync.Mutex // guards fires
	fires []engine.Fire
}

func (l *fireLog) handler(ctx context.Context, f engine.Fire) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fires = append(l.fires, f)
	return nil
}

// fired reports whether the task fired at scheduled time at.
func (l *fireLog) fired(id string, at time.Time) bool {
	return l.any(func(f engine.Fire) bool { return f.TaskID == id && f.ScheduledAt.Equal(at) })
}

// any reports whether a fire the handler saw satisfies match.
func (l *fireLog) any(match func(engine.Fire) bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.fires, match)
}

// count returns how many fires the handler saw.
func (l *fireLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.fires)
}

// firedAfter reports whether task id fired at a scheduled time after t.
func (l *fireLog) firedAfter(id string, t time.Time) bool {
	return l.any(func(f engine.Fire) bool { return f.TaskID == id && f.ScheduledAt.After(t) })
}

// testNode is an engine with a Badger store, served by a Server on an
// httptest server whose address the engine publishes.
type testNode struct {
	e     *engine.Engine
	st    *store.Store
	srv   *Server
	ts    *httptest.Server
	c     *client.Client // no token
	fires *fireLog
	hang  atomic.Bool // while set, every request hangs until its client gives up
}

type nodeOptions struct {
	id        string
	token     string
	allowExec bool
	execAllow []string // --exec-allow
	httpAllow []string // --http-allow
}

const testPartitions = 16

var testLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// startNode starts a node against c and waits until it is ready. It is
// stopped when the test ends: HTTP server, API server, engine, store.
func startNode(t testing.TB, c *etcdtest.Cluster, o nodeOptions) *testNode {
	t.Helper()
	ts := httptest.NewUnstartedServer(nil)
	st, err := store.Open(store.DefaultConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	// A client of its own, counting requests, for shardcron_etcd_requests_total.
	rc := &engine.RequestCounter{}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second,
		DialOptions: rc.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.DefaultConfig(o.id)
	cfg.APIAddr = ts.Listener.Addr().String()
	cfg.Version = "test-1"
	cfg.AllowExec = o.allowExec
	cfg.ExecAllow, cfg.HTTPAllow = o.execAllow, o.httpAllow
	cfg.Partitions = testPartitions
	cfg.LeaseTTL = 2 * time.Second
	cfg.Workers, cfg.Queue, cfg.BatchSize = 4, 1024, 256
	cfg.DrainTimeout = 5 * time.Second
	cfg.Requests = rc
	cfg.Logger = testLog
	e, err := engine.New(cfg, cli, st)
	if err != nil {
		t.Fatal(err)
	}
	fires := &fireLog{}
	e.Handle("h", fires.handler)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Engine: e, AuthToken: o.token, Version: "test-1", Logger: testLog})
	if err != nil {
		t.Fatal(err)
	}
	n := &testNode{e: e, st: st, srv: srv, ts: ts, fires: fires}
	h := srv.Handler()
	ts.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.hang.Load() {
			<-r.Context().Done()
			return
		}
		h.ServeHTTP(w, r)
	})
	ts.Start()
	n.c = &client.Client{BaseURL: ts.URL, HTTP: ts.Client()}
	t.Cleanup(func() {
		ts.Close()
		_ = srv.Close()
		if err := e.Close(); err != nil {
			t.Errorf("close engine: %v", err)
		}
		if err := st.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
		_ = cli.Close()
	})
	etcdtest.WaitFor(t, 20*time.Second, e.Ready)
	return n
}

// client returns a client of n sending token.
func (n *testNode) client(token string) *client.Client {
	return &client.Client{BaseURL: n.ts.URL, Token: token, HTTP: n.ts.Client()}
}

// serve starts another Server on n's engine with cfg (Engine filled in),
// on its own httptest server, closed when the test ends.
func (n *testNode) serve(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	cfg.Engine = n.e
	if cfg.Logger == nil {
		cfg.Logger = testLog
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); _ = srv.Close() })
	return srv, ts
}

// answer is a raw HTTP answer.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) String() string { return http.StatusText(a.status) + ": " + string(a.body) }

// call sends a raw request to ts and returns its answer. hdr holds header
// names and values in turn; a "Host" one sets the request's Host, as a
// browser sends the name it resolved (Go's client ignores a Host header).
func call(t *testing.T, ts *httptest.Server, method, path, body string, hdr ...string) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, ts.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}

// wantError checks that a is a JSON error with the status whose message
// contains every one of parts.
func wantError(t *testing.T, a answer, status int, parts ...string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d; body %s", a.status, status, a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json; body %s", ct, a.body)
	}
	var body struct {
		Error *string `json:"error"`
	}
	if err := json.Unmarshal(a.body, &body); err != nil || body.Error == nil || *body.Error == "" {
		t.Fatalf("body %s is not {\"error\": ...}", a.body)
	}
	msg := *body.Error
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Fatalf("error %q does not contain %q", msg, p)
		}
	}
}

func handlerTask(id, spec string) *task.Task {
	return &task.Task{ID: id, Schedule: spec, Executor: task.Executor{Type: task.ExecutorHandler, Name: "h"}}
}
