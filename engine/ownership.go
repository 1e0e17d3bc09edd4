package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/ring"
)

// owned is a partition this node holds.
type owned struct {
	mu    *concurrency.Mutex
	fence int64
	stop  context.CancelFunc // ends its watch
	done  chan struct{}      // closed when its watch and nameSession ended
}

type acquired struct {
	p     int
	part  *owned
	err   error
	stray bool          // our lock key may be left behind: the session must end
	took  time.Duration // from the start to the partition armed
	unrun int           // fires its previous owner handed over unrun, run here
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
		sess = e.rejoin(ctx, sess.Lease())
		if sess == nil {
			return
		}
	}
}

// rejoin joins the cluster again, retrying until ctx ends. old is the
// lease of the session that ended: revoked first, at each try until etcd
// takes it. The session revoked it as it ended, but not when etcd was out
// of reach then, and an etcd that restarts gives every lease a full TTL
// again: the node key and the partitions' locks held under it would keep
// the node out, and its partitions from every node, for another TTL.
func (e *Engine) rejoin(ctx context.Context, old clientv3.LeaseID) *membership.Session {
	var b backoff
	for {
		if old != clientv3.NoLease {
			rctx, cancel := context.WithTimeout(ctx, e.cfg.LeaseTTL)
			err := membership.Revoke(rctx, e.cli, old)
			cancel()
			if err == nil {
				old = clientv3.NoLease
			}
		}
		s, err := membership.Join(ctx, e.membership())
		if err == nil {
			e.sess.Store(s)
			e.log.Info("rejoined the cluster with a new session", "lease", fmt.Sprintf("%x", int64(s.Lease())))
			return s
		}
		e.log.Warn("rejoining the cluster failed; retrying", "err", err, "in", b.next())
		if !b.wait(ctx) {
			return nil
		}
	}
}

// serving is the state of one session's service (serve). It belongs to
// the coordinator goroutine.
type serving struct {
	e         *Engine
	ctx       context.Context // ends with the service
	sess      *membership.Session
	cut       func()                     // cancels the runs kept apart, once: the session ended (serve)
	parts     map[int]*owned             // held
	acquiring map[int]context.CancelFunc // being acquired: each cancel ends its acquire unless it has loaded the partition
	acquires  context.Context            // ends every acquire, loaded or not: the session ends (not the service: see end)
	stopAll   context.CancelFunc         // ends acquires
	desired   map[int]bool               // the ring's share of this node
	stuck     map[int]*stuckRelease      // released, but etcd did not take the release
	unsure    map[int]bool               // being acquired when a lock key of ours appeared (stray.go)
	failed    []int                      // acquires to try again
	results   chan acquired
	retry     *time.Timer // failed acquires and stuck releases
	seenSelf  bool        // the member set listed this node once
	leaving   bool        // this node's key says it is leaving
	collected bool        // dead sessions' watermarks, once per session
	wg        sync.WaitGroup
	round     acquireRound // acquires since none was in flight, logged as one line
	dead      *deadMarks   // the dead sessions' watermarks the round's acquires read
	released  releaseRound // releases since none was pending, logged as one line

	// Make-before-break (prepare.go).
	assign     *ring.Assignment  // the ring's current assignment; nil when no member takes partitions
	preparedCh chan int          // acquires report their partition prepared
	mine       map[int]time.Time // prepared here and not yet acquired: published, since then
	unlisted   []int             // prepared here, waiting for room among those published (admit)
	window     *time.Timer       // the next of mine to pass prepareHold, while some wait unlisted
	publish    *time.Timer       // flushes mine
	dirty      bool              // mine changed since it was published
	others     preparedSets      // what every node published
	lostSince  map[int]time.Time // held partitions the ring gave another node
	handOver   *time.Timer       // the next lost partition past prepareWait

	// Warm standby for a crash (standby.go).
	suspected []string          // members whose watermarks stopped
	standing  map[int]*standing // partitions prepared, or being prepared, for them
}

