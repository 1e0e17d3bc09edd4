package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// TestEngine_ConcurrencyPolicies fires an every-second task on a clock the
// test moves one second at a time, with a handler that blocks until the test
// releases it, and checks what each concurrency policy does with a fire that
// comes due while the previous one still runs.
func TestEngine_ConcurrencyPolicies(t *testing.T) {
	t.Parallel()
	at := func(s int) time.Time { return time.Date(2026, 5, 4, 12, 0, s, 0, time.UTC) }
	type env struct {
		n     *testNode
		clock *testClock
		g     *gate
	}
	const id = "conc"
	// fire moves the clock to the next second and returns the fire that
	// started with it.
	fire := func(t *testing.T, e env) Fire {
		t.Helper()
		e.clock.Advance(time.Second)
		return e.g.next(t)
	}
	waitStatuses := func(t *testing.T, e env, s int, want ...string) {
		t.Helper()
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return slices.Equal(statusesAt(t, e.n, id, at(s)), want) })
	}
	wantSched := func(t *testing.T, f Fire, s int) {
		t.Helper()
		if !f.ScheduledAt.Equal(at(s)) {
			t.Fatalf("started the fire of %v, want %v", f.ScheduledAt, at(s))
		}
	}
	tests := []struct {
		policy task.ConcurrencyPolicy
		run    func(t *testing.T, e env)
		fires  uint64 // state counters at the end
		skip   uint64
	}{
		{task.ConcurrencyAllow, func(t *testing.T, e env) {
			wantSched(t, fire(t, e), 1)
			// 01 still runs: 02 runs alongside it.
			wantSched(t, fire(t, e), 2)
			e.g.releaseOne(t)
			e.g.releaseOne(t)
			waitStatuses(t, e, 1, "ok")
			waitStatuses(t, e, 2, "ok")
		}, 2, 0},
		{task.ConcurrencyForbid, func(t *testing.T, e env) {
			wantSched(t, fire(t, e), 1)
			// 01 still runs: 02 is skipped and recorded.
			e.clock.Advance(time.Second)
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return taskState(t, e.n, id).Skipped == 1 })
			e.g.none(t)
			e.g.releaseOne(t)
			waitStatuses(t, e, 1, "ok")
			waitStatuses(t, e, 2, "skipped")
			// Nothing runs: 03 fires as usual.
			wantSched(t, fire(t, e), 3)
			e.g.releaseOne(t)
			waitStatuses(t, e, 3, "ok")
		}, 2, 1},
		{task.ConcurrencyBufferOne, func(t *testing.T, e env) {
			wantSched(t, fire(t, e), 1)
			// 02 waits for 01; 03 finds 02 waiting and is skipped.
			e.clock.Advance(time.Second)
			e.clock.Advance(time.Second)
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return taskState(t, e.n, id).Skipped == 1 })
			e.g.none(t)
			// 01 ends: 02 starts.
			e.g.releaseOne(t)
			wantSched(t, e.g.next(t), 2)
			e.g.releaseOne(t)
			waitStatuses(t, e, 1, "ok")
			waitStatuses(t, e, 2, "ok")
			waitStatuses(t, e, 3, "skipped")
			e.g.none(t)
		}, 2, 1},
		{task.ConcurrencyReplace, func(t *testing.T, e env) {
			wantSched(t, fire(t, e), 1)
			// 02 cancels 01 and runs.
			wantSched(t, fire(t, e), 2)
			waitStatuses(t, e, 1, "canceled")
			e.g.releaseOne(t)
			waitStatuses(t, e, 2, "ok")
		}, 2, 0},
	}
	for _, tt := range tests {
		t.Run(string(tt.policy), func(t *testing.T) {
			t.Parallel()
			c := etcdtest.Start(t)
			clock := newTestClock(at(0).Add(time.Second/2), 0)
			n := startNode(t, c, "", nil, clockTweak(clock, time.Hour, nil))
			g := newGate(t)
			n.e.Handle("h", g.handler)
			tsk := handlerTask(id, "* * * * * *")
			tsk.Concurrency = tt.policy
			putTask(t, n.e.Registry(), tsk)
			waitNext(t, n, id, at(1))

			tt.run(t, env{n: n, clock: clock, g: g})

			st := taskState(t, n, id)
			if st.Fires != tt.fires || st.Skipped != tt.skip {
				t.Errorf("state: %d fires, %d skipped; want %d and %d", st.Fires, st.Skipped, tt.fires, tt.skip)
			}
		})
	}
}

