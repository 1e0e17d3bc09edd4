package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/shardcron/shardcron/membership"
)

// checkpoint is /<prefix>/checkpoints/<partition>: where the partition's
// last owner got to.
type checkpoint struct {
	Node      string        `json:"node"`
	Session   string        `json:"session,omitempty"` // the owner's lease, naming its watermark key
	Watermark time.Time     `json:"watermark"`
	Released  bool          `json:"released"`
	Pending   []pendingFire `json:"pending,omitempty"` // released before the watermark, not run: the next owner's
}

// owned is a partition this node holds.
type owned struct {
	mu    *concurrency.Mutex
	fence int64
	stop  context.CancelFunc // ends its watch
	done  chan struct{}      // closed when its watch and nameSession ended
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
	collected := false // dead sessions' watermarks, once per session
	var collecting sync.WaitGroup
	defer collecting.Wait()
	updateReady := func() {
		ready := len(acquiring) == 0 && len(parts) == len(desired)
		e.ready.Store(ready)
		if ready && !collected {
			collected = true
			collecting.Go(func() { e.collectWatermarks(sctx) })
		}
	}

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
			e.release(parts, lost)
		}
		for p := range desired {
			if parts[p] == nil && acquiring[p] == nil {
				start(p)
			}
		}
		updateReady()
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
				e.release(parts, []int{r.p})
			}
		}
		updateReady()
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
			if e.release(parts, all) {
				// No checkpoint names this session any more.
				dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, _ = e.cli.Delete(dctx, e.keys.watermark(e.cfg.NodeID, sessionID(sess)))
				cancel()
			}
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
	fence := m.Header().Revision
	prev, resume, pending, err := e.resume(ctx, p)
	var rev int64
	// Two phases: until this node's watermark covers p's catch-up, the
	// checkpoint names no session, so a successor resumes from resume
	// itself rather than from a watermark that may have passed fires of p
	// this node never released.
	hold := checkpoint{Node: e.cfg.NodeID, Watermark: time.Unix(0, resume).UTC(), Pending: pending}
	if err == nil {
		rev, err = e.putCheckpoint(ctx, m, p, hold)
	}
	if err != nil {
		e.unlock(m)
		r.err = fmt.Errorf("acquire partition %d: %w", p, err)
		return r
	}
	e.owned[p].Store(true)
	wctx, stop := context.WithCancel(context.Background())
	part := &owned{mu: m, fence: fence, stop: stop, done: make(chan struct{})}
	taskRev, wch, err := e.load(ctx, wctx, p, fence, resume, rev)
	if err != nil {
		stop()
		close(part.done)
		e.owned[p].Store(false)
		e.releaseLoop([]int{p})
		// Put the previous checkpoint back: ours names this node's live
		// session, whose watermark is past the fires of p nobody ran.
		e.restoreCheckpoint(m, p, prev)
		e.unlock(m)
		r.err = fmt.Errorf("load partition %d: %w", p, err)
		return r
	}
	if len(pending) > 0 {
		if err := e.call(ctx, &takeOverCmd{part: p, fires: pending}); err == nil {
			e.log.Info("running fires handed over unrun by the previous owner", "partition", p, "fires", len(pending))
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); e.watch(wctx, p, taskRev, wch) }()
	go func() { defer wg.Done(); e.nameSession(wctx, sess, m, p, hold) }()
	go func() { wg.Wait(); close(part.done) }()
	e.pendingTriggers(ctx, p)
	r.part = part
	return r
}

