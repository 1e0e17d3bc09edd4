package membership

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/logbuf"
)

func TestJoin_RegistersUnderLeaseAndCloseRevokes(t *testing.T) {
	c := etcdtest.Start(t)
	cfg := testConfig(c.Client, "node-a")
	cfg.Prefix = "/cluster-x/"
	s := join(t, cfg)

	if s.NodeID() != "node-a" || s.Lease() == clientv3.NoLease {
		t.Fatalf("NodeID %q, Lease %x", s.NodeID(), s.Lease())
	}
	resp, err := c.Client.Get(ctxTimeout(t, 5*time.Second), "/cluster-x/nodes/node-a")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get node key: %v %v", resp, err)
	}
	kv := resp.Kvs[0]
	if clientv3.LeaseID(kv.Lease) != s.Lease() {
		t.Errorf("key lease %x, want the session's %x", kv.Lease, s.Lease())
	}
	var raw map[string]any
	if err := json.Unmarshal(kv.Value, &raw); err != nil {
		t.Fatalf("value %s: %v", kv.Value, err)
	}
	want := map[string]any{"id": "node-a", "api_addr": "127.0.0.1:80", "started_at": "2023-11-14T22:13:20Z", "version": "test"}
	for k, v := range want {
		if raw[k] != v {
			t.Errorf("value field %q = %v, want %v (value %s)", k, raw[k], v, kv.Value)
		}
	}
	if len(raw) != len(want) {
		t.Errorf("value has fields %v, want exactly %v", raw, want)
	}
	if s.Fenced() || s.Err() != nil {
		t.Fatalf("new session: Fenced %v, Err %v", s.Fenced(), s.Err())
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Revoke is applied before Close returns: the key is gone at once.
	resp, err = c.Client.Get(ctxTimeout(t, 5*time.Second), "/cluster-x/nodes/node-a")
	if err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("after Close: key %v, err %v; want no key", resp.Kvs, err)
	}
	ttl, err := c.Client.TimeToLive(ctxTimeout(t, 5*time.Second), s.Lease())
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("after Close: lease TTL %v, err %v; want revoked (-1)", ttl, err)
	}
	waitClosed(t, s.Done(), time.Second, "Done after Close")
	if !errors.Is(s.Err(), ErrClosed) || !s.Fenced() {
		t.Fatalf("after Close: Err %v, Fenced %v", s.Err(), s.Fenced())
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestJoin_DuplicateOfLiveNodeIsRefused(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	first := join(t, testConfig(c.Client, "dup"))

	cli2 := c.NewClient(t)
	_, err := Join(ctxTimeout(t, 20*time.Second), testConfig(cli2, "dup"))
	if !errors.Is(err, ErrNodeExists) {
		t.Fatalf("second Join with a live id: %v, want ErrNodeExists", err)
	}
	if !strings.Contains(err.Error(), `"dup"`) {
		t.Errorf("error %q does not name the id", err)
	}
	if first.Fenced() {
		t.Fatal("the live node was disturbed by the refused Join")
	}

	// A graceful leave frees the id at once.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second := join(t, testConfig(cli2, "dup"))
	assertKeyLease(t, c.Client, "/shardcron/nodes/dup", second.Lease())
}

func TestJoin_AfterCrashWaitsForTheOldLease(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	old := join(t, testConfig(c.NewClient(t), "phoenix"))
	old.crash() // no revoke: the key stays until the lease expires

	cli2 := c.NewClient(t)
	ctx := ctxTimeout(t, 20*time.Second)
	s, err := Join(ctx, testConfig(cli2, "phoenix"))
	if err != nil {
		t.Fatalf("Join after the holder crashed: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	assertKeyLease(t, c.Client, "/shardcron/nodes/phoenix", s.Lease())
	if s.Lease() == old.Lease() {
		t.Fatal("new session reuses the crashed lease")
	}
	// Closing the crashed session finds its lease gone: not an error.
	if err := old.Close(); err != nil {
		t.Fatalf("Close of the crashed session: %v", err)
	}
}

func TestJoin_ContextBoundsTheWait(t *testing.T) {
	c := etcdtest.Start(t)
	join(t, testConfig(c.Client, "busy"))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := Join(ctx, testConfig(c.NewClient(t), "busy"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Join with a short ctx on a held id: %v, want DeadlineExceeded", err)
	}
	// and says it waited for another lease: the caller's deadline may be
	// shorter than a crashed node's lease, which only the caller can say.
	if !errors.Is(err, ErrHeldByLease) {
		t.Fatalf("Join with a short ctx on a held id: %v, want ErrHeldByLease", err)
	}
}

func TestJoin_KeyWithoutLeaseIsRefused(t *testing.T) {
	c := etcdtest.Start(t)
	if _, err := c.Client.Put(ctxTimeout(t, 5*time.Second), "/shardcron/nodes/static", "{}"); err != nil {
		t.Fatal(err)
	}
	_, err := Join(ctxTimeout(t, 10*time.Second), testConfig(c.Client, "static"))
	if !errors.Is(err, ErrNodeExists) {
		t.Fatalf("Join on a key without a lease: %v, want ErrNodeExists", err)
	}
}

func TestSession_DeadlineAdvancesWhileHealthy(t *testing.T) {
	c := etcdtest.Start(t)
	cfg := testConfig(c.Client, "steady")
	cfg.TTL, cfg.KeepAliveInterval, cfg.FenceMargin = 4*time.Second, 100*time.Millisecond, time.Second
	s := join(t, cfg)

	prev := s.Deadline()
	for range 3 {
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return s.Deadline().After(prev) })
		d := s.Deadline()
		// The deadline is the send time of an acknowledged keep-alive plus
		// TTL - margin, and nothing is sent in the future.
		if d.After(time.Now().Add(cfg.TTL - cfg.FenceMargin)) {
			t.Fatalf("deadline %v is more than TTL - margin ahead", time.Until(d))
		}
		prev = d
	}
	if s.Fenced() || s.Err() != nil {
		t.Fatalf("healthy session: Fenced %v, Err %v", s.Fenced(), s.Err())
	}
}

// Keep-alives on an etcd with password authentication log in once, not
// once each. clientv3 logs in (Authenticate: a bcrypt on etcd, queued
// behind every other login) for every gRPC stream it opens, and
// KeepAliveOnce opens one per keep-alive: each keep-alive then waited for
// a login, and a node whose join opened other streams fenced itself
// (TestServer_EtcdTLSAndAuth under -race). A count, not a speed. Not
// parallel: etcd's logins (bcrypt) would load the other tests.
func TestSession_KeepAlivesShareOneLogin(t *testing.T) {
	const password = "keep-alive-pass"
	c := etcdtest.StartCluster(t, etcdtest.Options{RootPassword: password})
	var logins atomic.Int64
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second,
		Username: "root", Password: password, DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if method == "/etcdserverpb.Auth/Authenticate" {
					logins.Add(1)
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	cfg := testConfig(cli, "logged-in")
	cfg.TTL, cfg.KeepAliveInterval, cfg.FenceMargin = 4*time.Second, 100*time.Millisecond, time.Second
	s := join(t, cfg)
	joined := logins.Load()
	const keepAlives = 10
	prev := s.Deadline()
	for range keepAlives {
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return s.Deadline().After(prev) })
		prev = s.Deadline()
	}
	// At most the lock session's keep-alive stream, which the client opens
	// in the background.
	if n := logins.Load() - joined; n > 1 {
		t.Fatalf("%d logins for %d keep-alives after the join's %d", n, keepAlives, joined)
	}
}

func TestSession_FencedBeforeLeaseExpiresWhenCutOff(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	cfg, s, p := joinBehindProxy(t, c, "island", 3*time.Second, 500*time.Millisecond, 1500*time.Millisecond, quiet)
	cli := cfg.Client
	key := "/shardcron/nodes/island"

	cutAt := time.Now()
	p.Cut()
	waitClosed(t, s.Done(), 10*time.Second, "Done after the cut")

	// By construction the lease, refreshed when etcd received a keep-alive
	// sent before the cut, outlives the deadline by the margin: at this
	// moment another client still sees the key.
	assertKeyLease(t, c.Client, key, s.Lease())
	if ttl, err := c.Client.TimeToLive(ctxTimeout(t, 5*time.Second), s.Lease()); err == nil {
		t.Logf("fenced %v after the cut; the lease had %ds left", time.Since(cutAt).Round(time.Millisecond), ttl.TTL)
	}

	if !s.Fenced() || !errors.Is(s.Err(), ErrFenced) {
		t.Fatalf("after Done: Fenced %v, Err %v", s.Fenced(), s.Err())
	}
	d := s.Deadline()
	if time.Now().Before(d) {
		t.Fatalf("Done closed %v before the deadline", time.Until(d))
	}
	// The deadline comes from a keep-alive sent before the cut: Done closed
	// no later than TTL - margin after the last acknowledged keep-alive.
	if d.After(cutAt.Add(cfg.TTL - cfg.FenceMargin)) {
		t.Fatalf("deadline %v after the cut, more than TTL - margin (%v)", d.Sub(cutAt), cfg.TTL-cfg.FenceMargin)
	}
	waitClosed(t, s.Mutexes().Done(), 5*time.Second, "the lock session's Done")

	// Nothing refreshes the lease any more: it expires on the server.
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !keyExists(t, c.Client, key) })

	p.Restore()
	etcdtest.WaitFor(t, 30*time.Second, func() bool {
		_, err := cli.Get(ctxTimeout(t, time.Second), key)
		return err == nil
	})
	if err := s.Close(); err != nil {
		t.Fatalf("Close after the lease expired: %v", err)
	}
}