// serve runs one session: it follows the member set, acquiring and
// releasing partitions, until the session ends (fenced: drop everything) or
// ctx ends (graceful: release everything).
func (e *Engine) serve(ctx context.Context, sess *membership.Session) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &serving{
		e: e, ctx: sctx, sess: sess,
		parts: map[int]*owned{}, acquiring: map[int]context.CancelFunc{}, desired: map[int]bool{},
		stuck: map[int]*stuckRelease{}, unsure: map[int]bool{}, results: make(chan acquired), retry: time.NewTimer(time.Hour),
		preparedCh: make(chan int, e.cfg.Partitions), mine: map[int]time.Time{}, window: time.NewTimer(time.Hour), publish: time.NewTimer(time.Hour),
		lostSince: map[int]time.Time{}, handOver: time.NewTimer(time.Hour), standing: map[int]*standing{},
	}
	// Not ended with sctx: a graceful end takes the acquires that loaded
	// their partition to the end (end).
	s.acquires, s.stopAll = context.WithCancel(context.WithoutCancel(sctx))
	defer s.retry.Stop()
	defer s.publish.Stop()
	defer s.window.Stop()
	defer s.handOver.Stop()
	defer func() {
		cancel()
		s.wg.Wait()
		e.standby.reset() // prepared for this session's suspicions
	}()
	// The runs kept apart end as the session does, at once: serve may be
	// busy then (a release waits ReleaseRunWait for runs; end, before it
	// drops the partitions, waits for the acquires under way), or gone
	// (Close drains the runs past their releases, whose markers go with
	// the lease), and the next owners take the partitions once the lease
	// ends, FenceMargin after the fence at the soonest. Once a session,
	// and before serve returns when it ended: a late cut would cancel the
	// runs of the session that rejoins.
	s.cut = sync.OnceFunc(func() {
		if n := e.pool.cutRunning(); n > 0 {
			e.log.Warn("session ended: canceled the runs of tasks whose concurrency policy keeps their fires apart, which the next owners would not know of",
				"runs", n)
		}
	})
	e.marking.Go(func() {
		<-sess.Done()
		s.cut()
	})
	defer func() {
		select {
		case <-sess.Done():
			s.cut()
		default: // graceful: the session ends after the drain, or with a fence during it
		}
	}()
	defer func() { s.end(ctx.Err() != nil) }()
	members := membership.Watch(sctx, e.cli, e.cfg.Prefix, membership.DefaultDebounce)
	others := e.watchPrepared(sctx)
	marks := e.watchMarks(sctx)
	locks := make(chan int)
	s.wg.Go(func() { e.followLocks(sctx, sess.Lease(), locks) })
	for {
		select {
		case p, ok := <-locks:
			if !ok {
				locks = nil // ended with the service
				continue
			}
			s.lockCreated(p)
		case p := <-s.preparedCh:
			s.prepared(p)
		case <-s.window.C:
			s.admit(time.Now())
		case <-s.publish.C:
			s.dirty = false
			e.publishPrepared(sctx, sess.Lease(), slices.Sorted(maps.Keys(s.mine)))
		case sets, ok := <-others:
			if !ok {
				others = nil // ended with the service
				continue
			}
			s.others = sets
			s.reconcile()
		case <-s.handOver.C:
			s.reconcile()
		case moved, ok := <-marks:
			if !ok {
				marks = nil // ended with the service
				continue
			}
			s.suspect(moved)
		case <-ctx.Done():
			return
		case <-sess.Done():
			e.log.Warn("session ended: fenced, dropping every partition", "err", sess.Err())
			return
		case ms, ok := <-members:
			if !ok {
				return
			}
			s.membersChanged(ms)
		case r := <-s.results:
			s.finish(r)
		case <-s.retry.C:
			s.retryNow()
		}
	}
}

// membersChanged follows a new member set.
func (s *serving) membersChanged(ms []membership.Member) {
	e := s.e
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	if !slices.Contains(ids, e.cfg.NodeID) {
		if s.seenSelf {
			// Our key is gone, and with it the lease: another node may
			// hold our partitions already.
			e.log.Warn("this node's key left the member set; ending the session")
			s.sess.Lost()
		}
		return // our own registration is not visible yet
	}
	s.seenSelf = true
	s.logMembers(ids)
	// Leaving nodes hand their partitions over: the ring leaves them out.
	var staying []string
	for _, m := range ms {
		if m.Info.Leaving {
			s.leaving = s.leaving || m.ID == e.cfg.NodeID
		} else {
			staying = append(staying, m.ID)
		}
	}
	var a *ring.Assignment
	if len(staying) > 0 {
		var err error
		if a, err = e.ring.Update(staying); err != nil {
			e.log.Error("the member set does not fit the ring; keeping the current assignment", "members", len(staying), "err", err)
			return
		}
	}
	s.assign, s.desired = a, map[int]bool{}
	for _, p := range a.Owned(e.cfg.NodeID) {
		s.desired[p] = true
	}
	s.reconcile()
}