// TestEngine_Retries checks that a failed fire is retried with the same
// identity until it succeeds, and that exhausted retries end in a failure
// that the state counts.
func TestEngine_Retries(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := &callLog{}
	n := startNode(t, c, "", nil, nil)
	// flaky fails its first two attempts of every fire; broken always fails.
	n.e.Handle("flaky", log.handler(func(_ context.Context, f Fire) error {
		if f.Attempt < 3 {
			return fmt.Errorf("attempt %d fails", f.Attempt)
		}
		return nil
	}))
	n.e.Handle("broken", log.handler(func(context.Context, Fire) error { return errors.New("always fails") }))
	retrying := func(id, handler string, attempts int) *task.Task {
		tsk := handlerTask(id, "* * * * * *")
		tsk.Executor.Name = handler
		tsk.Retry = task.Retry{MaxAttempts: attempts, Backoff: task.Duration(100 * time.Millisecond)}
		return tsk
	}
	putTask(t, n.e.Registry(), retrying("flaky", "flaky", 3))
	putTask(t, n.e.Registry(), retrying("broken", "broken", 2))

	// lastAttempt returns the scheduled time of the first fire of id that
	// reached attempt k.
	lastAttempt := func(id string, k int) (time.Time, bool) {
		for _, c := range log.of(id) {
			if c.Attempt == k {
				return c.ScheduledAt, true
			}
		}
		return time.Time{}, false
	}
	var flaky, broken time.Time
	etcdtest.WaitFor(t, 15*time.Second, func() bool {
		var ok1, ok2 bool
		flaky, ok1 = lastAttempt("flaky", 3)
		broken, ok2 = lastAttempt("broken", 2)
		return ok1 && ok2
	})

	t.Run("then success", func(t *testing.T) {
		var got []call
		for _, c := range log.of("flaky") {
			if c.ScheduledAt.Equal(flaky) {
				got = append(got, c)
			}
		}
		if len(got) != 3 {
			t.Fatalf("%d attempts of the fire at %v, want 3: %+v", len(got), flaky, got)
		}
		for i, c := range got {
			if c.Attempt != i+1 {
				t.Errorf("call %d is attempt %d", i, c.Attempt)
			}
			if c.IdempotencyKey() != got[0].IdempotencyKey() || c.Fence != got[0].Fence || c.Node != got[0].Node {
				t.Errorf("attempt %d is fire %s (fence %d, node %s), attempt 1 was %s (fence %d, node %s)",
					c.Attempt, c.IdempotencyKey(), c.Fence, c.Node, got[0].IdempotencyKey(), got[0].Fence, got[0].Node)
			}
		}
		etcdtest.WaitFor(t, 5*time.Second, func() bool {
			return slices.Equal(statusesAt(t, n, "flaky", flaky), []string{"failed", "failed", "ok"})
		})
	})
	t.Run("exhausted", func(t *testing.T) {
		etcdtest.WaitFor(t, 5*time.Second, func() bool {
			return slices.Equal(statusesAt(t, n, "broken", broken), []string{"failed", "failed"})
		})
		for _, c := range log.of("broken") {
			if c.Attempt > 2 {
				t.Errorf("attempt %d of %s after max_attempts 2", c.Attempt, c.IdempotencyKey())
			}
		}
		for _, e := range history(t, n, "broken") {
			if e.Status == "failed" && e.Error != "always fails" {
				t.Errorf("failed record with error %q, want the handler's", e.Error)
			}
		}
		// The loop counts an attempt once the worker's completion reaches
		// it, after the worker wrote its record: wait for the second.
		etcdtest.WaitFor(t, 5*time.Second, func() bool { return taskState(t, n, "broken").Failures >= 2 })
		st := taskState(t, n, "broken")
		if st.Failures < 2 || st.LastStatus != "failed" {
			t.Errorf("state: %d failures, last status %q; want at least 2 and failed", st.Failures, st.LastStatus)
		}
	})
}

