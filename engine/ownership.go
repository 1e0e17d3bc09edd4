package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/shardcron/shardcron/membership"
)

// checkpoint is /<prefix>/checkpoints/<partition>: where the partition's
// last owner got to.
type checkpoint struct {
	Node      string    `json:"node"`
	Watermark time.Time `json:"watermark"`
	Released  bool      `json:"released"`
}

// owned is a partition this node holds.
type owned struct {
	mu    *concurrency.Mutex
	fence int64
	stop  context.CancelFunc // ends its watch
	done  chan struct{}      // closed when the watch ended
}

type acquired struct {
	p    int
	part *owned
	err  error
}

// coordinate keeps the node's partitions in line with the ring, session
// after session, until ctx ends; then it releases them all.
func (e *Engine) coordinate(ctx context.Context, sess *membership.Session) {
	for {
		e.serve(ctx, sess)
		if ctx.Err() != nil {
			return
		}
		// Fenced: everything was dropped. Rejoin with a new session.
		sess = e.rejoin(ctx)
		if sess == nil {
			return
		}
	}
}

// rejoin joins the cluster again, retrying until ctx ends.
func (e *Engine) rejoin(ctx context.Context) *membership.Session {
	backoff := 100 * time.Millisecond
	for {
		s, err := membership.Join(ctx, e.cfg.membership(e.cli))
		if err == nil {
			e.sess.Store(s)
			e.log.Info("rejoined the cluster with a new session", "lease", fmt.Sprintf("%x", int64(s.Lease())))
			return s
		}
		e.log.Warn("rejoining the cluster failed; retrying", "err", err, "in", backoff)
		if !sleepCtx(ctx, backoff) {
			return nil
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// serve runs one session: it follows the member set, acquiring and
// releasing partitions, until the session ends (fenced: drop everything) or
// ctx ends (graceful: release everything).
func (e *Engine) serve(ctx context.Context, sess *membership.Session) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	members := membership.Watch(sctx, e.cli, e.cfg.Prefix, membership.DefaultDebounce)
	parts := map[int]*owned{}
	acquiring := map[int]context.CancelFunc{}
	results := make(chan acquired)
	desired := map[int]bool{}
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	var failed []int

	start := func(p int) {
		actx, acancel := context.WithCancel(sctx)
		acquiring[p] = acancel
		go func() { results <- e.acquire(actx, sess, p) }()
	}
	reconcile := func() {
		var lost []int
		for p, c := range acquiring {
			if !desired[p] {
				c() // its result comes back and is released
			}
		}
		for p := range parts {
			if !desired[p] {
				lost = append(lost, p)
			}
		}
		if len(lost) > 0 {
			e.release(ctx, sess, parts, lost)
		}
		for p := range desired {
			if parts[p] == nil && acquiring[p] == nil {
				start(p)
			}
		}
		e.ready.Store(len(acquiring) == 0 && len(parts) == len(desired))
	}
	finish := func(r acquired) {
		delete(acquiring, r.p)
		switch {
		case r.err != nil:
			if desired[r.p] && sctx.Err() == nil {
				e.log.Warn("acquiring a partition failed; retrying", "partition", r.p, "err", r.err)
				failed = append(failed, r.p)
				retry.Reset(time.Duration(500+rand.IntN(500)) * time.Millisecond)
			}
		default:
			parts[r.p] = r.part
			if !desired[r.p] {
				e.release(ctx, sess, parts, []int{r.p})
			}
		}
		e.ready.Store(len(acquiring) == 0 && len(parts) == len(desired))
	}

	defer func() {
		// Stop acquiring and collect what is still in flight.
		for _, c := range acquiring {
			c()
		}
		for len(acquiring) > 0 {
			r := <-results
			delete(acquiring, r.p)
			if r.err == nil {
				parts[r.p] = r.part
			}
		}
		e.ready.Store(false)
		all := slices.Collect(maps.Keys(parts))
		if ctx.Err() != nil && !sess.Fenced() {
			e.release(context.Background(), sess, parts, all)
		} else {
			e.drop(parts)
			_ = sess.Close()
		}
	}()

	for {
		select {
		case <-ctx.Done():
			return
		case <-sess.Done():
			e.log.Warn("session ended: fenced, dropping every partition", "err", sess.Err())
			return
		case ms, ok := <-members:
			if !ok {
				return
			}
			ids := make([]string, len(ms))
			for i, m := range ms {
				ids[i] = m.ID
			}
			if !slices.Contains(ids, e.cfg.NodeID) {
				continue // our own registration is not visible yet
			}
			a, err := e.ring.Update(ids)
			if err != nil {
				e.log.Error("the member set does not fit the ring; keeping the current assignment", "members", len(ids), "err", err)
				continue
			}
			desired = map[int]bool{}
			for _, p := range a.Owned(e.cfg.NodeID) {
				desired[p] = true
			}
			reconcile()
		case r := <-results:
			finish(r)
		case <-retry.C:
			for _, p := range failed {
				if desired[p] && parts[p] == nil && acquiring[p] == nil {
					start(p)
				}
			}
			failed = failed[:0]
		}
	}
}

// acquire takes partition p (DESIGN.md, Partitions and ownership): lock its
// mutex, read where its last owner got to, record the hand-over, load its
// tasks and watch them.
func (e *Engine) acquire(ctx context.Context, sess *membership.Session, p int) (r acquired) {
	r.p = p
	m := concurrency.NewMutex(sess.Mutexes(), e.keys.lock(p))
	if err := m.Lock(ctx); err != nil {
		r.err = fmt.Errorf("lock partition %d: %w", p, err)
		return r
	}
	unlock := func() {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = m.Unlock(uctx)
	}
	fence := m.Header().Revision
	resume, err := e.resume(ctx, p)
	if err == nil {
		err = e.putCheckpoint(ctx, m, p, checkpoint{Node: e.cfg.NodeID, Watermark: time.Unix(0, resume).UTC()})
	}
	if err != nil {
		unlock()
		r.err = fmt.Errorf("acquire partition %d: %w", p, err)
		return r
	}
	e.owned[p].Store(true)
	wctx, stop := context.WithCancel(context.Background())
	part := &owned{mu: m, fence: fence, stop: stop, done: make(chan struct{})}
	rev, err := e.load(ctx, p, fence, resume)
	if err != nil {
		stop()
		close(part.done)
		e.owned[p].Store(false)
		e.releaseLoop([]int{p})
		unlock()
		r.err = fmt.Errorf("load partition %d: %w", p, err)
		return r
	}
	go func() {
		defer close(part.done)
		e.watch(wctx, p, rev)
	}()
	e.pendingTriggers(ctx, p)
	r.part = part
	return r
}

// resume returns the watermark to resume partition p after: the released
// checkpoint of a graceful owner, or after a crash the later of the
// checkpoint and its owner's node watermark. A partition never owned
// starts now.
func (e *Engine) resume(ctx context.Context, p int) (int64, error) {
	resp, err := e.cli.Get(ctx, e.keys.checkpoint(p))
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) == 0 {
		return e.cfg.Clock.Now().UnixNano(), nil
	}
	var cp checkpoint
	if err := json.Unmarshal(resp.Kvs[0].Value, &cp); err != nil || cp.Watermark.IsZero() {
		e.log.Warn("unreadable checkpoint; resuming the partition now", "partition", p, "value", string(resp.Kvs[0].Value))
		return e.cfg.Clock.Now().UnixNano(), nil
	}
	w := cp.Watermark.UnixNano()
	if cp.Released {
		return w, nil
	}
	wr, err := e.cli.Get(ctx, e.keys.watermark(cp.Node))
	if err != nil {
		return 0, err
	}
	if len(wr.Kvs) > 0 {
		var nw time.Time
		if err := nw.UnmarshalText(wr.Kvs[0].Value); err == nil {
			w = max(w, nw.UnixNano())
		}
	}
	return w, nil
}

// putCheckpoint writes p's checkpoint while m is still held.
func (e *Engine) putCheckpoint(ctx context.Context, m *concurrency.Mutex, p int, cp checkpoint) error {
	val, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	resp, err := e.cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut(e.keys.checkpoint(p), string(val))).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return errors.New("the partition lock was lost")
	}
	return nil
}