// logMembers logs the nodes that joined and left since the member set
// last followed (ids sorted, as Watch sends them), by this session or the
// one before a fence: the start of every hand-over, and after a crash the
// moment the node's lease expired.
func (s *serving) logMembers(ids []string) {
	e := s.e
	var joined, left []string
	for _, id := range ids {
		if _, found := slices.BinarySearch(e.members, id); !found {
			joined = append(joined, id)
		}
	}
	for _, id := range e.members {
		if _, found := slices.BinarySearch(ids, id); !found {
			left = append(left, id)
		}
	}
	// Comma-joined, so that a log search finds an id however many changed.
	attrs := []any{"members", len(ids)}
	if len(joined) > 0 {
		attrs = append(attrs, "joined", strings.Join(joined, ","))
	}
	if len(left) > 0 {
		attrs = append(attrs, "left", strings.Join(left, ","))
	}
	if len(attrs) > 2 {
		e.log.Info("member set changed", attrs...)
	}
	e.members = ids
}

// prepared queues p, which its acquire prepared, to be published.
func (s *serving) prepared(p int) {
	s.unlisted = append(s.unlisted, p)
	s.admit(time.Now())
}

// admit publishes the partitions prepared here, in the order they were
// prepared, while fewer than the window of those published are younger
// than prepareHold. Their old owners release what is published at once:
// hundreds prepared from the cache within a second (a node that restarts)
// were released together, and the node then took them all at once, each
// one's lock and load sharing the cores with every other's, so that all
// of them stood still for as long (BENCHMARKS.md, "A node that starts
// again"). Published in turns, each partition moves as fast as a few
// dozen do. One published longer ago no longer holds the others back:
// its old owner may be gone, its lock held until its lease ends. The
// window, prepareWindow, grows with the partitions this node wants, so
// that even turns slower than prepareHold list them all within half of
// prepareWait, past which their old owners let them go unlisted.
func (s *serving) admit(now time.Time) {
	window := max(prepareWindow, len(s.desired)*int(prepareHold)/int(prepareWait/2))
	fresh, next := 0, time.Time{}
	for _, at := range s.mine {
		if until := at.Add(prepareHold); until.After(now) {
			fresh++
			if next.IsZero() || until.Before(next) {
				next = until
			}
		}
	}
	for len(s.unlisted) > 0 && fresh < window {
		s.mine[s.unlisted[0]] = now
		s.unlisted = s.unlisted[1:]
		if fresh++; next.IsZero() {
			next = now.Add(prepareHold)
		}
		s.changed()
	}
	if len(s.unlisted) > 0 {
		s.window.Reset(next.Sub(now))
	}
}

// changed schedules publishing mine.
func (s *serving) changed() {
	if !s.dirty {
		s.dirty = true
		s.publish.Reset(preparedFlush)
	}
}

// handing returns the held partitions the ring gave another node that
// may go now: their new owner prepared them, or waited long enough, or
// there is none.
func (s *serving) handing() []int {
	now := time.Now()
	var due []int
	var next time.Duration
	for p := range s.parts {
		if s.desired[p] {
			delete(s.lostSince, p)
			continue
		}
		since, ok := s.lostSince[p]
		if !ok {
			since = now
			s.lostSince[p] = now
		}
		owner := ""
		if s.assign != nil {
			owner = s.assign.Owner(p)
		}
		if wait := since.Add(prepareWait).Sub(now); owner == "" || s.others[owner][p] || wait <= 0 {
			due = append(due, p)
			delete(s.lostSince, p)
		} else if next == 0 || wait < next {
			next = wait
		}
	}
	if next > 0 {
		s.handOver.Reset(next)
	}
	return due
}