// TestEngine_Timeout checks that the task's timeout ends an attempt through
// its context, and that the attempt counts as a timeout whatever error the
// handler returns once its context is done.
func TestEngine_Timeout(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	c := etcdtest.Start(t)
	n := startNode(t, c, "", nil, nil)
	tests := []struct {
		name string
		ret  func(ctx context.Context) error
	}{
		{"returns ctx.Err", func(ctx context.Context) error { return ctx.Err() }},
		{"returns its own error", func(context.Context) error { return errors.New("gave up") }},
	}
	type seen struct {
		deadline, start time.Time
		hasDeadline     bool
		err             error // ctx.Err() once done
	}
	var mu sync.Mutex
	obs := map[string]seen{}
	for _, tt := range tests {
		n.e.Handle(tt.name, func(ctx context.Context, f Fire) error {
			s := seen{start: time.Now()}
			s.deadline, s.hasDeadline = ctx.Deadline()
			<-ctx.Done()
			s.err = ctx.Err()
			mu.Lock()
			if _, ok := obs[tt.name]; !ok {
				obs[tt.name] = s
			}
			mu.Unlock()
			return tt.ret(ctx)
		})
		tsk := handlerTask(tt.name, "* * * * * *")
		tsk.Executor.Name = tt.name
		tsk.Timeout = task.Duration(timeout)
		putTask(t, n.e.Registry(), tsk)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rec []string
			etcdtest.WaitFor(t, 15*time.Second, func() bool {
				for _, e := range history(t, n, tt.name) {
					rec = []string{e.Status, e.Error}
					return true
				}
				return false
			})
			if rec[0] != "timeout" || !strings.Contains(rec[1], context.DeadlineExceeded.Error()) {
				t.Errorf("record: status %q, error %q; want timeout and an error wrapping %q", rec[0], rec[1], context.DeadlineExceeded)
			}
			mu.Lock()
			s := obs[tt.name]
			mu.Unlock()
			if !errors.Is(s.err, context.DeadlineExceeded) {
				t.Errorf("the handler's context ended with %v, want %v", s.err, context.DeadlineExceeded)
			}
			if !s.hasDeadline || s.deadline.Sub(s.start) > timeout {
				t.Errorf("the handler's context has deadline %v (set: %v), %v after its start; want at most %v",
					s.deadline, s.hasDeadline, s.deadline.Sub(s.start), timeout)
			}
		})
	}
}

// TestEngine_BufferedFireDoesNotStallNode keeps a buffer_one fire waiting
// behind a long run for several seconds, and checks that the node's other
// tasks fire meanwhile: a waiting fire must not hold the node's watermark,
// and with it the bounded lead of every task, behind it.
func TestEngine_BufferedFireDoesNotStallNode(t *testing.T) {
	t.Parallel()
	at := func(s int) time.Time { return time.Date(2026, 5, 4, 12, 0, s, 0, time.UTC) }
	c := etcdtest.Start(t)
	clock := newTestClock(at(0).Add(time.Second/2), 0)
	log := &callLog{}
	n := startNode(t, c, "", log.handler(nil), clockTweak(clock, time.Hour, nil))
	g := newGate(t)
	n.e.Handle("slow", g.handler)
	slow := handlerTask("slow", "* * * * * *")
	slow.Executor.Name = "slow"
	slow.Concurrency = task.ConcurrencyBufferOne
	putTask(t, n.e.Registry(), slow)
	putTask(t, n.e.Registry(), handlerTask("other", "* * * * * *"))
	waitNext(t, n, "slow", at(1))
	waitNext(t, n, "other", at(1))

	clock.Advance(time.Second)
	if f := g.next(t); !f.ScheduledAt.Equal(at(1)) {
		t.Fatalf("slow started the fire of %v, want %v", f.ScheduledAt, at(1))
	}
	// slow's 02 waits for 01, which runs on; every later fire of slow is
	// skipped, and other fires every second.
	for s := 2; s <= 6; s++ {
		clock.Advance(time.Second)
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt("other", at(s)) })
	}
	g.releaseOne(t)
	if f := g.next(t); !f.ScheduledAt.Equal(at(2)) {
		t.Fatalf("slow started the fire of %v, want the buffered %v", f.ScheduledAt, at(2))
	}
	g.releaseOne(t)
	if st := taskState(t, n, "slow"); st.Skipped != 4 {
		t.Errorf("slow skipped %d fires, want 4 (03-06)", st.Skipped)
	}
}

