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
	"google.golang.org/grpc"

	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/etcdembed"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/store"
)

// handlerName is the in-process handler the keyed tasks call.
const handlerName = "bench"

// cluster is an embedded etcd (or the one of Config.Etcd) and the nodes
// on it.
type cluster struct {
	cfg      Config
	dir      string
	ownDir   bool
	etcd     *etcdembed.Server // nil with Config.Etcd
	endpoint string            // etcd's client URL
	admin    *clientv3.Client
	reg      *registry.Registry
	log      *slog.Logger

	mu    sync.Mutex // guards nodes and retired
	nodes []*node
	// retired are the counters of the nodes that went and were started
	// again (startNode at their index), as they were when they went.
	retired counters
	rec     *recorder // set before the first node starts; nil: fires are not observed
}

// node is one node of the cluster: an in-process engine with its own etcd
// client, or (Config.Procs) a 'shardcron server' process.
type node struct {
	idx  int
	id   string
	eng  *engine.Engine // in-process; nil for a process
	cli  *clientv3.Client
	icli *clientv3.Client // the registry's index reads (registry.WithIndexClient)
	reqs *engine.RequestCounter
	st   *store.Store
	proc *procNode // a process; nil in-process
	// gone: killed or left, so the cluster no longer counts it, and
	// frozen holds its counters as they were then; guarded by cluster.mu.
	gone   bool
	killed bool
	frozen counters
}

// startCluster starts the embedded etcd, or with Config.Etcd connects to
// that one; nodes come with addNode.
func startCluster(ctx context.Context, cfg Config) (*cluster, error) {
	c := &cluster{cfg: cfg, dir: cfg.Dir}
	// Engines log warnings that say why a run went wrong; the rest is
	// noise next to the progress lines.
	c.log = slog.New(slog.NewTextHandler(cfg.Progress, &slog.HandlerOptions{Level: slog.LevelError}))
	if cfg.Etcd != "" {
		if err := c.connect(ctx, cfg.Etcd); err != nil {
			return nil, err
		}
		return c, nil
	}
	if c.dir != "" {
		if err := os.MkdirAll(c.dir, 0o700); err != nil {
			return nil, fmt.Errorf("bench: work directory: %w", err)
		}
	} else {
		d, err := os.MkdirTemp("", "shardcron-bench-")
		if err != nil {
			return nil, fmt.Errorf("bench: work directory: %w", err)
		}
		c.dir, c.ownDir = d, true
	}
	var err error
	c.etcd, err = etcdembed.Start(ctx, etcdembed.Config{
		Name: "bench", Dir: filepath.Join(c.dir, "etcd"), LogFile: filepath.Join(c.dir, "etcd.log"),
		Fast: true, QuotaBytes: 8 << 30,
	})
	if err != nil {
		c.close()
		return nil, fmt.Errorf("bench: %w", err)
	}
	if err := c.connect(ctx, c.etcd.Endpoint); err != nil {
		return nil, err
	}
	return c, nil
}

// connect opens the admin client and the registry on etcd at endpoint; on
// an error it closes what the cluster started.
func (c *cluster) connect(ctx context.Context, endpoint string) error {
	c.endpoint = endpoint
	var err error
	if c.admin, err = c.newClient(nil); err != nil {
		c.close()
		return err
	}
	if c.reg, err = registry.OpenRegistry(ctx, c.admin, engine.DefaultPrefix, c.cfg.Partitions); err != nil {
		c.close()
		return fmt.Errorf("bench: open registry: %w", err)
	}
	return nil
}

