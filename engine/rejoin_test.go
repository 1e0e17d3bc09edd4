package engine

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/logbuf"
)

// A node fenced while etcd is down cannot revoke its session's lease, and
// etcd, when it comes back, gives every lease a full TTL again: the node
// rejoined only once its own old lease had expired a second time, and the
// locks held under that lease kept its partitions from every node as long
// (a 3-node drill restarting the etcd of node 1: no node fired for 11 s
// after etcd was back). The rejoining node knows that lease is its own
// and over: it revokes it and joins at once.
func TestEngine_RejoinAfterAnEtcdRestartRevokesTheOldLease(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	proxy := c.NewProxy(t)
	var buf logbuf.Buffer
	n := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", nil, func(cfg *Config) {
		cfg.LeaseTTL = 3 * time.Second
		cfg.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	sess := n.e.sess.Load()
	old := sess.Lease()
	m := c.Members[0]
	proxy.Cut()
	m.Stop()
	etcdtest.WaitFor(t, 10*time.Second, sess.Fenced)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return strings.Contains(buf.String(), "dropped partitions") })
	time.Sleep(4 * time.Second) // the fenced session's revoke gives up (TTL)
	m.Restart(t)
	if ttl, err := c.NewClient(t).TimeToLive(t.Context(), old); err != nil || ttl.TTL <= 0 {
		t.Fatalf("the old lease is not alive after etcd's restart (ttl %v, err %v): the test sets up nothing", ttl, err)
	}
	proxy.Restore()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return n.e.sess.Load() != sess && n.e.Ready() })
	if strings.Contains(buf.String(), "held by another lease") {
		t.Errorf("the node waited for its own old lease to expire:\n%s", buf.String())
	}
}