// concurrency replace also cancels a fire still waiting for a worker: only
// the newest fire runs, the older one is recorded as canceled, unrun.
func TestEngine_ReplaceCancelsQueuedFire(t *testing.T) {
	at := func(s int) time.Time { return time.Date(2026, 5, 4, 12, 0, s, 0, time.UTC) }
	c := etcdtest.Start(t)
	clock := newTestClock(at(0).Add(time.Second/2), 0)
	log := &callLog{}
	g := newGate(t)
	h := log.handler(g.only("blocker"))
	// One worker, and a lead long enough for rep@02 to be released while
	// rep@01 still waits behind the blocked worker.
	n := startNode(t, c, "", h, clockTweak(clock, time.Hour, func(cfg *Config) { cfg.Workers = 1; cfg.Lead = 10 * time.Second }))
	putTask(t, n.e.Registry(), handlerTask("blocker", "* * * * * *"))
	waitNext(t, n, "blocker", at(1))
	clock.Advance(time.Second) // blocker@01 takes the only worker
	g.next(t)

	rep := handlerTask("rep", "* * * * * *")
	rep.Concurrency = task.ConcurrencyReplace
	putTask(t, n.e.Registry(), rep)
	waitNext(t, n, "rep", at(2))
	clock.Advance(time.Second) // rep@02 waits for the worker
	waitNext(t, n, "rep", at(3))
	clock.Advance(time.Second) // rep@03 replaces rep@02 before it started
	waitNext(t, n, "rep", at(4))
	g.open()
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt("rep", at(3)) })
	if got := secs(log.scheds("rep")); !slices.Equal(got, []string{"12:00:03.000"}) {
		t.Errorf("rep ran at %v; want only 12:00:03 (rep@03 replaced rep@02 before it started)", got)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return slices.Equal(statusesAt(t, n, "rep", at(2)), []string{"canceled"})
	})
}

// A retry that comes due while a newer fire of a forbid task runs is
// skipped: forbid keeps fires of a task apart, retries included.
func TestEngine_RetryRespectsForbid(t *testing.T) {
	at := func(s int) time.Time { return time.Date(2026, 5, 4, 12, 0, s, 0, time.UTC) }
	c := etcdtest.Start(t)
	clock := newTestClock(at(0).Add(time.Second/2), 0)
	n := startNode(t, c, "", nil, clockTweak(clock, time.Hour, func(cfg *Config) { cfg.Lead = 10 * time.Second }))
	g := newGate(t) // after the node: it opens before the node closes
	n.e.Handle("h", func(ctx context.Context, f Fire) error {
		switch {
		case f.ScheduledAt.Equal(at(1)) && f.Attempt == 1:
			return errors.New("first attempt fails")
		case f.ScheduledAt.Equal(at(2)):
			return g.handler(ctx, f) // still running when the retry comes due
		}
		return nil
	})
	tsk := handlerTask("r", "* * * * * *")
	tsk.Concurrency = task.ConcurrencyForbid
	tsk.Retry = task.Retry{MaxAttempts: 2, Backoff: task.Duration(2 * time.Second), MaxBackoff: task.Duration(2 * time.Second)}
	putTask(t, n.e.Registry(), tsk)
	waitNext(t, n, "r", at(1))
	clock.Advance(time.Second) // r@01 fails; its retry waits 1-2 s
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return slices.Equal(statusesAt(t, n, "r", at(1)), []string{"failed"}) })
	clock.Advance(time.Second) // r@02 starts and blocks
	g.next(t)
	clock.Advance(2 * time.Second) // the retry of r@01 comes due while r@02 runs
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return slices.Equal(statusesAt(t, n, "r", at(1)), []string{"failed", "skipped"})
	})
}

