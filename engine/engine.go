package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/ring"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

// ErrClosed is returned by methods of an Engine that was closed.
var ErrClosed = errors.New("engine: closed")

// Fire is one execution attempt, as in-process handlers receive it.
type Fire = executor.Fire

// HandlerFunc is an in-process handler for tasks of executor type
// "handler".
type HandlerFunc = executor.HandlerFunc

// Engine runs one node: it joins the cluster, owns the partitions the ring
// gives it, and fires their tasks.
type Engine struct {
	cfg      Config
	log      *slog.Logger
	cli      *clientv3.Client
	store    *store.Store
	keys     keys
	reg      *registry.Registry
	ring     *ring.Ring
	scheds   *schedule.Table
	handlers executor.Handlers
	execs    *executors
	stats    stats
	notify   *notifier // alerts and pause_on_failure (notify.go)

	sess      atomic.Pointer[membership.Session]
	startedAt time.Time                  // when Start ran, published by every session (a rejoin after a fence is not a new start)
	acked     acked                      // the node watermark etcd last acknowledged
	holds     *holds                     // caps the watermark written while releases are uncommitted
	ended     atomic.Pointer[endedHands] // what fenced sessions had taken, by partition
	ackCh     chan struct{}
	ready     atomic.Bool
	left      chan struct{} // closed once a leaving node handed every partition over
	leftOnce  sync.Once
	preparing chan struct{}        // a slot per partition being prepared (prepareBounded)
	standby   *standby             // partitions prepared ahead of a dead node's lease's end (standby.go)
	marks     *markers             // the session's markers of runs past their release; the coordinator's (elsewhere.go)
	owned     []atomic.Bool        // partitions owned, for trigger routing and the API
	loads     atomic.Uint64        // full range reads of a partition
	uncached  []atomic.Bool        // partitions whose Badger cache was dropped until their next range read
	execDur   durations            // how long executions take (not noop ones)
	handOver  [numPhases]durations // the hand-over phases this node went through
	fences    fences               // sessions that ended fenced
	members   []string             // the member set logMembers last followed, sorted; only the coordinator goroutine
	shapes    shapeCodes           // cache encodings of the task shapes seen (shape.go)
	revs      *revisions           // etcd's revision, read for the partitions prepared from the cache

	pool *pool
	loop *loop
	bf   backfills // the backfills this node runs (backfill.go)

	runCtx    context.Context    // ends when Close begins
	cancel    context.CancelFunc // stops the coordinator, watches and writer
	loopStop  context.CancelFunc
	wg        sync.WaitGroup // every goroutine Start runs but the loop and the writers
	loopDone  chan struct{}
	drained   chan struct{}  // closed by Close once the workers are drained
	writers   sync.WaitGroup // the chain writer and the trigger deleter, which then write what is left
	marking   sync.WaitGroup // the goroutines of markers of runs elsewhere (elsewhere.go), and each session's cut of its runs (serve), which end with the session
	closeOnce sync.Once
	hurry     chan struct{} // closed by Hurry
	hurryOnce sync.Once
	done      chan struct{} // closed when Close returns
	closeErr  error
	started   atomic.Bool
}

// New returns an engine for a node; Start runs it. The client and the store
// must outlive the engine; st may be nil to keep no cache and no history
// (tests, benchmarks).
func New(cfg Config, cli *clientv3.Client, st *store.Store) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := cfg.membership(cli, cfg.nodeInfo(nil, time.Time{})).Validate(); err != nil {
		return nil, err
	}
	r, err := ring.New(cfg.ring())
	if err != nil {
		return nil, err
	}
	hcfg := executor.DefaultClientConfig()
	var execAllow *executor.PathAllow
	if len(cfg.HTTPAllow) > 0 {
		if hcfg.Allow, err = executor.ParseHostAllow(cfg.HTTPAllow); err != nil {
			return nil, err
		}
	}
	if len(cfg.ExecAllow) > 0 {
		if execAllow, err = executor.ParsePathAllow(cfg.ExecAllow); err != nil {
			return nil, err
		}
	}
	hc, err := executor.NewClient(hcfg)
	if err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:       cfg,
		log:       cfg.Logger.With("node", cfg.NodeID),
		cli:       cli,
		store:     st,
		keys:      newKeys(cfg.Prefix),
		ring:      r,
		scheds:    schedule.NewTable(),
		ackCh:     make(chan struct{}, 1),
		holds:     newHolds(),
		left:      make(chan struct{}),
		hurry:     make(chan struct{}),
		done:      make(chan struct{}),
		preparing: make(chan struct{}, max(2, runtime.GOMAXPROCS(0))),
		standby:   newStandby(),
		owned:     make([]atomic.Bool, cfg.Partitions),
		uncached:  make([]atomic.Bool, cfg.Partitions),
		revs:      newRevisions(),
	}
	e.execs = &executors{
		shared:    executor.Shared{HTTP: hc, Handlers: &e.handlers, AllowExec: cfg.AllowExec, ExecAllow: execAllow},
		durations: &e.execDur,
		notifyURL: cfg.NotifyURL,
	}
	if cfg.Version != "" {
		e.execs.shared.UserAgent = "shardcron/" + cfg.Version
	}
	ua := e.execs.shared.UserAgent
	if ua == "" {
		ua = "shardcron/dev"
	}
	e.notify = newNotifier(hc, ua, cfg.NotifyQueue, e.log)
	return e, nil
}

