package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/etcdembed"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/store"
)

// handlerName is the in-process handler the keyed tasks call.
const handlerName = "bench"

// cluster is an embedded etcd and the in-process nodes on it.
type cluster struct {
	cfg    Config
	dir    string
	ownDir bool
	etcd   *etcdembed.Server
	admin  *clientv3.Client
	reg    *registry.Registry
	log    *slog.Logger

	mu    sync.Mutex // guards nodes
	nodes []*node
	rec   *recorder // set before the first node starts; nil: fires are not observed
}

// node is one in-process engine with its own etcd client.
type node struct {
	idx    int
	id     string
	eng    *engine.Engine
	cli    *clientv3.Client
	reqs   *engine.RequestCounter
	st     *store.Store
	dead   bool     // killed: the cluster no longer counts it; guarded by cluster.mu
	frozen counters // its counters when it was killed
}

// startCluster starts the embedded etcd; nodes come with addNode.
func startCluster(ctx context.Context, cfg Config) (*cluster, error) {
	c := &cluster{cfg: cfg, dir: cfg.Dir}
	if c.dir == "" {
		d, err := os.MkdirTemp("", "shardcron-bench-")
		if err != nil {
			return nil, fmt.Errorf("bench: work directory: %w", err)
		}
		c.dir, c.ownDir = d, true
	}
	// Engines log warnings that say why a run went wrong; the rest is
	// noise next to the progress lines.
	c.log = slog.New(slog.NewTextHandler(cfg.Progress, &slog.HandlerOptions{Level: slog.LevelError}))
	var err error
	c.etcd, err = etcdembed.Start(etcdembed.Config{
		Name: "bench", Dir: filepath.Join(c.dir, "etcd"), LogFile: filepath.Join(c.dir, "etcd.log"),
		Fast: true, QuotaBytes: 8 << 30,
	})
	if err != nil {
		c.close()
		return nil, fmt.Errorf("bench: %w", err)
	}
	if c.admin, err = c.newClient(nil); err != nil {
		c.close()
		return nil, err
	}
	if c.reg, err = registry.OpenRegistry(ctx, c.admin, engine.DefaultPrefix, cfg.Partitions); err != nil {
		c.close()
		return nil, fmt.Errorf("bench: open registry: %w", err)
	}
	return c, nil
}

func (c *cluster) newClient(reqs *engine.RequestCounter) (*clientv3.Client, error) {
	cc := clientv3.Config{
		Endpoints: []string{c.etcd.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		MaxCallSendMsgSize: 8 << 20, MaxCallRecvMsgSize: 64 << 20,
	}
	if reqs != nil {
		cc.DialOptions = reqs.DialOptions()
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("bench: etcd client: %w", err)
	}
	return cli, nil
}

// addNode starts node number len(nodes), with a Badger cache in the work
// directory when cached is set. It returns once the node is a member; it is
// Ready later.
func (c *cluster) addNode(ctx context.Context, cached bool) (*node, error) {
	c.mu.Lock()
	idx := len(c.nodes)
	c.mu.Unlock()
	return c.startNode(ctx, idx, cached)
}

func (c *cluster) startNode(ctx context.Context, idx int, cached bool) (*node, error) {
	n := &node{idx: idx, id: fmt.Sprintf("bench-%d", idx), reqs: &engine.RequestCounter{}}
	var err error
	if n.cli, err = c.newClient(n.reqs); err != nil {
		return nil, err
	}
	if cached {
		sc := store.DefaultConfig(filepath.Join(c.dir, "cache-"+n.id))
		sc.History, sc.Logger = store.HistoryNone, c.log
		if n.st, err = store.Open(sc); err != nil {
			n.cli.Close()
			return nil, fmt.Errorf("bench: open cache of %s: %w", n.id, err)
		}
	}
	ec := c.cfg.engineConfig(n.id)
	ec.Requests, ec.Logger = n.reqs, c.log
	if n.eng, err = engine.New(ec, n.cli, n.st); err != nil {
		n.close()
		return nil, fmt.Errorf("bench: %w", err)
	}
	if rec := c.rec; rec != nil {
		n.eng.Handle(handlerName, func(_ context.Context, f engine.Fire) error {
			rec.observe(idx, f.TaskID, f.ScheduledAt, time.Now())
			return nil
		})
	}
	if err := n.eng.Start(ctx); err != nil {
		n.close()
		return nil, fmt.Errorf("bench: start %s: %w", n.id, err)
	}
	c.mu.Lock()
	if idx == len(c.nodes) {
		c.nodes = append(c.nodes, n)
	} else {
		c.nodes[idx] = n
	}
	c.mu.Unlock()
	return n, nil
}

// live returns the nodes that run and were not killed.
func (c *cluster) live() []*node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*node
	for _, n := range c.nodes {
		if n != nil && n.eng != nil && !n.dead {
			out = append(out, n)
		}
	}
	return out
}

// close stops the node gracefully (partitions released) and its client.
func (n *node) close() error {
	var errs []error
	if n.eng != nil {
		errs = append(errs, n.eng.Close())
		n.eng = nil
	}
	if n.st != nil {
		errs = append(errs, n.st.Close())
		n.st = nil
	}
	if n.cli != nil {
		errs = append(errs, n.cli.Close())
		n.cli = nil
	}
	return errors.Join(errs...)
}

// kill cuts node idx off as a crash would: its client is closed, so it
// writes nothing more to etcd, and the recorder drops its later fires. The
// engine is closed at the end of the run; it is fenced long before.
func (c *cluster) kill(idx int) {
	c.mu.Lock()
	n := c.nodes[idx]
	n.frozen = n.counters()
	n.dead = true
	c.mu.Unlock()
	if c.rec != nil {
		c.rec.kill(idx, time.Now())
	}
	_ = n.cli.Close()
}

// waitReady waits until every live node is Ready and they hold want tasks
// between them (want < 0: any number).
func (c *cluster) waitReady(ctx context.Context, want int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ready, tasks := true, 0
		for _, n := range c.live() {
			s := n.eng.Stats()
			ready = ready && s.Ready
			tasks += s.Tasks
		}
		if ready && (want < 0 || tasks == want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench: nodes not ready with %d tasks after %v (ready %v, %d tasks loaded)", want, timeout, ready, tasks)
		case <-tick.C:
		}
	}
}

// counters are the nodes' counters summed.
type counters struct {
	fires, misfires, requests uint64
}

// counters sums the counters of every node, those of killed nodes as they
// were when they were killed.
func (c *cluster) counters() counters {
	c.mu.Lock()
	nodes := slices.Clone(c.nodes)
	c.mu.Unlock()
	var s counters
	for _, n := range nodes {
		k := n.frozen
		if !n.dead {
			k = n.counters()
		}
		s.fires += k.fires
		s.misfires += k.misfires
		s.requests += k.requests
	}
	return s
}

func (n *node) counters() counters {
	st := n.eng.Stats()
	k := counters{fires: st.Fires, misfires: st.Misfires}
	for _, v := range n.reqs.Counts() {
		k.requests += v
	}
	return k
}

// close stops every node, etcd, and removes the work directory it made.
func (c *cluster) close() error {
	var errs []error
	c.mu.Lock()
	nodes := c.nodes
	c.mu.Unlock()
	for _, n := range nodes {
		if n.dead {
			_ = n.close() // its client is gone: the release fails, as a crash's would
			continue
		}
		errs = append(errs, n.close())
	}
	if c.admin != nil {
		_ = c.admin.Close()
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
	if c.ownDir {
		errs = append(errs, os.RemoveAll(c.dir))
	}
	return errors.Join(errs...)
}