// queuedBehindABlocker starts a node with one worker on which blocker's
// fire of 12:00:01 holds the worker, so that id's fire of 12:00:02 waits
// in the queue; it then runs change (a delete, a pause) and waits until
// witness's fire of 12:00:03, queued after id's, has run. It returns the
// node and its call log.
func queuedBehindABlocker(t *testing.T, id string, change func(n *testNode)) (*testNode, *callLog) {
	t.Helper()
	at := func(s int) time.Time { return time.Date(2026, 5, 4, 12, 0, s, 0, time.UTC) }
	c := etcdtest.Start(t)
	clock := newTestClock(at(0).Add(time.Second/2), 0)
	log := &callLog{}
	// One worker, and a lead long enough for the fires of 02 and 03 to be
	// queued while the blocker holds the worker.
	n := startNode(t, c, "", nil, clockTweak(clock, time.Hour, func(cfg *Config) { cfg.Workers = 1; cfg.Lead = 10 * time.Second }))
	g := newGate(t)
	n.e.Handle("h", log.handler(g.only("blocker")))
	for _, x := range []string{"blocker", id, "witness"} {
		putTask(t, n.e.Registry(), handlerTask(x, "* * * * * *"))
		waitNext(t, n, x, at(1))
	}
	clock.Advance(time.Second)
	for f := g.next(t); !f.ScheduledAt.Equal(at(1)); f = g.next(t) {
	}
	clock.Advance(time.Second) // id@02 waits in the queue behind blocker@01
	waitNext(t, n, id, at(3))
	if d := n.e.pool.depth(); d < 2 {
		t.Fatalf("%d fires queued, want those of 02", d)
	}
	change(n)
	clock.Advance(time.Second) // witness@03 is queued after id@02
	waitNext(t, n, "witness", at(4))
	g.open()
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt("witness", at(3)) })
	return n, log
}

// A task deleted while a fire of it waits for a worker: the fire is
// dropped unrun. The delete takes effect on the owner within a watch
// delivery, not once a queue held up by a slow executor reaches it.
func TestEngine_DeleteDropsQueuedFire(t *testing.T) {
	at2 := time.Date(2026, 5, 4, 12, 0, 2, 0, time.UTC)
	_, log := queuedBehindABlocker(t, "doomed", func(n *testNode) {
		if err := n.e.Registry().Delete(context.Background(), "doomed"); err != nil {
			t.Fatal(err)
		}
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return !owns(n, "doomed") })
	})
	if got := log.scheds("doomed"); slices.ContainsFunc(got, func(s time.Time) bool { return !s.Before(at2) }) {
		t.Errorf("doomed ran at %v after its delete; want nothing from 12:00:02 (it was queued, unrun)", secs(got))
	}
}

// A task paused while a fire of its schedule waits for a worker: the fire
// is skipped unrun (recorded so), as a retry due while the task is paused
// is. A pause takes effect on the owner within a watch delivery (invariant
// 6), not once a queue held up by a slow executor reaches the fire: it ran,
// seconds or minutes after the pause, against the endpoint the operator
// paused it to spare.
func TestEngine_PauseSkipsQueuedFire(t *testing.T) {
	at2 := time.Date(2026, 5, 4, 12, 0, 2, 0, time.UTC)
	n, log := queuedBehindABlocker(t, "halted", func(n *testNode) {
		if _, err := n.e.Registry().Pause(context.Background(), "halted", task.Pause{By: "test"}); err != nil {
			t.Fatal(err)
		}
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return taskState(t, n, "halted").NextFireAt.IsZero() })
	})
	if got := log.scheds("halted"); slices.ContainsFunc(got, func(s time.Time) bool { return !s.Before(at2) }) {
		t.Errorf("halted ran at %v after its pause; want nothing from 12:00:02 (it was queued, unrun)", secs(got))
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return slices.Equal(statusesAt(t, n, "halted", at2), []string{"skipped"})
	})
}

// An exec task on a node started without AllowExec (--allow-exec) never
// runs its command: each fire fails with an error that says how to enable
// it. The same task on a node that allows exec runs, so the command itself
// works.
func TestEngine_ExecNeedsAllowExec(t *testing.T) {
	t.Parallel()
	touch, err := exec.LookPath("touch")
	if err != nil {
		t.Skip("no touch command")
	}
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow=%v", allow), func(t *testing.T) {
			c := etcdtest.Start(t)
			n := startNode(t, c, "", nil, func(cfg *Config) { cfg.AllowExec = allow })
			mark := filepath.Join(t.TempDir(), "ran")
			putTask(t, n.e.Registry(), &task.Task{ID: "exec", Schedule: "* * * * * *",
				Executor: task.Executor{Type: task.ExecutorExec, Command: []string{touch, mark}}})
			var rec task.Execution
			etcdtest.WaitFor(t, 10*time.Second, func() bool {
				hs := history(t, n, "exec")
				if len(hs) > 0 {
					rec = hs[0]
				}
				return len(hs) > 0
			})
			_, statErr := os.Stat(mark)
			if allow {
				if rec.Status != task.ExecutionOK || statErr != nil {
					t.Errorf("allowed: record %+v, command ran: %v", rec, statErr)
				}
				return
			}
			if rec.Status != task.ExecutionFailed || !strings.Contains(rec.Error, "--allow-exec") {
				t.Errorf("record %+v; want failed, with an error naming --allow-exec", rec)
			}
			if statErr == nil {
				t.Error("the command ran on a node without AllowExec")
			}
		})
	}
}