// Handle registers an in-process handler for tasks whose executor is
// {"type": "handler", "name": name}; a nil fn removes it. It may be called
// before or after Start: the node publishes its handlers in its membership
// record (after Start, with one etcd write, 5 s at most, logged when it
// fails), and the API refuses a handler task that no live node registered.
// A fire of a task whose handler is not registered on its owner fails.
func (e *Engine) Handle(name string, fn HandlerFunc) {
	e.handlers.Handle(name, fn)
	e.publishInfo()
}

// publishInfo brings the node's membership record up to date with its
// handlers, when it has a live session whose record differs.
func (e *Engine) publishInfo() {
	s := e.sess.Load()
	if s == nil || s.Fenced() {
		return // Join and rejoin publish the current info
	}
	info := e.nodeInfo()
	if slices.Equal(info.Handlers, s.Info().Handlers) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
	defer cancel()
	if err := s.Publish(ctx, info); err != nil {
		e.log.Warn("publishing the node's handlers failed; the API may refuse tasks of the new ones", "err", err)
	}
}

// nodeInfo is what the node publishes under its membership key.
func (e *Engine) nodeInfo() membership.NodeInfo {
	return e.cfg.nodeInfo(e.handlers.Names(), e.startedAt)
}

// membership is the config of the node's next session.
func (e *Engine) membership() membership.Config { return e.cfg.membership(e.cli, e.nodeInfo()) }

// Registry returns the task registry; it is usable once Start returned.
func (e *Engine) Registry() *registry.Registry { return e.reg }