func TestSession_FencedSessionStopsRefreshing(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	s := join(t, testConfig(c.Client, "paused"))

	// As if the process had been paused past its deadline.
	s.deadline.Store(0)
	if !s.Fenced() {
		t.Fatal("Fenced() false past the deadline")
	}
	waitClosed(t, s.Done(), time.Second, "Done")
	if !errors.Is(s.Err(), ErrFenced) {
		t.Fatalf("Err %v, want ErrFenced", s.Err())
	}
	// A late acknowledgement does not revive the session.
	d := s.Deadline()
	s.extend(s.now() + int64(time.Hour))
	if !s.Deadline().Equal(d) || !s.Fenced() {
		t.Fatalf("fenced session moved its deadline or unfenced: %v, %v", s.Deadline(), s.Fenced())
	}
	waitClosed(t, s.Mutexes().Done(), 5*time.Second, "the lock session's Done")

	// Neither our loop nor the client's KeepAlive refreshes the lease now:
	// etcd expires it without Close.
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !keyExists(t, c.Client, "/shardcron/nodes/paused") })
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func TestSession_RevokedLeaseEndsSession(t *testing.T) {
	c := etcdtest.Start(t)
	cfg := testConfig(c.NewClient(t), "revoked")
	cfg.KeepAliveInterval = 100 * time.Millisecond
	s := join(t, cfg)
	if _, err := c.Client.Revoke(ctxTimeout(t, 5*time.Second), s.Lease()); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, s.Done(), 10*time.Second, "Done after revoke")
	if !errors.Is(s.Err(), ErrLeaseLost) || !s.Fenced() {
		t.Fatalf("Err %v, Fenced %v; want ErrLeaseLost, true", s.Err(), s.Fenced())
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func TestSession_CloseReleasesLocksAtOnce(t *testing.T) {
	c := etcdtest.Start(t)
	a := join(t, testConfig(c.NewClient(t), "a"))
	b := join(t, testConfig(c.NewClient(t), "b"))
	const lock = "/shardcron/locks/0007"

	ma := concurrency.NewMutex(a.Mutexes(), lock)
	if err := ma.Lock(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatalf("a locks: %v", err)
	}
	mb := concurrency.NewMutex(b.Mutexes(), lock)
	if err := mb.TryLock(ctxTimeout(t, 5*time.Second)); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("b TryLock while a holds it: %v, want ErrLocked", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// No lease expiry to wait for: the revoke removed a's lock key.
	if err := mb.TryLock(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatalf("b TryLock after a closed: %v", err)
	}
}

func assertKeyLease(t *testing.T, cli *clientv3.Client, key string, lease clientv3.LeaseID) {
	t.Helper()
	resp, err := cli.Get(ctxTimeout(t, 5*time.Second), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("key %s missing", key)
	}
	if got := clientv3.LeaseID(resp.Kvs[0].Lease); got != lease {
		t.Fatalf("key %s under lease %x, want %x", key, got, lease)
	}
}

func keyExists(t *testing.T, cli *clientv3.Client, key string) bool {
	t.Helper()
	resp, err := cli.Get(ctxTimeout(t, 5*time.Second), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return len(resp.Kvs) > 0
}

func TestSession_CloseAfterClientClosedReturns(t *testing.T) {
	c := etcdtest.Start(t)
	cli := c.NewClient(t)
	cfg := testConfig(cli, "orphan")
	cfg.Info.StartedAt = time.Time{}
	s := join(t, cfg)
	ms, _, err := List(ctxTimeout(t, 5*time.Second), c.Client, "")
	if err != nil || len(ms) != 1 || ms[0].Info.StartedAt.IsZero() {
		t.Fatalf("List = %+v, %v; want one member with StartedAt set by Join", ms, err)
	}
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	// The revoke fails (the client is gone) but Close neither hangs nor
	// leaks: the lease is left to expire.
	if err := s.Close(); err == nil {
		t.Fatal("Close with a closed client reported a successful revoke")
	}
	if !errors.Is(s.Err(), ErrClosed) && !errors.Is(s.Err(), ErrLeaseLost) && !errors.Is(s.Err(), ErrFenced) {
		t.Fatalf("Err %v", s.Err())
	}
}

func BenchmarkSession_Fenced(b *testing.B) {
	s := &Session{base: time.Now(), done: make(chan struct{})}
	s.deadline.Store(int64(time.Hour))
	b.ReportAllocs()
	for b.Loop() {
		if s.Fenced() {
			b.Fatal("fenced")
		}
	}
}

// TestSession_PublishKeepsIdentityAndLeaving: Publish changes what the
// node advertises (its capabilities), never its id, start time or leaving
// mark, and Leave keeps what was published.
func TestSession_PublishKeepsIdentityAndLeaving(t *testing.T) {
	c := etcdtest.Start(t)
	s := join(t, testConfig(c.Client, "cap"))
	started := s.Info().StartedAt
	ctx := ctxTimeout(t, 5*time.Second)
	if err := s.Publish(ctx, NodeInfo{ID: "other", APIAddr: "127.0.0.1:81", Exec: true, Handlers: []string{"a", "b"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(ctx, NodeInfo{APIAddr: "127.0.0.1:81", Exec: true, Handlers: []string{"a", "b", "c"}}); err != nil {
		t.Fatal(err)
	}
	ms, _, err := List(ctx, c.Client, "")
	if err != nil || len(ms) != 1 {
		t.Fatalf("List = %+v, %v", ms, err)
	}
	got := ms[0].Info
	if got.ID != "cap" || !got.StartedAt.Equal(started) || !got.Leaving || !got.Exec ||
		!slices.Equal(got.Handlers, []string{"a", "b", "c"}) || got.APIAddr != "127.0.0.1:81" {
		t.Fatalf("published %+v", got)
	}
}

// TestSession_CloseLogsOnceTheRevocationIsOver: Close announces the
// session closed after the revocation, with its outcome. It logged
// "session closed" first, and the revocation then failed a TTL later,
// cut off from etcd, with nothing in the log between the two.
func TestSession_CloseLogsOnceTheRevocationIsOver(t *testing.T) {
	c := etcdtest.Start(t)
	p := c.NewProxy(t)
	var buf logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))

	cfg := testConfig(c.NewClient(t), "reached")
	cfg.Logger = log
	if err := join(t, cfg).Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `msg="membership: session closed, its lease revoked"`) {
		t.Fatalf("a revoked lease is not said so:\n%s", buf.String())
	}

	cfg = testConfig(c.NewClient(t, p.Endpoint()), "cut")
	cfg.Logger = log
	s := join(t, cfg)
	p.Cut()
	if err := s.Close(); err == nil {
		t.Fatal("Close cut off from etcd reported a revoked lease")
	}
	var lines []string
	for line := range strings.Lines(buf.String()) {
		if strings.Contains(line, "node=cut") && strings.Contains(line, "session closed") {
			lines = append(lines, line)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "its lease was not revoked") || !strings.Contains(lines[0], "err=") {
		t.Fatalf("want one line saying the session closed without its lease revoked, and why; got %q", lines)
	}
}

// An outage shorter than the fencing deadline does not fence: the
// keep-alive that failed closed its stream, and the next one opens
// another once etcd answers (kept, a broken stream failed every
// keep-alive after it, and the session fenced with etcd back).
func TestSession_OutageShorterThanTheDeadlineDoesNotFence(t *testing.T) {
	t.Parallel()
	var buf logbuf.Buffer
	_, s, p := joinBehindProxy(t, etcdtest.Start(t), "blip", 20*time.Second, 100*time.Millisecond, 2*time.Second, slog.New(slog.NewTextHandler(&buf, nil)))
	p.Cut()
	// Until a keep-alive failed, however slow the machine: the deadline
	// is 18 s away. A cut for a fixed time passed on a machine too slow to
	// send one within it, checking nothing.
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return strings.Contains(buf.String(), "keep-alive failed") })
	cut := s.Deadline()
	p.Restore()
	etcdtest.WaitFor(t, 15*time.Second, func() bool { return s.Deadline().After(cut) || s.Fenced() })
	if s.Fenced() || s.Err() != nil {
		t.Fatalf("after an outage of a second: Fenced %v, Err %v", s.Fenced(), s.Err())
	}
}

// joinBehindProxy joins node id to c through a proxy the test can cut,
// with the given lease TTL, keep-alive interval and fence margin, logging
// to log, and waits for a keep-alive through, so that the deadline comes
// from the session's loop.
func joinBehindProxy(t *testing.T, c *etcdtest.Cluster, id string, ttl, interval, margin time.Duration, log *slog.Logger) (Config, *Session, *etcdtest.Proxy) {
	t.Helper()
	p := c.NewProxy(t)
	cfg := testConfig(c.NewClient(t, p.Endpoint()), id)
	cfg.TTL, cfg.KeepAliveInterval, cfg.FenceMargin, cfg.Logger = ttl, interval, margin, log
	s := join(t, cfg)
	first := s.Deadline()
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return s.Deadline().After(first) })
	return cfg, s, p
}