func (s *serving) updateReady() {
	// Not before the member set listed this node: until then nothing is
	// desired, which is not the same as owning all of it.
	ready := s.seenSelf && len(s.acquiring) == 0
	for p := range s.desired {
		ready = ready && s.parts[p] != nil
	}
	s.e.ready.Store(ready)
	if s.leaving && len(s.parts) == 0 && len(s.acquiring) == 0 && len(s.stuck) == 0 {
		s.e.leftOnce.Do(func() { close(s.e.left) })
	}
	if ready && !s.collected {
		s.collected = true
		s.wg.Go(func() { s.e.collectWatermarksRetrying(s.ctx) })
	}
}

// acquireRound gathers the partitions acquired while acquires were in
// flight: a node takes hundreds at a start or a rebalance, and says so in
// one line (each partition's steps are debug lines).
type acquireRound struct {
	start       time.Time
	parts       []int
	slowest     int           // the partition that took longest
	slowestTook time.Duration // and how long
	unrun       int           // fires handed over unrun by the previous owners
}

// roundMax is how long a round gathers before it is logged anyway: one
// acquire that waits for a stuck release must not hold back the line of
// every partition taken meanwhile.
const roundMax = 10 * time.Second

// add counts r, a partition acquired.
func (a *acquireRound) add(r acquired) {
	a.parts = append(a.parts, r.p)
	a.unrun += r.unrun
	if r.took > a.slowestTook || len(a.parts) == 1 {
		a.slowest, a.slowestTook = r.p, r.took
	}
}

// log writes the round's line and starts the next round.
func (a *acquireRound) log(log *slog.Logger) {
	if len(a.parts) > 0 {
		attrs := []any{"partitions", partRanges(a.parts), "count", len(a.parts), "took", time.Since(a.start),
			"slowest", a.slowest, "slowest_took", a.slowestTook}
		if a.unrun > 0 {
			attrs = append(attrs, "fires_handed_unrun", a.unrun)
		}
		log.Info("acquired partitions", attrs...)
	}
	*a = acquireRound{start: time.Now()}
}

// releaseRound is the partitions released since the last line.
type releaseRound struct {
	start time.Time // of the first release
	parts []int
	stuck int           // releases etcd did not take
	took  time.Duration // the longest release
}

func (r *releaseRound) add(ps []int, stuck int, took time.Duration) {
	if len(r.parts) == 0 {
		r.start = time.Now()
	}
	r.parts = append(r.parts, ps...)
	r.stuck += stuck
	r.took = max(r.took, took)
}

// log writes the round's line and starts the next round.
func (r *releaseRound) log(log *slog.Logger) {
	if len(r.parts) > 0 {
		log.Info("released partitions", "partitions", partRanges(r.parts), "count", len(r.parts), "stuck", r.stuck,
			"took", r.took, "over", time.Since(r.start))
	}
	*r = releaseRound{}
}

// partRanges logs partitions as sorted ranges (ring.Ranges).
type partRanges []int

func (ps partRanges) LogValue() slog.Value { return slog.StringValue(ring.Ranges(ps)) }

func (s *serving) start(p int) {
	if len(s.acquiring) == 0 {
		s.round.start, s.dead = time.Now(), newDeadMarks()
	}
	actx, cancel := context.WithCancel(s.acquires)
	s.acquiring[p] = cancel
	dead := s.dead
	go func() { s.results <- s.e.acquire(actx, s.acquires, s.sess, p, dead, func() { s.preparedCh <- p }) }()
}

// reconcile releases what the ring took away and acquires what it gave.
func (s *serving) reconcile() {
	for p, c := range s.acquiring {
		if !s.desired[p] {
			c() // its result comes back and is released
		}
	}
	if lost := s.handing(); len(lost) > 0 {
		s.release(lost)
	}
	for p := range s.desired {
		// A stuck release still holds the lock: taking the partition
		// again would find it ours, and the release would then unlock it.
		if s.parts[p] == nil && s.acquiring[p] == nil && s.stuck[p] == nil {
			s.start(p)
		}
	}
	s.updateReady()
}