// Start opens the registry (checking the cluster's partitions and ring), joins
// the cluster and starts firing. It returns once the node is a member; the
// node is Ready once it owns its partitions. Errors: the partition count
// differs (ErrPartitionsMismatch) or the ring's settings do
// (ErrRingMismatch), the node id is held by a live node
// (membership.ErrNodeExists), or etcd is unreachable until ctx ends: a
// start write etcd does not answer (timed out, a leader change) is tried
// again until then.
func (e *Engine) Start(ctx context.Context) error {
	if !e.started.CompareAndSwap(false, true) {
		return errors.New("engine: already started")
	}
	opts := []registry.Option{registry.WithRing(e.cfg.ReplicationFactor, e.cfg.Load)}
	if e.cfg.IndexClient != nil {
		opts = append(opts, registry.WithIndexClient(e.cfg.IndexClient))
	}
	reg, err := untilAnswered(ctx, e.log, "opening the registry", func() (*registry.Registry, error) {
		return registry.OpenRegistry(ctx, e.cli, e.cfg.Prefix, e.cfg.Partitions, opts...)
	})
	if err != nil {
		return err
	}
	e.reg = reg
	if err := e.checkCacheOrigin(); err != nil {
		return err
	}
	e.startedAt = time.Now().UTC().Truncate(time.Millisecond)
	sess, err := untilAnswered(ctx, e.log, "joining the cluster", func() (*membership.Session, error) {
		return membership.Join(ctx, e.membership())
	})
	if err != nil {
		return err
	}
	e.sess.Store(sess)
	e.publishInfo() // a handler registered while Join ran

	now := e.cfg.Clock.Now().UnixNano()
	e.pool = newPool(e.cfg, e.store, &e.stats, e.fenced, now)
	if e.loop, err = newLoop(e.cfg, e.scheds, e.pool, e.holds, &e.stats, e.store, e.fenced, &e.acked, e.ackCh, now); err != nil {
		close(e.pool.quit)
		e.pool.drain(0)
		_ = sess.Close()
		return err
	}
	e.notify.start(func(ctx context.Context, id string) (bool, error) {
		// A pause record says who paused the task (issue 12). A task
		// paused already keeps its own: the operator's, note and all, or
		// this owner's of an earlier failure.
		return e.reg.PauseUnlessPaused(ctx, id, task.Pause{By: PausedByPolicy,
			Note: "paused by its owner after failures in a row (pause_on_failure)"})
	})
	e.loop.alerts = e.notify
	e.loop.unmark = func(runs []elsewhereRun) {
		life := e.sess.Load().Mutexes().Ctx()
		e.marking.Go(func() {
			// Until the session ends: a marker left behind keeps its run,
			// which the fire here replaced, going beside it. Past the
			// session, the partition's next owner reads the marker and
			// replaces it at its own replace fire.
			if err := e.replaceMarkers(life, runs); err != nil {
				e.log.Warn("the session ended before etcd took the deletes (or replaced marks) of the markers of runs on former owners: those runs, which a replace fire here should have canceled, go on there until the next owner's fire",
					"markers", len(runs), "err", err)
			}
		})
	}

	loopCtx, loopStop := context.WithCancel(context.Background())
	e.loopStop = loopStop
	e.loopDone = make(chan struct{})
	go func() {
		defer close(e.loopDone)
		e.loop.run(loopCtx)
	}()

	runCtx, cancel := context.WithCancel(context.Background())
	e.runCtx, e.cancel = runCtx, cancel
	e.drained = make(chan struct{})
	e.writers.Go(func() { e.writeChains(e.pool.chains, e.drained) })
	e.writers.Go(func() { e.deleteTriggers(e.pool.ends, e.drained) })
	e.wg.Add(7)
	go func() {
		defer e.wg.Done()
		logMisfires(runCtx, e.log, misfireLogEvery, e.cfg.MisfireThreshold, e.stats.misfires.Load,
			func() time.Duration { return e.cfg.Clock.Now().Sub(time.Unix(0, e.pool.watermark.Load())) })
	}()
	// The watches follow from before the node's first acquire, whose
	// reads they take on from.
	from := e.reg.OpenRevision()
	go func() { defer e.wg.Done(); e.watchBackfills(runCtx, from) }()
	go func() { defer e.wg.Done(); e.deleteEnded(runCtx) }()
	go func() { defer e.wg.Done(); e.writeWatermarks(runCtx) }()
	go func() { defer e.wg.Done(); e.watchTriggers(runCtx, from) }()
	go func() { defer e.wg.Done(); e.checkTriggers(runCtx, e.loop.checks) }()
	go func() { defer e.wg.Done(); e.coordinate(runCtx, sess) }()
	return nil
}

// checkCacheOrigin drops the Badger cache of partitions when it was read
// from another etcd cluster or prefix (registry.Origin): its revisions
// belong to another history, and its tasks, loaded as synced, would fire
// though etcd has none of them. The origin is recorded after the drop, so
// that a crash between the two drops it again. A cache written before
// origins were kept is taken as this cluster's, as it always was.
func (e *Engine) checkCacheOrigin() error {
	if e.store == nil {
		return nil
	}
	want := e.reg.Origin()
	got, err := e.store.Origin()
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if bytes.Equal(got, want) {
		return nil
	}
	if got != nil {
		e.log.Warn("the task cache was read from another etcd cluster or prefix; dropping it, every partition loads from etcd",
			"prefix", e.cfg.Prefix)
		if err := e.store.DropTasks(); err != nil {
			return fmt.Errorf("engine: the task cache comes from another etcd cluster or prefix, and dropping it failed: %w", err)
		}
	}
	if err := e.store.SetOrigin(want); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}

// untilAnswered calls f until it returns anything but etcd being
// unavailable (a request timed out, a leader change, no leader, no
// connection), waiting more after each try, and returns what it returned,
// or its last error once ctx ends. Both start writes are safe to repeat:
// the registry's is conditional, and Join revokes the lease of a failed
// registration, so that its put cannot land later.
func untilAnswered[T any](ctx context.Context, log *slog.Logger, what string, f func() (T, error)) (T, error) {
	var b backoff
	for {
		v, err := f()
		if err == nil || !unavailable(err) || ctx.Err() != nil {
			return v, err
		}
		log.Warn(what+" failed; retrying", "err", err, "in", b.next())
		if !b.wait(ctx) {
			return v, err
		}
	}
}