// nameSession completes an acquire: once the session's acknowledged
// watermark is past the point where p was armed, every fire of p due
// before it has been taken, and the checkpoint may name the session so
// that a successor after a crash resumes from its watermark (repeating at
// most the bounded lead) instead of from p's resume point. If that takes
// too long, the checkpoint stays as it is: safe, only more to repeat. It
// runs beside the partition's watch and ends with it; a release that comes
// first wins, as the write needs the lock.
func (e *Engine) nameSession(ctx context.Context, sess *membership.Session, m *concurrency.Mutex, p int, cp checkpoint) {
	c := &throughCmd{reply: make(chan int64, 1)}
	if e.call(ctx, c) != nil {
		return
	}
	var armed int64
	select {
	case armed = <-c.reply:
	case <-e.loopDone:
		return
	case <-ctx.Done():
		return
	}
	t := time.NewTicker(e.cfg.WatermarkInterval / 2)
	defer t.Stop()
	deadline := time.Now().Add(10 * e.cfg.Lead)
	for e.acked.Load() <= armed {
		if time.Now().After(deadline) || sess.Fenced() {
			e.log.Warn("the watermark did not pass a newly acquired partition in time; its checkpoint keeps the resume point", "partition", p)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	cp.Session, cp.Pending = sessionID(sess), nil // the handed-over fires were taken too
	if _, err := e.putCheckpoint(ctx, m, p, cp); err != nil && ctx.Err() == nil {
		e.log.Warn("naming the session in a checkpoint failed; it keeps the resume point", "partition", p, "err", err)
	}
}

// sessionID names a session in checkpoints and watermark keys: its lease.
func sessionID(s *membership.Session) string { return fmt.Sprintf("%x", int64(s.Lease())) }

func (e *Engine) unlock(m *concurrency.Mutex) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.Unlock(ctx); err != nil {
		e.log.Warn("unlocking a partition failed; it passes on when the session ends", "lock", m.Key(), "err", err)
	}
}

// resume returns p's checkpoint as stored (nil if none) and the watermark
// to resume p after: the released checkpoint of a graceful owner, or after
// a crash the later of the checkpoint and the watermark of the session that
// wrote it. Watermarks are kept per session, not per node: a node restarted
// with the same id writes a new one, and the dead session's stays the
// truth about what it had taken. A partition never owned starts now.
func (e *Engine) resume(ctx context.Context, p int) (prev []byte, w int64, pending []pendingFire, err error) {
	resp, err := e.cli.Get(ctx, e.keys.checkpoint(p))
	if err != nil {
		return nil, 0, nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, e.cfg.Clock.Now().UnixNano(), nil, nil
	}
	prev = resp.Kvs[0].Value
	var cp checkpoint
	if err := json.Unmarshal(prev, &cp); err != nil || cp.Watermark.IsZero() {
		e.log.Warn("unreadable checkpoint; resuming the partition now", "partition", p, "value", string(prev))
		return prev, e.cfg.Clock.Now().UnixNano(), nil, nil
	}
	w = cp.Watermark.UnixNano()
	if cp.Released {
		return prev, w, cp.Pending, nil
	}
	if cp.Session == "" { // an acquire that did not complete: its pending fires are still to run
		return prev, w, cp.Pending, nil
	}
	wr, err := e.cli.Get(ctx, e.keys.watermark(cp.Node, cp.Session))
	if err != nil {
		return nil, 0, nil, err
	}
	if len(wr.Kvs) > 0 {
		var nw time.Time
		if err := nw.UnmarshalText(wr.Kvs[0].Value); err == nil {
			w = max(w, nw.UnixNano())
		}
	}
	return prev, w, nil, nil
}

// putCheckpoint writes p's checkpoint while m is still held, and returns
// the revision of the write.
func (e *Engine) putCheckpoint(ctx context.Context, m *concurrency.Mutex, p int, cp checkpoint) (int64, error) {
	val, err := json.Marshal(cp)
	if err != nil {
		return 0, err
	}
	resp, err := e.cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut(e.keys.checkpoint(p), string(val))).Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, errors.New("the partition lock was lost")
	}
	return resp.Header.Revision, nil
}

