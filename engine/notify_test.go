package engine

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// alertSink is an httptest receiver of alerts.
type alertSink struct {
	srv    *httptest.Server
	mu     sync.Mutex // guards alerts and header
	alerts []Alert
	header []http.Header
}

func newAlertSink(t *testing.T) *alertSink {
	s := &alertSink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var a Alert
		if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
			t.Errorf("alert body: %v", err)
		}
		s.mu.Lock()
		s.alerts = append(s.alerts, a)
		s.header = append(s.header, r.Header.Clone())
		s.mu.Unlock()
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// of returns the alerts received for a task, in order of arrival.
func (s *alertSink) of(id string) (out []Alert, hs []http.Header) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, a := range s.alerts {
		if a.TaskID == id {
			out = append(out, a)
			hs = append(hs, s.header[i])
		}
	}
	return out, hs
}

// TestEngine_NotifyOnChangeOfState fails two tasks on fire after fire, each
// retried once, then lets one recover. The sink must see, per task, one
// failure alert after the last attempt (not one per fire nor per attempt)
// and one recovery alert: the task without a notify block through the
// node's --notify-url, the other at its own url with its headers. A task
// with pause_on_failure 2 is paused in the registry after its second
// failed fire.
func TestEngine_NotifyOnChangeOfState(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	sink := newAlertSink(t)
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 500e6, time.UTC)
	at := func(s int) time.Time { return time.Date(2026, 1, 1, 12, 0, s, 0, time.UTC) }
	clock := newTestClock(t0, 0)
	var failing atomic.Bool
	failing.Store(true)
	h := func(_ context.Context, f Fire) error {
		if f.TaskID == "pause/1" || failing.Load() {
			return errors.New("boom " + f.TaskID)
		}
		return nil
	}
	n := startNode(t, c, "", h, clockTweak(clock, time.Hour, func(cfg *Config) { cfg.NotifyURL = sink.srv.URL + "/default" }))
	reg := n.e.Registry()
	retried := func(tk *task.Task) *task.Task {
		tk.Retry = task.Retry{MaxAttempts: 2, Backoff: task.Duration(time.Second)}
		return tk
	}
	putTask(t, reg, retried(handlerTask("plain/1", "@every 10s")))
	own := retried(handlerTask("own/1", "@every 10s"))
	own.Notify = &task.Notify{URL: sink.srv.URL + "/own", Headers: map[string]string{"X-Token": "tok-SECRET"}}
	putTask(t, reg, own)
	pause := handlerTask("pause/1", "@every 10s")
	pause.PauseOnFailure = 2
	pause.Notify = &task.Notify{On: []task.NotifyEvent{task.NotifyRecovery}} // no failure alert
	putTask(t, reg, pause)
	for _, id := range []string{"plain/1", "own/1", "pause/1"} {
		waitNext(t, n, id, at(10))
	}
	// fire moves the clock step on to release the next fires and, while
	// they fail, one second more for their retries, waiting each time until
	// the loop applied the outcome (State.Failures counts attempts).
	attempts := uint64(0)
	fire := func(step time.Duration, streak uint64) {
		t.Helper()
		states := func(ok func(s *task.State) bool) {
			t.Helper()
			etcdtest.WaitFor(t, 10*time.Second, func() bool {
				return ok(taskState(t, n, "plain/1")) && ok(taskState(t, n, "own/1"))
			})
		}
		clock.Advance(step)
		if streak == 0 {
			states(func(s *task.State) bool { return s.ConsecutiveFailures == 0 })
			return
		}
		attempts++
		states(func(s *task.State) bool { return s.Failures == attempts })
		if b := n.e.Stats().RetryBacklog; b != 2 {
			t.Errorf("retry backlog %d, want 2 (one retry of each task waits)", b)
		}
		clock.Advance(time.Second)
		attempts++
		states(func(s *task.State) bool { return s.Failures == attempts && s.ConsecutiveFailures == streak })
	}
	// pausedHere waits until the loop applied pause/1's pause, which
	// reaches it through the registry's watch well after the failure that
	// asked for it: a clock moved on before would fire it once more, and a
	// resume written before would be taken for a task never paused.
	pausedHere := func() {
		t.Helper()
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			tk, err := reg.Get(context.Background(), "pause/1")
			return err == nil && tk.Paused && taskState(t, n, "pause/1").NextFireAt.IsZero()
		})
	}
	fire(10*time.Second, 1) // 12:00:10.5, then the retries by :11.5
	fire(9*time.Second, 2)  // :20.5
	pausedHere()
	fire(9*time.Second, 3) // :30.5
	// Its pause record says who paused it (issue 12).
	if tk, err := reg.Get(context.Background(), "pause/1"); err != nil || tk.Pause == nil || tk.Pause.By != PausedByPolicy {
		t.Errorf("pause/1's pause record %+v (err %v), want one by %s", tk.Pause, err, PausedByPolicy)
	}
	// Resumed while still failing, it is paused again after 2 more
	// failures (its streak goes on: 4).
	if _, err := reg.SetPaused(context.Background(), "pause/1", false); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return taskState(t, n, "pause/1").NextFireAt.Equal(at(40)) })
	failing.Store(false)
	fire(9*time.Second, 0) // :40.5
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return taskState(t, n, "pause/1").Failures == 3 })
	if tk, err := reg.Get(context.Background(), "pause/1"); err != nil || tk.Paused {
		t.Fatalf("pause/1 paused again after one failure since its resume (err %v)", err)
	}
	clock.Advance(10 * time.Second) // :50.5
	pausedHere()
	if b := n.e.Stats().RetryBacklog; b != 0 {
		t.Errorf("retry backlog %d after the retries ran, want 0", b)
	}

	for _, id := range []string{"plain/1", "own/1"} {
		etcdtest.WaitFor(t, 10*time.Second, func() bool { a, _ := sink.of(id); return len(a) >= 2 })
		got, hs := sink.of(id)
		if len(got) != 2 {
			t.Fatalf("%s: %d alerts, want 2 (failure, recovery): %+v", id, len(got), got)
		}
		f, r := got[0], got[1]
		wantKey := id + "@" + "1767268810000" // 12:00:10
		if f.Event != task.NotifyFailure || f.Status != "failed" || f.Attempt != 2 || f.IdempotencyKey != wantKey ||
			f.Error != "boom "+id || f.ConsecutiveFailures != 1 || f.Node != "node-1" || !f.ScheduledAt.Equal(at(10)) {
			t.Errorf("%s: failure alert %+v", id, f)
		}
		if r.Event != task.NotifyRecovery || r.Status != "ok" || r.Attempt != 1 || r.Error != "" || !r.ScheduledAt.Equal(at(40)) {
			t.Errorf("%s: recovery alert %+v", id, r)
		}
		if k := hs[0].Get("Idempotency-Key"); k != wantKey+"/failure" {
			t.Errorf("%s: Idempotency-Key %q", id, k)
		}
		if id == "own/1" && hs[0].Get("X-Token") != "tok-SECRET" {
			t.Errorf("own/1: headers %v, want its X-Token", hs[0])
		}
		if id == "plain/1" && hs[0].Get("X-Token") != "" {
			t.Errorf("plain/1 carries another task's header")
		}
	}
	if got, _ := sink.of("pause/1"); len(got) != 0 {
		t.Errorf("pause/1 alerts on recovery only, and did not recover: %+v", got)
	}
	// The notifier counts a pause once its write returned, which may be
	// after the registry already shows it, and an alert once its answer
	// came back, after the sink recorded it.
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		st := n.e.Stats()
		return st.PausedOnFailure >= 2 && st.Notify["sent"] >= 4
	})
	st := n.e.Stats()
	if st.Notify["sent"] != 4 || st.Notify["failed"] != 0 || st.Notify["dropped"] != 0 || st.PausedOnFailure != 2 {
		t.Errorf("stats: notify %v, paused on failure %d; want 4 sent, 2 pauses", st.Notify, st.PausedOnFailure)
	}
}