// unavailable reports whether err says that etcd did not answer the
// request, for now: code Unavailable, which etcd gives a request that timed
// out, a leader change and a member without a leader, and gRPC a missing
// connection.
func unavailable(err error) bool {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	return status.Code(err) == codes.Unavailable
}

// fenced reports whether the node must not dispatch: its session is past
// the fencing deadline or gone.
func (e *Engine) fenced() bool {
	s := e.sess.Load()
	if s == nil {
		return true
	}
	if s.Fenced() {
		e.fences.note(s)
		return true
	}
	return false
}

// Ready reports whether the node owns every partition the ring gives it.
func (e *Engine) Ready() bool { return e.ready.Load() }

// PausedByPolicy is who a task's pause record names when its owner paused
// it after failures in a row (pause_on_failure).
const PausedByPolicy = "pause_on_failure"

// Fenced reports whether the node is fenced: it dispatches nothing until it
// has rejoined with a new session.
func (e *Engine) Fenced() bool { return e.fenced() }

// Close leaves the cluster gracefully: it marks the node as leaving, so
// that the other nodes prepare its partitions while it still fires them,
// then releases every partition with its checkpoint written (so the next
// owner resumes exactly where this node stopped), lets queued and running
// executions finish within DrainTimeout, canceling those still running
// after it, and revokes the session; Hurry cuts the waits short. A
// canceled attempt with attempts left has its retry, due at once, written
// to etcd for its partition's next owner before the session's lease is
// revoked (5 s at most: one etcd refuses is lost, logged). Close is
// idempotent.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		defer close(e.done)
		if !e.started.Load() || e.cancel == nil {
			return
		}
		e.leave()
		e.cancel()
		e.wg.Wait() // the coordinator released the partitions
		e.stopAllBackfills()
		e.loopStop()
		<-e.loopDone
		e.pool.loopGone()
		drained, cut := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(cut)
			select {
			case <-e.hurry:
				e.pool.stopExecutions() // as at DrainTimeout
			case <-drained:
			}
		}()
		if e.pool.drain(e.cfg.DrainTimeout) {
			e.log.Warn("the drain timeout canceled the executions still running; their execution records say canceled, and the retries of those with attempts left are handed on to their partitions' next owners",
				"drain_timeout", e.cfg.DrainTimeout)
		}
		close(drained)
		<-cut
		e.loop.deletedRunsDrained() // deleted tasks' runs that ended in the drain recorded themselves: no restart finds those
		e.notify.stop(min(e.cfg.DrainTimeout, notifyGrace))
		close(e.drained) // the workers are done: write the chains and deletes they queued
		e.writers.Wait()
		if s := e.sess.Load(); s != nil {
			// A fenced session has ended already; failing to revoke its
			// lease then only means etcd is still out of reach.
			fenced := s.Fenced()
			if err := s.Close(); err != nil && !fenced && !errors.Is(err, membership.ErrClosed) {
				e.closeErr = err
			}
		}
		e.marking.Wait() // the session's end ends them
		e.execs.shared.HTTP.CloseIdleConnections()
	})
	return e.closeErr
}

// Hurry cuts a Close short, one under way or one to come: Close stops
// waiting for the other nodes to prepare its partitions (it still releases
// them with their checkpoints written) and for running executions, which
// it cancels as at DrainTimeout. It still waits for the acquires that
// loaded their partition, which have fired it (for the dispatch loop, and
// 5 s at most for each of their last etcd reads): undone, the next owner
// would fire those again. Before Close the node fires on: Hurry
// changes nothing else, but that a release the ring makes meanwhile does
// not wait for its partitions' attempts under way either
// (Config.ReleaseRunWait; their markers and retries go through etcd).
// Hurry may be called from any goroutine, more than once.
func (e *Engine) Hurry() { e.hurryOnce.Do(func() { close(e.hurry) }) }

// leave marks the node as leaving and waits, prepareWait at most, until
// the other nodes took its partitions over (make-before-break).
func (e *Engine) leave() {
	s := e.sess.Load()
	if s == nil || s.Fenced() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
	err := s.Leave(ctx)
	cancel()
	if err != nil {
		e.log.Warn("marking the node as leaving failed; releasing its partitions at once", "err", err)
		return
	}
	t := time.NewTimer(prepareWait)
	defer t.Stop()
	select {
	case <-e.left:
	case <-s.Done():
	case <-e.hurry:
	case <-t.C:
		e.log.Warn("the other nodes did not take every partition over in time; releasing the rest", "waited", prepareWait)
	}
}