// restoreCheckpoint writes back (or deletes, when prev is nil) the
// checkpoint an acquire replaced, while m is held.
func (e *Engine) restoreCheckpoint(m *concurrency.Mutex, p int, prev []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	op := clientv3.OpDelete(e.keys.checkpoint(p))
	if prev != nil {
		op = clientv3.OpPut(e.keys.checkpoint(p), string(prev))
	}
	if _, err := e.cli.Txn(ctx).If(m.IsOwner()).Then(op).Commit(); err != nil {
		e.log.Warn("restoring a checkpoint failed", "partition", p, "err", err)
	}
}

// release hands partitions over gracefully: no new fire is dispatched,
// and each checkpoint records the point up to which this node ran their
// fires, with the fires before it that were released but not run (queued,
// or waiting behind a running fire), so that the next owner runs exactly
// the rest. Checkpoints and unlocks go together, in transactions of up to
// 64 partitions and 1 MiB. It reports whether every partition was handed
// over with its checkpoint.
func (e *Engine) release(parts map[int]*owned, ps []int) bool {
	hand := e.releaseLoop(ps)
	for _, p := range ps {
		e.owned[p].Store(false)
		parts[p].stop()
	}
	for _, p := range ps {
		<-parts[p].done
	}
	// The whole hand-over is bounded: etcd out of reach must not hold a
	// shutdown for long. Locks left behind go when the session does.
	ctx, cancel := context.WithTimeout(context.Background(), max(10*time.Second, e.cfg.DrainTimeout))
	defer cancel()
	all := true
	for _, chunk := range e.releaseChunks(ps, hand) {
		ok, err := e.commitRelease(ctx, parts, chunk, hand, 3)
		switch {
		case ok:
		case err != nil:
			all = false // etcd out of reach: one partition at a time would fail too
		default:
			// One lock of the chunk was lost: one partition at a time, so
			// that every lock this session still holds goes with its
			// checkpoint.
			for _, p := range chunk {
				if ok, err := e.commitRelease(ctx, parts, []int{p}, hand, 1); !ok {
					all = false
					if err != nil {
						e.unlock(parts[p].mu)
					}
				}
			}
		}
	}
	for _, p := range ps {
		delete(parts, p)
	}
	e.log.Info("released partitions", "count", len(ps), "with_checkpoints", all)
	return all
}

// releaseChunks groups partitions into transactions within etcd's limits.
func (e *Engine) releaseChunks(ps []int, hand map[int]*handOver) [][]int {
	var chunks [][]int
	var cur []int
	size := 0
	for _, p := range ps {
		n := 256 + 300*len(hand[p].pending) // a generous estimate of the checkpoint
		if len(cur) == maxTxnOps/2 || (len(cur) > 0 && size+n > maxTxnBytes) {
			chunks, cur, size = append(chunks, cur), nil, 0
		}
		cur = append(cur, p)
		size += n
	}
	if len(cur) > 0 {
		chunks = append(chunks, cur)
	}
	return chunks
}

// commitRelease writes the released checkpoints of ps and deletes their
// locks in one transaction, in up to attempts tries within ctx. It reports
// whether it committed, and the error of the last try when etcd did not
// answer (false with a nil error: a lock was lost).
func (e *Engine) commitRelease(ctx context.Context, parts map[int]*owned, ps []int, hand map[int]*handOver, attempts int) (bool, error) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for _, p := range ps {
		m := parts[p].mu
		cp, _ := json.Marshal(checkpoint{Node: e.cfg.NodeID, Watermark: time.Unix(0, hand[p].mark).UTC(),
			Released: true, Pending: hand[p].pending})
		cmps = append(cmps, m.IsOwner())
		ops = append(ops, clientv3.OpPut(e.keys.checkpoint(p), string(cp)), clientv3.OpDelete(m.Key()))
	}
	var err error
	for attempt := range attempts {
		if attempt > 0 && !sleepCtx(ctx, time.Duration(attempt)*200*time.Millisecond) {
			break
		}
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var resp *clientv3.TxnResponse
		resp, err = e.cli.Txn(tctx).If(cmps...).Then(ops...).Commit()
		cancel()
		if err == nil {
			if !resp.Succeeded {
				e.log.Warn("a partition lock was lost before its release; its next owner resumes as after a crash", "partitions", ps)
			}
			return resp.Succeeded, nil
		}
		e.log.Warn("writing release checkpoints failed", "partitions", len(ps), "attempt", attempt+1, "err", err)
	}
	if err == nil {
		err = ctx.Err()
	}
	return false, err
}