func (s *serving) release(ps []int) {
	if len(ps) == 0 {
		return // nothing held: no round, and no "released partitions" line of none
	}
	stuck, took := s.e.release(s.sess, s.parts, ps)
	maps.Copy(s.stuck, stuck)
	if len(s.stuck) > 0 {
		s.retry.Reset(time.Second)
	}
	s.released.add(ps, len(stuck), took)
	// A join has the old owner release in dozens of small batches, as
	// the new owner prepares them: one line once none is left to hand.
	if len(s.lostSince) == 0 || time.Since(s.released.start) > roundMax {
		s.released.log(s.e.log)
	}
}

func (s *serving) finish(r acquired) {
	e := s.e
	if cancel := s.acquiring[r.p]; cancel != nil {
		cancel() // its context leaves the session's
	}
	delete(s.acquiring, r.p)
	// The acquire reported p prepared before it returned, but serve's
	// select takes the two at random (and alone receives from
	// preparedCh): taken after this, p would stay published as prepared
	// here with no acquire left to take it out, and when the ring gave p
	// to this node again its owner would let go before this node
	// prepared it.
	for len(s.preparedCh) > 0 {
		s.prepared(<-s.preparedCh)
	}
	if s.unsure[r.p] {
		delete(s.unsure, r.p)
		if r.err != nil && !r.stray {
			s.deleteStray(r.p) // a key of an earlier attempt, put late
		}
	}
	if _, ok := s.mine[r.p]; ok {
		delete(s.mine, r.p)
		s.changed()
	}
	s.unlisted = slices.DeleteFunc(s.unlisted, func(p int) bool { return p == r.p })
	s.admit(time.Now())
	switch {
	case r.stray:
		// A lock key of ours may be left behind, ahead of the next owner:
		// only the end of the lease removes it for sure.
		e.log.Error("a failed acquire may have left its lock key; ending the session so that it goes", "partition", r.p, "err", r.err)
		s.sess.Lost()
	case r.err != nil:
		if s.desired[r.p] && s.ctx.Err() == nil {
			e.log.Warn("acquiring a partition failed; retrying", "partition", r.p, "err", r.err)
			s.failed = append(s.failed, r.p)
			s.retry.Reset(time.Duration(500+rand.IntN(500)) * time.Millisecond)
		}
	default:
		s.parts[r.p] = r.part
		s.round.add(r)
		if !s.desired[r.p] {
			s.release([]int{r.p})
		}
	}
	if len(s.acquiring) == 0 || time.Since(s.round.start) > roundMax {
		s.round.log(e.log)
	}
	s.updateReady()
}

// retryNow retries failed acquires and stuck releases.
func (s *serving) retryNow() {
	for _, p := range s.failed {
		if s.desired[p] && s.parts[p] == nil && s.acquiring[p] == nil && s.stuck[p] == nil {
			s.start(p)
		}
	}
	s.failed = s.failed[:0]
	if len(s.stuck) > 0 {
		s.e.retryStuck(s.sess, s.stuck)
		if len(s.stuck) > 0 {
			s.retry.Reset(time.Second)
		} else {
			s.reconcile()
		}
	}
}