// release hands partitions over gracefully: no new fire is dispatched,
// every released one is taken by a worker, then each checkpoint records the
// dispatch point and the lock goes, in one transaction per 64 partitions.
func (e *Engine) release(ctx context.Context, sess *membership.Session, parts map[int]*owned, ps []int) {
	through := e.releaseLoop(ps)
	for _, p := range ps {
		e.owned[p].Store(false)
		parts[p].stop()
	}
	for _, p := range ps {
		<-parts[p].done
	}
	wctx, cancel := context.WithTimeout(ctx, e.cfg.DrainTimeout)
	defer cancel()
	if err := e.pool.waitTaken(wctx, through); err != nil {
		e.log.Warn("queued fires were not taken before release; the next owner repeats them", "err", err)
		through = e.pool.watermark.Load()
	}
	cp, _ := json.Marshal(checkpoint{Node: e.cfg.NodeID, Watermark: time.Unix(0, through).UTC(), Released: true})
	for chunk := range slices.Chunk(ps, maxTxnOps/2) {
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for _, p := range chunk {
			m := parts[p].mu
			cmps = append(cmps, m.IsOwner())
			ops = append(ops, clientv3.OpPut(e.keys.checkpoint(p), string(cp)), clientv3.OpDelete(m.Key()))
		}
		tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := e.cli.Txn(tctx).If(cmps...).Then(ops...).Commit()
		tcancel()
		if err != nil || !resp.Succeeded {
			// A lock was lost (session ended): the next owner resumes from
			// our node watermark instead, as after a crash.
			e.log.Warn("writing release checkpoints failed", "partitions", chunk, "err", err)
		}
	}
	for _, p := range ps {
		delete(parts, p)
	}
	e.log.Info("released partitions", "count", len(ps), "watermark", time.Unix(0, through).UTC())
}

