package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/shardcron/shardcron/engine"
)

// The seed's design (a Chinese article on etcd-locked cron, the baseline
// of docs/design.md), built as the article builds it:
// every node runs a robfig cron holding every task; on each fire, each node
// creates a concurrency.Session (a lease and its keep-alive) and races for
// the task's concurrency.Mutex with TryLock; the winner submits the task to
// its worker pool (a buffered channel, non-blocking submit), the losers
// close their session.
//
// One change from the article: the winner releases the lock as soon as the
// execution returned, where the article sleeps task.Timeout + 5 s before
// unlocking. That sleep would let a task scheduled every second fire at
// most once every six; releasing early measures the design at its best, at
// the price of duplicates when a slow node locks after the winner already
// released (they are counted).

// seedLockTTL is the session TTL of the article's DistributedLock (s).
const seedLockTTL = 5

// seedNode is one node of the seed's design.
type seedNode struct {
	idx   int
	cli   *clientv3.Client
	reqs  *engine.RequestCounter
	queue chan seedFire
	wg    sync.WaitGroup // the workers
}

type seedFire struct {
	id     string
	sched  time.Time
	unlock func()
}

// tryExecute is the article's Scheduler.tryExecute: lock, submit, unlock
// after the execution.
func (n *seedNode) tryExecute(id string, sched time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unlock, err := n.tryLock(ctx, "/scheduler/lock/"+id)
	if err != nil || unlock == nil {
		return
	}
	select {
	case n.queue <- seedFire{id: id, sched: sched, unlock: unlock}:
	default:
		unlock()
	}
}

// tryLock is the article's DistributedLock.TryLock: nil, nil when another
// node holds the lock.
func (n *seedNode) tryLock(ctx context.Context, key string) (func(), error) {
	session, err := concurrency.NewSession(n.cli, concurrency.WithTTL(seedLockTTL), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("create session failed: %w", err)
	}
	mutex := concurrency.NewMutex(session, key)
	if err := mutex.TryLock(ctx); err != nil {
		_ = session.Close()
		if errors.Is(err, concurrency.ErrLocked) {
			return nil, nil
		}
		return nil, fmt.Errorf("try lock failed: %w", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = mutex.Unlock(ctx)
		_ = session.Close()
	}, nil
}

// runLockPerFire runs the seed's design with cfg.Nodes nodes on one etcd.
func runLockPerFire(ctx context.Context, cfg Config) (*Result, error) {
	c, err := startCluster(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.close() }()
	b := newBaseline(cfg, cfg.Schedule, cfg.Nodes)
	ids := taskIDs(cfg.Tasks)
	var nodes []*seedNode
	var crons []interface{ Stop() context.Context }
	defer func() {
		for _, cr := range crons {
			<-cr.Stop().Done()
		}
		for _, n := range nodes {
			close(n.queue)
			n.wg.Wait()
			_ = n.cli.Close()
		}
	}()
	for i := range cfg.Nodes {
		n := &seedNode{idx: i, reqs: &engine.RequestCounter{}, queue: make(chan seedFire, cfg.Queue)}
		if n.cli, err = c.newClient(n.reqs); err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
		for range cfg.Workers {
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				for f := range n.queue {
					b.observe(n.idx, f.id, f.sched)
					f.unlock()
				}
			}()
		}
		cr, err := newRobfig(cfg, cfg.Schedule, func(t int, at time.Time) { n.tryExecute(ids[t], at) })
		if err != nil {
			return nil, err
		}
		cr.Start()
		crons = append(crons, cr)
	}
	b.count = func() counters {
		k := counters{fires: b.fires.Load()}
		for _, n := range nodes {
			for _, v := range n.reqs.Counts() {
				k.requests += v
			}
		}
		return k
	}
	return b.measure(ctx, LockPerFire, cfg.Nodes, 0)
}
