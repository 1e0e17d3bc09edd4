package engine

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

// This file holds the fixtures of the behaviour tests: a clock the test
// drives, a node on any client, a handler that blocks until released, and
// a log of handler calls with their real times.

// testClock is a Clock the test drives. It starts at a chosen instant,
// frozen (speed 0) or running at speed times real time, and jumps forward
// on Advance. It never goes backwards, as the engine's wheel expects.
type testClock struct {
	mu     sync.Mutex // guards at, anchor and speed
	at     time.Time  // the reading at anchor
	anchor time.Time  // real (monotonic) time of the last change
	speed  float64    // clock seconds per real second; 0 is frozen
}

func newTestClock(at time.Time, speed float64) *testClock {
	return &testClock{at: at.UTC(), anchor: time.Now(), speed: speed}
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nowLocked()
}

func (c *testClock) nowLocked() time.Time {
	return c.at.Add(time.Duration(float64(time.Since(c.anchor)) * c.speed))
}

// Until converts a clock interval into real time. A frozen clock never
// reaches a later instant by itself: the engine's loop wakes at least once
// a watermark interval anyway, and sees Advance then.
func (c *testClock) Until(t time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := t.Sub(c.nowLocked())
	switch {
	case d <= 0:
		return d
	case c.speed == 0:
		return time.Hour
	default:
		return time.Duration(float64(d) / c.speed)
	}
}

// Advance jumps the clock forward by d; it keeps its speed.
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at, c.anchor = c.nowLocked().Add(d), time.Now()
}

// SetSpeed makes the clock run at speed times real time from now on (0
// freezes it).
func (c *testClock) SetSpeed(speed float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at, c.anchor, c.speed = c.nowLocked(), time.Now(), speed
}

// quietLogger keeps warnings, which say why a test failed, and drops the
// rest.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// nodeOpt changes how startNodeOn starts a node.
type nodeOpt int

// noWait: return once the node started, without waiting until it is ready.
const noWait nodeOpt = 1

// stopAndDrain stops the nodes, in order, before a test counts what ran: a
// stopped node's workers are drained, so a run it was late with is in
// the count, where a sleep would only wait some time for it.
func stopAndDrain(t *testing.T, nodes ...*testNode) {
	t.Helper()
	for _, n := range nodes {
		n.stop(t)
	}
}

// startNodeOn is startNode with the node's own etcd client, e.g. one that
// goes through an etcdtest.Proxy.
func startNodeOn(t *testing.T, cli *clientv3.Client, dir string, h HandlerFunc, tweak func(*Config), opts ...nodeOpt) *testNode {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	st, err := store.Open(store.DefaultConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig("node-1")
	cfg.Partitions = 16
	cfg.LeaseTTL = 2 * time.Second
	cfg.Workers = 8
	cfg.Queue = 4096
	cfg.BatchSize = 1024
	cfg.DrainTimeout = 5 * time.Second
	cfg.Logger = quietLogger()
	if tweak != nil {
		tweak(&cfg)
	}
	e, err := New(cfg, cli, st)
	if err != nil {
		_ = st.Close()
		t.Fatal(err)
	}
	if h != nil {
		e.Handle("h", h)
	}
	n := &testNode{e: e, store: st, dir: dir}
	t.Cleanup(func() { n.stop(t) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(opts, noWait) {
		etcdtest.WaitFor(t, 20*time.Second, e.Ready)
	}
	return n
}

// taskState returns the owner's state of a task, failing the test when the
// node does not own it.
func taskState(t *testing.T, n *testNode, id string) *task.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, ok := n.e.TaskState(ctx, id)
	if !ok {
		t.Fatalf("node does not hold task %s", id)
	}
	return s
}

// owns reports whether the node's dispatch loop holds the task.
func owns(n *testNode, id string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, ok := n.e.TaskState(ctx, id)
	return ok
}

// closeInBackground closes n's engine on a goroutine of its own, as a node
// that leaves while the test goes on; Close's error comes on the channel.
func closeInBackground(n *testNode) <-chan error {
	closed := make(chan error, 1)
	e := n.e
	go func() { closed <- e.Close() }()
	return closed
}

// probeCmd runs f in the dispatch loop.
type probeCmd struct {
	f    func(l *loop)
	done chan struct{}
}

func (c *probeCmd) run(l *loop) { c.f(l); close(c.done) }

// inLoop returns what f returns, run in n's dispatch loop.
func inLoop(t *testing.T, n *testNode, f func(l *loop) bool) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got bool
	c := &probeCmd{f: func(l *loop) { got = f(l) }, done: make(chan struct{})}
	if _, err := request(ctx, n.e, c, c.done); err != nil {
		t.Fatalf("probing the loop: %v", err)
	}
	return got
}

// waitNext waits until the loop holds the task with its next fire at want:
// the task is loaded and armed, so a clock move fires it.
func waitNext(t *testing.T, n *testNode, id string, want time.Time) {
	t.Helper()
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, ok := n.e.TaskState(ctx, id)
		return ok && s.NextFireAt.Equal(want)
	})
}

// history returns the node's execution records of a task, oldest first
// (by scheduled time, then attempt).
func history(t *testing.T, n *testNode, id string) []task.Execution {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hs, err := n.e.History(ctx, id, 0)
	if err != nil {
		t.Fatalf("history of %s: %v", id, err)
	}
	slices.Reverse(hs)
	return hs
}