// end stops acquiring, then releases every partition (graceful, when the
// node leaves and its session lives) or drops them (fenced).
//
// A graceful end cancels the acquires as the ring does when it moves a
// partition on: one that loaded its partition has dispatched its fires,
// and goes on to the end to be released with the others, with its exact
// mark. Undone, its checkpoint put back, the next owner would fire those
// again: a leave cut short (Hurry, a leave mark etcd refused, prepareWait
// passed) still hands over exactly. The wait has no deadline of its own:
// what is left of a loaded acquire is the dispatch loop, which runs its
// load whatever becomes of the request (a deadline that undid it then
// repeated what the load fired), and its last etcd reads, which the cancel
// bounds to etcdTimeout (acquire).
func (s *serving) end(leaving bool) {
	e := s.e
	defer s.stopAll()
	if leaving && !s.sess.Fenced() {
		for _, cancel := range s.acquiring {
			cancel()
		}
	} else {
		s.stopAll()
	}
	for len(s.acquiring) > 0 {
		r := <-s.results
		delete(s.acquiring, r.p)
		if r.err == nil {
			s.parts[r.p] = r.part
			s.round.add(r)
		}
	}
	s.round.log(e.log) // before the release says it lets them go
	e.ready.Store(false)
	defer s.released.log(e.log)
	if leaving && !s.sess.Fenced() {
		s.release(slices.Collect(maps.Keys(s.parts)))
		// A session that ended meanwhile has nothing left to retry with:
		// its releases go with the lease.
		if len(s.stuck) > 0 && !s.sess.Fenced() {
			e.retryStuck(s.sess, s.stuck)
		}
		if len(s.stuck) == 0 {
			// No checkpoint names this session any more.
			dctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
			_, _ = e.cli.Delete(dctx, e.keys.watermark(e.cfg.NodeID, sessionID(s.sess)))
			cancel()
		}
		// Stuck releases go with the lease when Close revokes it; their
		// successors resume from the held watermark.
		return
	}
	// Before the drop: the session has ended (a drop comes only with a
	// fence or a lost lease: the member watch ends only with ctx, a
	// graceful end), so workers take nothing more, but its end's
	// goroutine may not have cut yet, and the drop's seal must know which
	// triggers' jobs the cut left unstarted (release.unstarted).
	s.cut()
	e.drop(s.sess, s.parts, s.stuck)
	_ = s.sess.Close()
}