// TestEngine_Jitter runs 20 tasks with a 900 ms jitter on a clock the test
// steps 300 ms at a time: each fire keeps its scheduled time (its
// identity), but is released up to the jitter later, so the fires of one
// second spread over the steps instead of all running at the whole second.
func TestEngine_Jitter(t *testing.T) {
	t.Parallel()
	at := func(s int) time.Time { return time.Date(2026, 5, 4, 12, 0, s, 0, time.UTC) }
	c := etcdtest.Start(t)
	// Past the latest release of the fires of 12:00:00.
	clock := newTestClock(at(0).Add(950*time.Millisecond), 0)
	var mu sync.Mutex
	released := map[string]time.Time{} // idempotency key -> clock reading at the call
	h := func(ctx context.Context, f Fire) error {
		mu.Lock()
		defer mu.Unlock()
		released[f.IdempotencyKey()] = clock.Now()
		return nil
	}
	n := startNode(t, c, "", h, clockTweak(clock, time.Hour, nil))
	const tasks = 20
	for i := range tasks {
		tsk := handlerTask(fmt.Sprintf("jitter-%02d", i), "* * * * * *")
		tsk.Jitter = task.Duration(900 * time.Millisecond)
		putTask(t, n.e.Registry(), tsk)
		// The next fire keeps its whole second: jitter delays the release,
		// not the identity.
		waitNext(t, n, tsk.ID, at(1))
	}
	clock.Advance(50 * time.Millisecond) // 12:00:01.000
	for step := range 4 {
		if step > 0 {
			clock.Advance(300 * time.Millisecond)
		}
		now := clock.Now()
		// The acknowledged watermark at now: every fire released by now
		// has been taken.
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return !n.e.Stats().Watermark.Before(now) })
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(released) == tasks
	})
	mu.Lock()
	defer mu.Unlock()
	steps := map[time.Duration]int{} // fires by clock step after 12:00:01
	for key, when := range released {
		if !strings.HasSuffix(key, fmt.Sprintf("@%d", at(1).UnixMilli())) {
			t.Errorf("fire %s: want the scheduled time 12:00:01 in its key", key)
		}
		steps[when.Sub(at(1)).Round(300*time.Millisecond)]++
	}
	if steps[0] == tasks || len(steps) < 3 {
		t.Errorf("fires by clock step after 12:00:01: %v; want them spread over the 900 ms jitter", steps)
	}
}

// TestEngine_AllowListsRefuseAtFire: a task accepted elsewhere whose
// command lies outside this node's ExecAllow, or whose host outside its
// HTTPAllow, fails every fire with an error naming the allow-list, and
// neither the command nor the request runs.
func TestEngine_AllowListsRefuseAtFire(t *testing.T) {
	t.Parallel()
	touch, err := exec.LookPath("touch")
	if err != nil {
		t.Skip("no touch command")
	}
	hits := make(chan struct{}, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits <- struct{}{} }))
	defer srv.Close()
	c := etcdtest.Start(t)
	n := startNode(t, c, "", nil, func(cfg *Config) {
		cfg.AllowExec = true
		cfg.ExecAllow = []string{filepath.Join(t.TempDir(), "jobs")}
		cfg.HTTPAllow = []string{"127.0.0.2"}
	})
	mark := filepath.Join(t.TempDir(), "ran")
	putTask(t, n.e.Registry(), &task.Task{ID: "exec", Schedule: "* * * * * *",
		Executor: task.Executor{Type: task.ExecutorExec, Command: []string{touch, mark}}})
	putTask(t, n.e.Registry(), &task.Task{ID: "http", Schedule: "* * * * * *",
		Executor: task.Executor{Type: task.ExecutorHTTP, URL: srv.URL}})
	for id, want := range map[string]string{"exec": "exec allow-list", "http": "http allow-list (127.0.0.2)"} {
		var rec task.Execution
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			hs := history(t, n, id)
			if len(hs) > 0 {
				rec = hs[0]
			}
			return len(hs) > 0
		})
		if rec.Status != task.ExecutionFailed || !strings.Contains(rec.Error, want) {
			t.Errorf("%s: record %+v; want failed, with an error naming the %s", id, rec, want)
		}
	}
	if _, err := os.Stat(mark); err == nil {
		t.Error("a command outside ExecAllow ran")
	}
	if len(hits) != 0 {
		t.Error("a request outside HTTPAllow reached its server")
	}
}