// releaseLoop takes partitions' tasks out of the wheel and returns the
// dispatch point.
func (e *Engine) releaseLoop(ps []int) int64 {
	c := &releaseCmd{parts: ps, reply: make(chan int64, 1)}
	if e.call(context.Background(), c) != nil {
		return e.pool.watermark.Load()
	}
	select {
	case t := <-c.reply:
		return t
	case <-e.loopDone:
		return e.pool.watermark.Load()
	}
}

// drop lets go of partitions without a word to etcd: the session is dead,
// its locks expire with its lease, and the next owners resume from the
// last node watermark etcd acknowledged. Queued fires are dropped unrun.
func (e *Engine) drop(parts map[int]*owned) {
	ps := slices.Collect(maps.Keys(parts))
	e.releaseLoop(ps)
	e.pool.reset()
	for _, p := range ps {
		e.owned[p].Store(false)
		parts[p].stop()
		<-parts[p].done
		delete(parts, p)
	}
	e.log.Warn("dropped partitions", "count", len(ps))
}

// writeWatermarks records the node watermark every WatermarkInterval: one
// etcd request per node whatever the fire rate. A fenced node writes
// nothing, so its successors resume from what it had taken before.
func (e *Engine) writeWatermarks(ctx context.Context) {
	t := time.NewTicker(e.cfg.WatermarkInterval)
	defer t.Stop()
	key := e.keys.watermark(e.cfg.NodeID)
	for {
		if !e.fenced() {
			w := e.pool.watermark.Load()
			val, _ := time.Unix(0, w).UTC().MarshalText()
			wctx, cancel := context.WithTimeout(ctx, e.cfg.Lead)
			_, err := e.cli.Put(wctx, key, string(val))
			cancel()
			if err == nil {
				e.acked.Store(w)
				select {
				case e.ackCh <- struct{}{}:
				default:
				}
			} else if ctx.Err() == nil {
				e.log.Warn("writing the node watermark failed; dispatch pauses at the lead", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