// TestNotifier_FullQueueDropsAndCounts: the loop never waits for the
// notifier; what the queue cannot take is dropped and counted.
func TestNotifier_FullQueueDropsAndCounts(t *testing.T) {
	n := newNotifier(http.DefaultClient, "ua", 2, quietLogger())
	for range 5 {
		n.enqueue(notice{taskID: "t", alert: Alert{Event: task.NotifyFailure}})
	}
	if got := n.results[notifyDropped].Load(); got != 3 {
		t.Fatalf("dropped %d alerts, want 3 (queue of 2, 5 alerts)", got)
	}
	if len(n.q) != 2 {
		t.Fatalf("queued %d, want 2", len(n.q))
	}
}

// TestNotifier_RetriesThenCounts: an alert answered 5xx is retried up to
// its attempts and counted failed; one whose host the node's --http-allow
// leaves out is refused without an attempt reaching anything.
func TestNotifier_RetriesThenCounts(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	allow, err := executor.ParseHostAllow([]string{"127.0.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		allow  *executor.HostAllow
		result int
		hits   int32
	}{
		{"failing", nil, notifyFailed, 3},
		{"refused", allow, notifyRefused, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hits.Store(0)
			client, err := executor.NewClient(executor.ClientConfig{Allow: tc.allow})
			if err != nil {
				t.Fatal(err)
			}
			defer client.CloseIdleConnections()
			n := newNotifier(client, "ua", 4, quietLogger())
			n.backoff = time.Millisecond
			n.start(nil)
			to, err := newNotifyTarget(&task.Notify{On: []task.NotifyEvent{task.NotifyFailure}, URL: srv.URL}, "")
			if err != nil {
				t.Fatal(err)
			}
			n.enqueue(notice{taskID: "t", to: to, alert: Alert{Event: task.NotifyFailure, TaskID: "t"}})
			n.stop(5 * time.Second)
			if got := n.results[tc.result].Load(); got != 1 {
				t.Errorf("result %s counted %d times, want 1", notifyResultNames[tc.result], got)
			}
			if got := hits.Load(); got != tc.hits {
				t.Errorf("the receiver got %d requests, want %d", got, tc.hits)
			}
		})
	}
}