func (c *cluster) newClient(reqs *engine.RequestCounter, dial ...grpc.DialOption) (*clientv3.Client, error) {
	cc := clientv3.Config{
		Endpoints: []string{c.endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		MaxCallSendMsgSize: 8 << 20, MaxCallRecvMsgSize: 64 << 20, DialOptions: dial,
	}
	if reqs != nil {
		cc.DialOptions = append(reqs.DialOptions(), dial...)
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
	if c.cfg.Procs {
		args := procArgs(c.cfg, n.id, c.endpoint, filepath.Join(c.dir, "data-"+n.id))
		p, err := startProc(ctx, c.cfg.Binary, args, logPath(c.dir, n.id), readyTimeout(c.cfg))
		if err != nil {
			return nil, fmt.Errorf("%w (node %s)", err, n.id)
		}
		n.proc = p
	} else if err := c.startEngine(ctx, n, cached); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if idx == len(c.nodes) {
		c.nodes = append(c.nodes, n)
	} else {
		gone := c.nodes[idx].frozen
		gone.rss = 0 // a node gone has none
		c.retired = c.retired.plus(gone)
		c.nodes[idx] = n
	}
	c.mu.Unlock()
	return n, nil
}

// startEngine starts n as an in-process engine.
func (c *cluster) startEngine(ctx context.Context, n *node, cached bool) error {
	var err error
	if n.cli, err = c.newClient(n.reqs); err != nil {
		return err
	}
	if n.icli, err = c.newClient(n.reqs, registry.IndexDialOptions()...); err != nil {
		n.close()
		return err
	}
	if cached {
		sc := store.DefaultConfig(filepath.Join(c.dir, "cache-"+n.id))
		sc.History, sc.Logger = store.HistoryNone, c.log
		if n.st, err = store.Open(sc); err != nil {
			n.cli.Close()
			return fmt.Errorf("bench: open cache of %s: %w", n.id, err)
		}
	}
	ec := c.cfg.engineConfig(n.id)
	ec.Requests, ec.Logger, ec.IndexClient = n.reqs, c.log, n.icli
	if n.eng, err = engine.New(ec, n.cli, n.st); err != nil {
		n.close()
		return fmt.Errorf("bench: %w", err)
	}
	if rec := c.rec; rec != nil {
		idx := n.idx
		n.eng.Handle(handlerName, func(_ context.Context, f engine.Fire) error {
			rec.observe(idx, f.TaskID, f.ScheduledAt, time.Now())
			return nil
		})
	}
	if err := n.eng.Start(ctx); err != nil {
		n.close()
		return fmt.Errorf("bench: start %s: %w", n.id, err)
	}
	return nil
}

// live returns the nodes that run and were neither killed nor left.
func (c *cluster) live() []*node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*node
	for _, n := range c.nodes {
		if n != nil && !n.gone && (n.eng != nil || n.proc != nil) {
			out = append(out, n)
		}
	}
	return out
}

// close stops the node gracefully (partitions released) and its client.
func (n *node) close() error {
	var errs []error
	if n.proc != nil {
		errs = append(errs, n.proc.stop())
	}
	if n.eng != nil {
		errs = append(errs, n.eng.Close())
		n.eng = nil
	}
	if n.st != nil {
		errs = append(errs, n.st.Close())
		n.st = nil
	}
	for _, cli := range []**clientv3.Client{&n.cli, &n.icli} {
		if *cli != nil {
			errs = append(errs, (*cli).Close())
			*cli = nil
		}
	}
	return errors.Join(errs...)
}

// kill cuts node idx off as a crash would: a process gets SIGKILL; an
// in-process node's client is closed, so it writes nothing more to etcd,
// and the recorder drops its later fires (its engine is closed at the end
// of the run; it is fenced long before).
func (c *cluster) kill(ctx context.Context, idx int) {
	c.mu.Lock()
	n := c.nodes[idx]
	c.mu.Unlock()
	k := n.counters(ctx)
	c.mu.Lock()
	n.frozen, n.gone, n.killed = k, true, true
	c.mu.Unlock()
	if c.rec != nil {
		c.rec.kill(idx, time.Now())
	}
	if n.proc != nil {
		n.proc.kill()
		return
	}
	_ = n.cli.Close()
}

// leave stops node idx gracefully (SIGTERM for a process) and waits until
// it has released its partitions and stopped, its cache closed as a
// server closes it. Its counters stay in the cluster's sums as they were
// when it stopped.
func (c *cluster) leave(ctx context.Context, idx int) error {
	c.mu.Lock()
	n := c.nodes[idx]
	c.mu.Unlock()
	var err error
	if n.proc != nil {
		err = n.proc.stop()
	} else {
		err = n.eng.Close()
	}
	// A process's counters are those of its last scrape, at most a second
	// before it stopped; an engine's are read after its Close.
	k := n.counters(ctx)
	c.mu.Lock()
	n.frozen, n.gone = k, true
	c.mu.Unlock()
	if n.proc == nil {
		n.eng = nil // closed: gone, so no reader of the cluster's looks at it
		err = errors.Join(err, n.close())
	}
	if err != nil {
		return fmt.Errorf("bench: %s leaves: %w", n.id, err)
	}
	return nil
}

// waitReady waits until every live node is Ready and they hold want tasks
// between them (want < 0: any number).
func (c *cluster) waitReady(ctx context.Context, want int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// A process is asked over HTTP: less often, so as not to load it.
	every := 20 * time.Millisecond
	if c.cfg.Procs {
		every = 100 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		ready, tasks := true, 0
		for _, n := range c.live() {
			r, t := n.ready(ctx)
			ready = ready && r
			tasks += t
		}
		if ready && (want < 0 || tasks == want) {
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				// Interrupted, not slow: say so rather than time out.
				return fmt.Errorf("bench: waiting for the nodes to load their tasks: %w", ctx.Err())
			}
			return fmt.Errorf("bench: nodes not ready with %d tasks after %v (ready %v, %d tasks loaded)", want, timeout, ready, tasks)
		case <-tick.C:
		}
	}
}