// A retry that comes due while its task is paused is skipped, recorded as
// such: a pause stops what would start on its own, and an operator who
// paused a task whose endpoint is in trouble saw its retries hit it on
// (max_attempts up to 100, backoffs up to 24 h). Here the first attempt of
// a trigger fails after the task was paused.
func TestEngine_RetryDueWhilePausedIsSkipped(t *testing.T) {
	n, attempts, fail := startFailingNode(t)
	reg := n.e.Registry()
	putTask(t, reg, flakyTask(false)) // yearly: the trigger's fire alone
	etcdtest.WaitFor(t, 10*time.Second, func() bool { _, err := reg.Trigger(context.Background(), "flaky"); return err == nil })
	if a := <-attempts; a != 1 {
		t.Fatalf("first call is attempt %d", a)
	}
	if _, err := reg.Pause(context.Background(), "flaky", task.Pause{By: "test"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		ms, _, _, err := n.e.Query(context.Background(), task.StatusQuery{Status: task.StatusPaused, Limit: 10})
		return err == nil && len(ms) == 1
	})
	close(fail) // the first attempt fails now, its retry due 100-200 ms later
	if a, ran := retrySkippedAsPaused(t, n, attempts); ran {
		t.Errorf("attempt %d ran while the task was paused", a)
	}
}

// A backfill's retries run while its task is paused only until the
// backfill is canceled: a retry of its fire that comes due after the
// cancel is skipped, as any retry of a paused task, rather than hit the
// endpoint the pause and the cancel were to spare (up to 100 attempts over
// days). Here the first attempt of the backfill's only fire fails once the
// backfill is canceled.
func TestEngine_RetryOfACanceledBackfillOfAPausedTaskIsSkipped(t *testing.T) {
	n, attempts, fail := startFailingNode(t)
	reg := n.e.Registry()
	putTask(t, reg, flakyTask(true)) // yearly: the backfill's fire alone
	from := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := reg.Backfill(context.Background(), "flaky", from, from.Add(time.Hour), 1); err != nil {
		t.Fatal(err)
	}
	if a := <-attempts; a != 1 {
		t.Fatalf("first call is attempt %d", a)
	}
	if _, err := reg.CancelBackfill(context.Background(), "flaky"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !backfillRunning(n, "flaky") })
	close(fail) // the first attempt fails now, its retry due 100-200 ms later
	if a, ran := retrySkippedAsPaused(t, n, attempts); ran {
		t.Errorf("attempt %d of the canceled backfill's fire ran while the task was paused", a)
	}
}

// startFailingNode starts a node whose handler fails every attempt, the
// first only once fail is closed, and sends each attempt's number on
// attempts.
func startFailingNode(t *testing.T) (n *testNode, attempts chan int, fail chan struct{}) {
	c := etcdtest.Start(t)
	attempts, fail = make(chan int, 8), make(chan struct{})
	n = startNode(t, c, "", func(ctx context.Context, f Fire) error {
		attempts <- f.Attempt
		if f.Attempt == 1 {
			select {
			case <-fail:
			case <-ctx.Done():
			}
		}
		return errors.New("the endpoint is in trouble")
	}, nil)
	return n, attempts, fail
}

// flakyTask is the yearly task "flaky", three attempts a fire, 200 ms
// apart.
func flakyTask(paused bool) *task.Task {
	tk := handlerTask("flaky", "0 0 0 1 1 *")
	tk.Paused = paused
	tk.Retry = task.Retry{MaxAttempts: 3, Backoff: task.Duration(200 * time.Millisecond), MaxBackoff: task.Duration(200 * time.Millisecond)}
	return tk
}