// acquire takes partition p (docs/design.md, Partitions and ownership): lock its
// mutex, read where its last owner got to, record the hand-over, load its
// tasks and watch them.
//
// ctx ends the acquire until it loads the tasks (the ring gave p to
// another node meanwhile); from then on only loaded does (the session
// ends), and ctx bounds each etcd read left to etcdTimeout. A loaded
// partition dispatches at once, and an acquire undone after that puts the
// previous checkpoint back, so that its next owner repeats what it fired,
// and cancels its runs of tasks kept apart (pool.cutPartition): one the
// ring no longer wants is taken to the end and released as any
// other, with its exact mark.
func (e *Engine) acquire(ctx, loaded context.Context, sess *membership.Session, p int, dead *deadMarks, prepared func()) (r acquired) {
	r.p = p
	start := time.Now()
	prep, err := e.prepareBounded(ctx, p)
	if err != nil {
		r.err = fmt.Errorf("prepare partition %d: %w", p, err)
		return r
	}
	// Opened now, the catch-up watch has usually caught up with etcd's
	// history when the lock is ours (catchup.go).
	cctx, stopCatchUp := context.WithCancel(ctx)
	defer stopCatchUp()
	catchUp, progress := e.reg.CatchUp(cctx, p, prep.rev)
	prepared()
	tPrepared := time.Now()
	m := concurrency.NewMutex(sess.Mutexes(), e.keys.lock(p))
	if err := e.lock(ctx, m, p); err != nil {
		// A lock whose put was cut off can leave our key behind, where it
		// would become the owner once the previous one goes.
		r.err = fmt.Errorf("lock partition %d: %w", p, err)
		gone, _ := e.deleteLockKey(p, sess)
		r.stray = !gone
		return r
	}
	fence := m.Header().Revision
	tLocked := time.Now()
	fail := func(err error) acquired {
		r.err = fmt.Errorf("acquire partition %d: %w", p, err)
		if !e.unlock(m) {
			gone, _ := e.deleteLockKey(p, sess)
			r.stray = !gone
		}
		return r
	}
	res, err := e.resume(ctx, p, dead)
	// Two phases: until this node's watermark covers p's catch-up, the
	// checkpoint names no session, so a successor resumes from res.w
	// itself rather than from a watermark that may have passed fires of p
	// this node never released. The transaction's revision is the one the
	// tasks are brought up to.
	hold := holdCheckpoint(e.cfg.NodeID, res.w, res.handing, res.pending, res.after, res.applied)
	var held *clientv3.TxnResponse
	if err == nil {
		held, err = e.putCheckpoint(ctx, m, p, hold)
	}
	if err != nil {
		return fail(err)
	}
	// No runner of p's backfills starts before startBackfills, below,
	// after the fires handed over are taken over: a runner counts those
	// of its task against its concurrency from its start (handed). Those
	// an undone acquire of p took over went with it.
	e.stopBackfills([]int{p}, false)
	e.owned[p].Store(true)
	// The partition's watch lives as long as the partition is held, not as
	// long as this acquire.
	wctx, stop := context.WithCancel(context.Background())
	part := &owned{mu: m, fence: fence, stop: stop, done: make(chan struct{})}
	undo := func(err error) acquired {
		stop()
		close(part.done)
		e.owned[p].Store(false)
		// Sealed at once: nothing is handed over, so no retry of an
		// attempt under way waits to be listed, and the loop would keep
		// its tasks (leaving) until their attempts end, for ever for one
		// a fenced drop takes from the queue. Nor is a marker written of
		// the runs kept apart, and the next acquire fires their times
		// again: those still queued are dropped, those under way cut.
		e.seal(e.releaseLoop([]int{p}, nil), unrunApart, false)
		if n := e.pool.cutPartition(p); n > 0 {
			e.log.Warn("acquire undone: canceled the runs of tasks whose concurrency policy keeps their fires apart, which its next acquire fires again",
				"partition", p, "runs", n)
		}
		// Ahead of the next acquire's read of the partition's triggers,
		// which fires their keys.
		if u := e.pool.takeUnstarted(p); len(u) > 0 {
			_ = e.call(context.Background(), &unstartedCmd{ends: u})
		}
		// Put the previous checkpoint back: ours names this node's live
		// session, whose watermark is past the fires of p nobody ran.
		e.restoreCheckpoint(m, p, res.prev)
		e.holds.clear(p)
		return fail(err)
	}
	touched, taskRev, err := e.changesSince(ctx, prep, held.Header.Revision, catchUp, progress)
	stopCatchUp()
	if err != nil {
		return undo(fmt.Errorf("catch up: %w", err))
	}
	// From here on a cancel of ctx (the ring moved p on, or the node
	// leaves) bounds each etcd read left, not the waits for the loop (end).
	canceled := ctx
	ctx = loaded
	// Runs of former owners that went on past their release: read before
	// the tasks are armed, so that none fires beside them.
	rctx, cancel := boundedOnceDone(ctx, canceled, etcdTimeout)
	away, awayRev, err := e.readElsewhere(rctx, p)
	cancel()
	if err != nil {
		return undo(fmt.Errorf("read the runs elsewhere: %w", err))
	}
	handed := handedFrom(res.after, res.handing)
	if len(res.ends.IDs) > 0 {
		// Not in the hold: judged by a revision of their own, not its
		// applied. A crash before the session is named loses them.
		handed.takeEndWaits(res.ends)
	}
	// Not in the hold either, for the same reason.
	handed.elsewhere, handed.pending, handed.retries = away, res.pending, res.retries
	a := &arming{prep: prep, touched: touched, rev: taskRev, fence: fence, resume: res.w, applied: res.applied, handed: &handed}
	if err := e.arm(ctx, a); err != nil {
		return undo(fmt.Errorf("arm: %w", err))
	}

	if pending := handed.pending; len(pending) > 0 {
		// Not run, they would be lost: a quick second release writes a
		// checkpoint without them.
		var bfs map[string]*backfillRun
		for _, f := range pending {
			if f.Backfill {
				bfs = e.handedBackfill(p, f.ID, bfs)
			}
		}
		if err := e.call(ctx, &takeOverCmd{part: p, fires: pending, bfs: bfs}); err != nil {
			return undo(fmt.Errorf("take over the fires handed over: %w", err))
		}
		// Counted in the round's line: after a stop behind busy workers
		// the next owner takes such fires in most of its partitions.
		e.log.Debug("running fires handed over unrun by the previous owner", "partition", p, "fires", len(pending))
		r.unrun = len(pending)
	}
	// Ended delete_after_fire tasks whose last owner did not delete them.
	if err := e.call(ctx, &endedCmd{part: p}); err != nil {
		return undo(fmt.Errorf("look for ended tasks: %w", err))
	}
	// Triggers written while nobody owned p, or while it loaded: read once
	// the loop owns p, so that none falls between this read and the trigger
	// watch, whose events up to the read the loop then passes over.
	rctx, cancel = boundedOnceDone(ctx, canceled, etcdTimeout)
	tr, err := e.cli.Do(rctx, e.reg.TriggerRead(p))
	cancel()
	if err != nil {
		return undo(fmt.Errorf("read pending triggers: %w", err))
	}
	triggers := tr.Get()
	e.fireTriggers(ctx, triggers.Kvs, &triggerRead{part: p, rev: triggers.Header.Revision})
	// The watch's goroutine closes done once the naming, and the watch of
	// runs elsewhere, have ended too, with no goroutine of its own for
	// that: every garbage collection scans each parked goroutine's stack,
	// and a node owns a thousand partitions.
	var named sync.WaitGroup
	named.Go(func() { e.nameSession(wctx, sess, m, p, hold) })
	if len(away) > 0 {
		named.Go(func() { e.watchElsewhere(wctx, p, away, awayRev) })
	}
	go func() {
		e.watch(wctx, p, taskRev)
		named.Wait()
		close(part.done)
	}()
	// Backfills of p, from their recorded progress: p is owned, so the
	// backfill watch starts those written from now on.
	rctx, cancel = boundedOnceDone(ctx, canceled, etcdTimeout)
	e.startBackfills(rctx, p)
	cancel()
	r.part = part
	armed := time.Now()
	e.handOver[phasePrepare].observe(tPrepared.Sub(start))
	e.handOver[phaseLockWait].observe(tLocked.Sub(tPrepared))
	e.handOver[phaseTake].observe(armed.Sub(tLocked))
	e.log.Debug("acquired partition", "partition", p, "fence", fence, "resume", time.Unix(0, res.w).UTC(),
		"prepare", tPrepared.Sub(start), "lock_wait", tLocked.Sub(tPrepared), "take", armed.Sub(tLocked))
	r.took = armed.Sub(start)
	return r
}