// TestRecord_Size: alerts and capture live in the profile, so that a
// task's record stays 80 bytes (BENCHMARKS.md, the fleet's memory budget).
func TestRecord_Size(t *testing.T) {
	if got := unsafe.Sizeof(record{}); got != 80 {
		t.Fatalf("record is %d bytes, want 80", got)
	}
}

// TestEngine_CacheWriteErrorsCounted: a task change the Badger cache
// refuses (here: the store is closed under the node) is counted, besides
// dropping the partition's cache.
func TestEngine_CacheWriteErrorsCounted(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	n := startNode(t, c, "", func(context.Context, Fire) error { return nil }, nil)
	reg := n.e.Registry()
	putTask(t, reg, handlerTask("cache/1", "@hourly"))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(n, "cache/1") })
	if got := n.e.Stats().CacheWriteErrors; got != 0 {
		t.Fatalf("%d cache write errors before any fault", got)
	}
	if err := n.store.Close(); err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, handlerTask("cache/1", "@daily")) // the watch's change cannot be cached
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return n.e.Stats().CacheWriteErrors >= 1 })
}

// A task's failure streak is its owner's, in memory: a graceful hand-over
// passes it on with the partition's checkpoint, so the next owner does not
// repeat the failure alert; a crash loses it, and a task still failing
// alerts once more on the next owner (docs/api.md, "Alerts"). A node that
// fenced and takes its partition back, nobody having owned it since, keeps
// it from the hand-over its fenced session kept: it forgot it, and alerted
// again.
func TestEngine_FailureStreakAfterACrashOrAFence(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"graceful", "crash", "fenced"} {
		t.Run(how, func(t *testing.T) {
			c, clock := limitsStart(t)
			sink := newAlertSink(t)
			h := func(_ context.Context, f Fire) error {
				if f.TaskID == "sick" {
					return errors.New("still sick")
				}
				return nil
			}
			node := func(id string) func(*Config) {
				return limitsNode(clock, time.Hour, id, func(cfg *Config) { cfg.NotifyURL = sink.srv.URL })
			}
			proxy := c.NewProxy(t)
			a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", h, node("node-a"))
			putTask(t, a.e.Registry(), handlerTask("sick", "* * * * * *"))
			waitNext(t, a, "sick", limitsAt(1))
			clock.Advance(time.Second) // 12:00:01 fails on node-a: its failure alert
			etcdtest.WaitFor(t, 10*time.Second, func() bool { got, _ := sink.of("sick"); return len(got) == 1 })

			var b *testNode
			switch how {
			case "graceful":
				b = startNodeOn(t, c.NewClient(t), "", h, node("node-b"), noWait)
				a.stop(t)
			case "crash":
				waitNamed(t, c, a, partOf("sick"))
				crash(t, a, proxy)
				b = startNodeOn(t, c.NewClient(t), "", h, node("node-b"), noWait)
			case "fenced":
				waitNamed(t, c, a, partOf("sick"))
				sess := a.e.sess.Load()
				crash(t, a, proxy)
				proxy.Restore()
				etcdtest.WaitFor(t, 20*time.Second, func() bool { return a.e.sess.Load() != sess && a.e.Ready() })
				b = a
			}
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, "sick") })
			if st := taskState(t, b, "sick"); how != "crash" && (st.ConsecutiveFailures != 1 || st.LastError != "still sick") {
				t.Errorf("taken over with a streak of %d, last error %q, want node-a's 1, %q", st.ConsecutiveFailures, st.LastError, "still sick")
			}
			clock.Advance(2 * time.Second) // 12:00:02 and :03 fail on node-b
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return taskState(t, b, "sick").Failures >= 2 })
			st := taskState(t, b, "sick")
			b.stop(t) // sends what is queued
			a.stop(t)

			got, _ := sink.of("sick")
			var nodes []string
			for _, al := range got {
				nodes = append(nodes, al.Node+":"+string(al.Event))
			}
			want := map[string][]string{
				"graceful": {"node-a:failure"},
				"crash":    {"node-a:failure", "node-b:failure"},
				"fenced":   {"node-a:failure"},
			}[how]
			if !slices.Equal(nodes, want) {
				t.Errorf("alerts %v, want %v", nodes, want)
			}
			// The next owner counts its own failures (after a crash node-b
			// may repeat 12:00:01, past node-a's acknowledged watermark),
			// plus node-a's one when it was handed over or kept.
			if handed := map[string]uint64{"graceful": 1, "crash": 0, "fenced": 1}[how]; st.ConsecutiveFailures != st.Failures+handed {
				t.Errorf("the next owner's streak %d after %d failures of its own, want %d", st.ConsecutiveFailures, st.Failures, st.Failures+handed)
			}
		})
	}
}