// retrySkippedAsPaused waits until "flaky"'s retry was recorded skipped
// because the task is paused, or an attempt ran; it returns that attempt.
func retrySkippedAsPaused(t *testing.T, n *testNode, attempts chan int) (attempt int, ran bool) {
	t.Helper()
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		for _, e := range history(t, n, "flaky") {
			if e.Status == "skipped" && strings.Contains(e.Error, "paused") {
				return true
			}
		}
		return len(attempts) > 0
	})
	select {
	case a := <-attempts:
		return a, true
	default:
		return 0, false
	}
}

// A pause skips the fires of the task's schedule that have not started, in
// the queue and behind a running fire (buffer_one), and the record counts
// none of them as running; a trigger waiting behind a fire skipped starts.
func TestLoop_PauseSkipsTheFiresNotStarted(t *testing.T) {
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, behind := range []string{"schedule", "trigger"} {
		t.Run(behind, func(t *testing.T) {
			tl := newTestLoop(t, base.Add(-time.Second/2), nil)
			h := tl.everySecond(t)
			prof := noopProfile(task.MisfireFireOnce)
			prof.key, prof.concurrency = "noop/buffer_one", task.ConcurrencyBufferOne
			def := func(paused bool) taskDef {
				return taskDef{id: "b", hash: xxhash.Sum64String("b"), part: 0, sched: h, prof: prof, paused: paused}
			}
			tl.handle(&loadCmd{part: 0, resume: base.Add(-time.Second).UnixNano(), first: true, done: make(chan struct{}), defs: []taskDef{def(false)}})
			tl.clock.Advance(time.Second / 2)
			tl.dispatchAll() // b@+0 s queued, taken as running
			waiting := base.Add(time.Second)
			if behind == "trigger" {
				waiting = base.Add(time.Second / 4)
				tl.trigger(0, "b", waiting)
			} else {
				tl.clock.Advance(time.Second)
				tl.dispatchAll()
			}
			i, r, _ := tl.tab.lookup("b")
			if w, ok := tl.pending[i]; !ok || w.at != waiting.UnixNano() || r.running != 1 {
				t.Fatalf("before the pause: %d running, buffered %v %+v; want b@+0s queued and b@%s buffered", r.running, ok, w, waiting.Format(time.StampMilli))
			}
			tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def(true)}})
			var want []string
			skipped := uint32(2)
			if behind == "trigger" {
				want, skipped = []string{fmt.Sprintf("b@%d", waiting.UnixMilli())}, 1
			}
			if got := tl.dispatched(0); !slices.Equal(got, want) || r.running != uint16(len(want)) || r.skipped != skipped {
				t.Errorf("after the pause: dispatched %v, %d running, %d skipped; want %v, %d, %d", got, r.running, r.skipped, want, len(want), skipped)
			}
			if _, ok := tl.pending[i]; ok {
				t.Error("a fire still waits behind the fire skipped")
			}
		})
	}
}

// A resumed task fires from its next scheduled time on: the times that
// passed while it was paused were paused, not missed, and no misfire
// policy (fire_all here) brings them back.
func TestLoop_ResumeFiresFromTheNextTime(t *testing.T) {
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base.Add(-time.Second/2), nil)
	h := tl.everySecond(t)
	prof := noopProfile(task.MisfireFireAll)
	def := func(paused bool) taskDef {
		return taskDef{id: "r", hash: xxhash.Sum64String("r"), part: 0, sched: h, prof: prof, paused: paused}
	}
	tl.handle(&loadCmd{part: 0, resume: base.Add(-time.Second).UnixNano(), first: true, done: make(chan struct{}), defs: []taskDef{def(false)}})
	tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def(true)}})
	tl.clock.Advance(10 * time.Second)
	tl.dispatchAll()
	tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def(false)}})
	tl.dispatchAll()
	if got := tl.dispatched(0); len(got) != 0 {
		t.Errorf("the resume fired %v", got)
	}
	if _, r, _ := tl.tab.lookup("r"); r.next != base.Add(10*time.Second).UnixNano() {
		t.Errorf("resumed at %s, want 12:00:10", time.Unix(0, r.next).UTC().Format(time.StampMilli))
	}
}