// boundedOnceDone returns a context of ctx that also ends d after done
// ends (d from now, if done has ended already), and its cancel.
func boundedOnceDone(ctx, done context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	bctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(done, func() { time.AfterFunc(d, cancel) })
	return bctx, func() {
		stop()
		cancel()
	}
}

// lock takes p's mutex, waiting while another session holds it. It tries
// (Mutex.TryLock, whose cleanup is bounded by ctx) and waits for the
// holder's key to go between tries, rather than queueing in Mutex.Lock:
// a canceled Lock cleans its queued key up with no deadline, which can
// hang a rejoin while etcd is out of reach. Only the ring's owner of p
// asks for it, so there is no queue to keep fair.
func (e *Engine) lock(ctx context.Context, m *concurrency.Mutex, p int) error {
	for {
		err := m.TryLock(ctx)
		if !errors.Is(err, concurrency.ErrLocked) {
			return err
		}
		resp, err := e.cli.Get(ctx, e.keys.lock(p)+"/", clientv3.WithFirstCreate()...)
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			continue // gone already
		}
		if err := e.waitDeleted(ctx, string(resp.Kvs[0].Key), resp.Header.Revision); err != nil {
			return err
		}
	}
}

// waitDeleted waits until key is deleted after revision rev.
func (e *Engine) waitDeleted(ctx context.Context, key string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for resp := range e.cli.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(rev+1), clientv3.WithFilterPut()) {
		if err := resp.Err(); err != nil {
			return err
		}
		if len(resp.Events) > 0 {
			return nil
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("the watch of the lock holder ended")
}

// unlock releases a partition lock, and reports whether it did.
func (e *Engine) unlock(m *concurrency.Mutex) bool {
	ctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
	defer cancel()
	if err := m.Unlock(ctx); err != nil {
		e.log.Warn("unlocking a partition failed", "lock", m.Key(), "err", err)
		return false
	}
	return true
}

// deleteLockKey deletes this session's key in p's lock, in a few tries
// within bounded time, and reports whether it is gone, and whether this
// call deleted it (it was there).
func (e *Engine) deleteLockKey(p int, sess *membership.Session) (gone, deleted bool) {
	key := e.lockKey(p, sess.Lease())
	for attempt := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := e.cli.Delete(ctx, key)
		cancel()
		if err == nil {
			return true, resp.Deleted > 0
		}
		e.log.Warn("deleting a lock key failed", "key", key, "attempt", attempt+1, "err", err)
		if sess.Fenced() {
			return true, false // the lease ends, and the key with it
		}
	}
	return false, false
}