// The owner's pause_on_failure pause leaves a task paused already as it
// is: the loop asks for it only for a task it holds unpaused, but the
// pause the owner asked for at one failure may land after the operator's
// own pause, or after its own earlier one (K = 1, fires ending close
// together). It replaced the pause record, the operator's note and name
// with the owner's, and wrote the task again.
func TestEngine_PauseOnFailureKeepsAPauseInPlace(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, "", nil, nil)
	reg := n.e.Registry()
	ctx := context.Background()
	tk := handlerTask("p", "0 0 0 1 1 *")
	tk.PauseOnFailure = 1
	putTask(t, reg, tk)
	before, err := reg.Pause(ctx, "p", task.Pause{By: "alice", Note: "the endpoint is down for maintenance"})
	if err != nil {
		t.Fatal(err)
	}
	n.e.notify.pause(notice{pause: true, taskID: "p", fails: 1}) // as a notifier's worker takes it
	got, err := reg.Get(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	kept := got.Pause != nil && got.Pause.By == before.Pause.By && got.Pause.Note == before.Pause.Note && got.Pause.At.Equal(before.Pause.At)
	if !got.Paused || !kept || got.Version != before.Version {
		t.Errorf("after pause_on_failure's pause: paused %v, record %+v, version %d; want alice's record %+v kept, version %d",
			got.Paused, got.Pause, got.Version, before.Pause, before.Version)
	}
	if k := n.e.notify.pauses.Load(); k != 0 {
		t.Errorf("%d tasks counted paused by pause_on_failure, want 0", k)
	}
}