// releaseLoop takes partitions' tasks out of the wheel and the queue, and
// returns what to hand over for each.
func (e *Engine) releaseLoop(ps []int) map[int]*handOver {
	c := &releaseCmd{parts: ps, reply: make(chan map[int]*handOver, 1)}
	if e.call(context.Background(), c) == nil {
		select {
		case hand := <-c.reply:
			return hand
		case <-e.loopDone:
		}
	}
	hand := make(map[int]*handOver, len(ps))
	for _, p := range ps {
		hand[p] = &handOver{mark: e.pool.watermark.Load()}
	}
	return hand
}

// drop lets go of partitions without a word to etcd: the session is dead,
// its locks expire with its lease, and the next owners resume from the
// last watermark etcd acknowledged for the session. Queued fires are
// dropped unrun.
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

// writeWatermarks records the session's watermark every WatermarkInterval:
// one etcd request per node whatever the fire rate. A fenced node writes
// nothing, so its successors resume from what it had taken before.
func (e *Engine) writeWatermarks(ctx context.Context) {
	t := time.NewTicker(e.cfg.WatermarkInterval)
	defer t.Stop()
	for {
		if s := e.sess.Load(); s != nil && !s.Fenced() {
			w := e.pool.watermark.Load()
			val, _ := time.Unix(0, w).UTC().MarshalText()
			wctx, cancel := context.WithTimeout(ctx, e.cfg.Lead)
			_, err := e.cli.Put(wctx, e.keys.watermark(e.cfg.NodeID, sessionID(s)), string(val))
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

// collectWatermarks deletes the watermark keys that no checkpoint needs
// any more: those of sessions that are gone and that no unreleased
// checkpoint names. Run once a session owns its partitions.
func (e *Engine) collectWatermarks(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	wm, err := e.cli.Get(ctx, e.keys.watermarks(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil || len(wm.Kvs) == 0 {
		return
	}
	cps, err := e.cli.Get(ctx, e.keys.checkpoints(), clientv3.WithPrefix())
	if err != nil {
		return
	}
	needed := map[string]bool{}
	for _, kv := range cps.Kvs {
		var cp checkpoint
		if json.Unmarshal(kv.Value, &cp) == nil && !cp.Released && cp.Session != "" {
			needed[e.keys.watermark(cp.Node, cp.Session)] = true
		}
	}
	live := map[string]bool{}
	if ms, _, err := membership.List(ctx, e.cli, e.cfg.Prefix); err == nil {
		for _, m := range ms {
			live[m.ID] = true
		}
	} else {
		return
	}
	if s := e.sess.Load(); s != nil {
		needed[e.keys.watermark(e.cfg.NodeID, sessionID(s))] = true
	}
	var dels []clientv3.Op
	for _, kv := range wm.Kvs {
		key := string(kv.Key)
		node, _, _ := strings.Cut(strings.TrimPrefix(key, e.keys.watermarks()), "/")
		// A live node's other sessions are its own business: it may still
		// be writing. Only keys of sessions nobody can need are removed.
		if !needed[key] && (!live[node] || node == e.cfg.NodeID) {
			dels = append(dels, clientv3.OpDelete(key))
		}
	}
	for chunk := range slices.Chunk(dels, maxTxnOps) {
		if _, err := e.cli.Txn(ctx).Then(chunk...).Commit(); err != nil {
			return
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