// statusesAt returns the statuses recorded for the fire of id at sched,
// by attempt order.
func statusesAt(t *testing.T, n *testNode, id string, sched time.Time) []string {
	t.Helper()
	var out []string
	for _, e := range history(t, n, id) {
		if e.ScheduledAt.Equal(sched) {
			out = append(out, e.Status)
		}
	}
	return out
}

// call is one handler call as a test saw it.
type call struct {
	Fire
	at time.Time // real time of the call, with its monotonic reading
}

// callLog records handler calls with their real times; its handler
// function is built around an optional behaviour.
type callLog struct {
	mu    sync.Mutex // guards calls
	calls []call
}

// handler returns a HandlerFunc that records each call as it starts, so
// that a call still blocked (at a gate) shows too, and returns what do
// returns (nil when do is nil).
func (l *callLog) handler(do func(ctx context.Context, f Fire) error) HandlerFunc {
	return func(ctx context.Context, f Fire) error {
		l.mu.Lock()
		l.calls = append(l.calls, call{Fire: f, at: time.Now()})
		l.mu.Unlock()
		if do != nil {
			return do(ctx, f)
		}
		return nil
	}
}

// of returns the calls of one task, in the order they were recorded.
func (l *callLog) of(id string) []call {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []call
	for _, c := range l.calls {
		if c.TaskID == id {
			out = append(out, c)
		}
	}
	return out
}

// scheds returns the scheduled times of a task's first attempts, in the
// order they were recorded.
func (l *callLog) scheds(id string) []time.Time {
	var out []time.Time
	for _, c := range l.of(id) {
		if c.Attempt == 1 {
			out = append(out, c.ScheduledAt)
		}
	}
	return out
}

// firedAt reports whether the task has a recorded first attempt scheduled
// at or after t.
func (l *callLog) firedAt(id string, t time.Time) bool {
	for _, s := range l.scheds(id) {
		if !s.Before(t) {
			return true
		}
	}
	return false
}

// gate is a handler that blocks each call until the test releases it, or
// until its context ends (then it returns the context's error).
type gate struct {
	started chan Fire     // every call sends its fire first
	release chan struct{} // each receive lets one call return nil
	once    sync.Once
}

// newGate returns a gate that opens when the test ends. Create it after
// the node and register its handler with Engine.Handle: cleanups run last
// first, so the gate opens before the node closes and nothing stays blocked
// for the drain timeout.
func newGate(t *testing.T) *gate {
	g := &gate{started: make(chan Fire, 64), release: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *gate) handler(ctx context.Context, f Fire) error {
	g.started <- f
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// only returns a handler body that blocks the fires of task id at the gate
// and lets every other fire through.
func (g *gate) only(id string) func(ctx context.Context, f Fire) error {
	return func(ctx context.Context, f Fire) error {
		if f.TaskID == id {
			return g.handler(ctx, f)
		}
		return nil
	}
}

// open releases every call, now and later.
func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// next returns the next fire that started.
func (g *gate) next(t *testing.T) Fire {
	t.Helper()
	select {
	case f := <-g.started:
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("no fire started within 10s")
		return Fire{}
	}
}

// none fails if a fire started and was not taken by next.
func (g *gate) none(t *testing.T) {
	t.Helper()
	select {
	case f := <-g.started:
		t.Fatalf("unexpected fire %s (attempt %d)", f.IdempotencyKey(), f.Attempt)
	default:
	}
}

// releaseOne lets one blocked call return.
func (g *gate) releaseOne(t *testing.T) {
	t.Helper()
	select {
	case g.release <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatal("no call waited to be released within 10s")
	}
}

func secs(ts []time.Time) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.UTC().Format("15:04:05.000")
	}
	return out
}

// watchesDown takes node n's watches down while the function during writes
// to etcd, n's session living on. n's client reaches member 0 of c (3 members)
// only: members 1 and 2 stop, so that member 0 loses its leader and
// cancels the watches that require one; member 0 stops; members 1 and 2
// start again, and during writes through them; then member 0 starts again,
// and watchesDown returns once n writes its watermark through it again.
// It fails the test if n's session ended meanwhile: a rejoin's acquires
// read what a watch would have delivered.
// watchesDownTTL is the lease of a node that watchesDown takes through
// the outage on its session: longer than the outage (up to 20 s for
// member 0 to cancel its watches, two elections, the writes) on a loaded
// machine, where a 20 s lease fenced the node in CI and failed the test.
const watchesDownTTL = time.Minute

func watchesDown(t *testing.T, c *etcdtest.Cluster, n *testNode, during func(ctx context.Context)) {
	t.Helper()
	m0, m1, m2 := c.Members[0], c.Members[1], c.Members[2]
	sess := n.e.sess.Load()
	// A watch of member 0 that requires a leader ends when member 0
	// cancels such watches: the node's have ended too.
	probe, cancel := context.WithCancel(clientv3.WithRequireLeader(t.Context()))
	defer cancel()
	wch := c.NewClient(t, m0.Endpoint()).Watch(probe, "probe")
	m1.Stop()
	m2.Stop()
	select {
	case <-wch:
	case <-time.After(20 * time.Second):
		t.Fatal("member 0 never canceled its watches after losing its leader")
	}
	m0.Stop()
	etcdtest.RestartMembers(t, m1, m2)
	ctx, cancelDuring := context.WithTimeout(t.Context(), 10*time.Second)
	during(ctx)
	cancelDuring()
	acked := n.e.acked.at.Load()
	m0.Restart(t)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return n.e.acked.at.Load() > acked })
	if n.e.sess.Load() != sess || sess.Fenced() {
		t.Fatal("the node's session ended: a rejoin's acquires read what the watches missed, and the test proves nothing")
	}
}