// ready reports whether the node is Ready, and how many tasks it holds.
func (n *node) ready(ctx context.Context) (bool, int) {
	if n.proc != nil {
		_, ready, tasks, err := n.proc.scrape(ctx)
		return ready && err == nil, tasks
	}
	s := n.eng.Stats()
	return s.Ready, s.Tasks
}

// counters are the nodes' counters summed. cpu and rss are those of node
// processes; in-process nodes leave them 0 (the bench's process has them).
type counters struct {
	fires, misfires, requests uint64
	cpu                       time.Duration
	rss                       uint64
}

func (k counters) plus(o counters) counters {
	return counters{fires: k.fires + o.fires, misfires: k.misfires + o.misfires, requests: k.requests + o.requests,
		cpu: k.cpu + o.cpu, rss: k.rss + o.rss}
}

// counters sums the counters of every node, those of nodes that are gone
// as they were when they went (their RSS then counts no more).
func (c *cluster) counters() counters {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.mu.Lock()
	nodes, s := slices.Clone(c.nodes), c.retired
	c.mu.Unlock()
	for _, n := range nodes {
		c.mu.Lock()
		k, gone := n.frozen, n.gone
		c.mu.Unlock()
		if !gone {
			k = n.counters(ctx)
		} else {
			k.rss = 0
		}
		s = s.plus(k)
	}
	return s
}

func (n *node) counters(ctx context.Context) counters {
	if n.proc != nil {
		k, _, _, _ := n.proc.scrape(ctx) // on failure: the last scrape's
		return k
	}
	st := n.eng.Stats()
	k := counters{fires: st.Fires, misfires: st.Misfires}
	for _, v := range n.reqs.Counts() {
		k.requests += v
	}
	return k
}

// owners returns the owner index of every partition in the current ring
// of node n (-1: no owner yet).
func (n *node) owners(ctx context.Context, partitions int) ([]int, error) {
	if n.proc != nil {
		return n.proc.owners(ctx, partitions)
	}
	a := n.eng.Assignment()
	out := make([]int, partitions)
	for p := range out {
		out[p] = -1
		if a != nil {
			out[p] = nodeIndex(a.Owner(p))
		}
	}
	return out, nil
}

// close stops every node, etcd, and removes the work directory it made.
func (c *cluster) close() error {
	var errs []error
	c.mu.Lock()
	nodes := c.nodes
	c.mu.Unlock()
	for _, n := range nodes {
		if n.killed {
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