// Done is closed when Close has returned: the node left the cluster, its
// partitions are handed over and its executions drained.
func (e *Engine) Done() <-chan struct{} { return e.done }

// request sends the loop a command that answers on reply, and waits for
// the answer, unless the loop ends or ctx does first.
func request[T any](ctx context.Context, e *Engine, c command, reply <-chan T) (T, error) {
	var zero T
	if err := e.call(ctx, c); err != nil {
		return zero, err
	}
	select {
	case v := <-reply:
		return v, nil
	case <-e.loopDone:
		return zero, ErrClosed
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// call sends a command to the dispatch loop, unless the loop is gone.
func (e *Engine) call(ctx context.Context, c command) error {
	if e.loop == nil {
		return ErrClosed
	}
	select {
	case e.loop.cmds <- c:
		return nil
	case <-e.loopDone:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TaskState returns the state of a task this node owns, and false when it
// does not own it.
func (e *Engine) TaskState(ctx context.Context, id string) (*task.State, bool) {
	c := &stateCmd{id: id, reply: make(chan *task.State, 1)}
	s, err := request(ctx, e, c, c.reply)
	return s, err == nil && s != nil
}

// Owns reports whether this node owns partition p.
func (e *Engine) Owns(p int) bool { return p >= 0 && p < len(e.owned) && e.owned[p].Load() }

// Assignment returns the ring's current assignment of partitions to nodes,
// nil before the first membership list.
func (e *Engine) Assignment() *ring.Assignment { return e.ring.Current() }

// NodeID returns the node's id.
func (e *Engine) NodeID() string { return e.cfg.NodeID }

// Stats is a snapshot of the engine's counters.
type Stats struct {
	Fires           uint64            // fires dispatched (first attempts)
	Staged          uint64            // of which released from a stage built before their tick (stage.go)
	StageDrops      map[string]uint64 // ticks whose stage could not be used, by cause: changed, late, mismatch
	Executions      map[string]uint64 // attempts by status, including skipped and misfired fires
	Misfires        uint64
	FireLag         Histogram // from a fire's due time (scheduled plus jitter) to a worker taking it
	QueueDepth      int
	QueueCapacity   int // fires that may wait for a worker (Config.Queue)
	Workers         int // executions that run at once (Config.Workers)
	PartitionsOwned int
	Tasks           int
	Fenced          bool
	Fences          uint64    // sessions of this node that ended fenced (each followed by a rejoin)
	ExecDuration    Histogram // how long executions took, noop ones left out
	// HandOver times the phases of the hand-overs this node went through,
	// by phase: prepare, lock_wait and take on the new owner (take is the
	// gap in the partition's fires), release on the old one.
	HandOver        map[string]Histogram
	Ready           bool
	Watermark       time.Time         // the node watermark etcd last acknowledged
	EtcdNoSpace     bool              // etcd refused the last watermark write for lack of space (its NOSPACE alarm)
	FullLoads       uint64            // partitions loaded with a full etcd range read
	StandbyReady    int               // partitions prepared for nodes that look dead, not yet taken (standby.go)
	StandbyTaken    uint64            // partitions acquired from the standby
	HistoryDropped  uint64            // records refused (buffer full) or lost to a failed write
	HistoryFailed   uint64            // records lost to a failed write (disk full, I/O error); also in HistoryDropped
	HistorySampled  uint64            // successes left out of the history by sampling
	HistorySampling int               // one success in HistorySampling is recorded (1: all)
	EtcdRequests    map[string]uint64 // when Config.Requests is set

	// Alerts (issue 9): alerts by result (sent, failed, refused by
	// --http-allow, dropped on a full queue), and tasks paused by
	// pause_on_failure.
	Notify          map[string]uint64
	PausedOnFailure uint64

	// Issue 9, part 6: misfires by the task's misfire policy (they add up
	// to Misfires), retries waiting for their backoff, and failed writes
	// to the Badger partition cache (each drops that partition's cache
	// until its next etcd read; history write failures are HistoryFailed).
	MisfiresByPolicy map[string]uint64
	RetryBacklog     int
	CacheWriteErrors uint64
	// ChainsDropped counts ended fires whose on_success/on_failure
	// triggers were dropped because the queue of trigger writes was full.
	ChainsDropped uint64
	// RetriesHandedOn counts the retries this node handed on through etcd:
	// of attempts that failed after their partition's graceful release
	// was sealed, or that its stop canceled (leavers).
	RetriesHandedOn uint64
	// RunsMarked counts the runs this node marked in etcd at a graceful
	// release, because they went on past its wait (ReleaseRunWait; elsewhere.go);
	// RunsElsewhere is how many such runs its tasks count as running now
	// (not those a replace fire canceled but for their backfill's fires).
	RunsMarked    uint64
	RunsElsewhere int
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	s := Stats{
		Fires:        e.stats.fires.Load(),
		Staged:       e.stats.staged.Load(),
		Executions:   make(map[string]uint64, numStatus),
		Misfires:     e.stats.misfires.Load(),
		FireLag:      e.stats.lag(),
		Fenced:       e.fenced(),
		Ready:        e.Ready(),
		EtcdNoSpace:  e.acked.noSpace.Load(),
		FullLoads:    e.loads.Load(),
		StandbyReady: int(e.standby.ready.Load()),
		StandbyTaken: e.standby.taken.Load(),

		QueueCapacity: e.cfg.Queue,
		Workers:       e.cfg.Workers,
		Fences:        e.fences.n.Load(),
		ExecDuration:  e.execDur.snapshot(),
		HandOver:      make(map[string]Histogram, numPhases),
	}
	for ph, name := range phaseNames {
		s.HandOver[name] = e.handOver[ph].snapshot()
	}
	for st := statusOK; st < numStatus; st++ {
		s.Executions[statusNames[st]] = e.stats.execs[st].Load()
	}
	if w := e.acked.at.Load(); w != 0 {
		s.Watermark = time.Unix(0, w).UTC()
	}
	if e.loop != nil {
		s.Tasks = int(e.loop.tasks.Load())
		s.PartitionsOwned = int(e.loop.owned.Load())
		s.QueueDepth = e.pool.depth()
	}
	if e.store != nil {
		s.HistoryDropped, s.HistoryFailed = e.store.Dropped(), e.store.WriteFailed()
		s.HistorySampled, s.HistorySampling = e.store.Sampled(), e.store.Sampling()
	}
	if e.cfg.Requests != nil {
		s.EtcdRequests = e.cfg.Requests.Counts()
	}
	s.Notify = make(map[string]uint64, numNotifyResults)
	for r, name := range notifyResultNames {
		s.Notify[name] = e.notify.results[r].Load()
	}
	s.PausedOnFailure = e.notify.pauses.Load()
	s.MisfiresByPolicy = make(map[string]uint64, len(misfirePolicies))
	for k, p := range misfirePolicies {
		s.MisfiresByPolicy[string(p)] = e.stats.misfiresBy[k].Load()
	}
	s.StageDrops = make(map[string]uint64, numStageDrops)
	for c, name := range stageDropNames {
		s.StageDrops[name] = e.stats.stageDrops[c].Load()
	}
	s.CacheWriteErrors = e.stats.cacheFailed.Load()
	s.ChainsDropped = e.pool.chains.dropped.Load()
	s.RetriesHandedOn = e.pool.leaving.handedOn.Load()
	s.RunsMarked = e.stats.runsMarked.Load()
	s.RunsElsewhere = int(e.stats.runsElsewhere.Load())
	if e.loop != nil {
		s.RetryBacklog = int(e.loop.retrying.Load())
	}
	return s
}

// History returns the execution records of a task kept on this node, newest
// first, at most as many of each class as the task's history_limit says
// now, or the node's limits for a field it leaves out or a task deleted:
// the store deletes a ring's extra records only at the task's next
// execution of that class here, which a task that fires rarely, or that
// this node no longer owns, may never have. It reads the task from etcd,
// for historyLimitsWait at most: the records are this node's, and an etcd
// out of reach held the answer until the request's own deadline; when the
// read fails, it answers every record kept.
func (e *Engine) History(ctx context.Context, id string, limit int) ([]task.Execution, error) {
	if e.store == nil {
		return nil, nil
	}
	keep := [2]int{store.MaxHistoryLimit, store.MaxHistoryLimit}
	rctx, cancel := context.WithTimeout(ctx, historyLimitsWait)
	t, err := e.reg.Get(rctx, id)
	cancel()
	switch {
	case err == nil:
		keep = historyKeep(t.HistoryLimit)
	case errors.Is(err, registry.ErrNotFound):
		keep = historyKeep(nil)
	}
	return e.store.HistoryKeep(id, limit, keep[0], keep[1])
}

// Members lists the cluster's live nodes.
func (e *Engine) Members(ctx context.Context) ([]membership.Member, error) {
	ms, _, err := membership.List(ctx, e.cli, e.cfg.Prefix)
	return ms, err
}
