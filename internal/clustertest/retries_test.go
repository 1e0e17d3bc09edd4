package clustertest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/registry"
)

// newFlakySink is a sink that fails the first attempt of every fire
// (500), after holding it for hold, and accepts the others at once.
func newFlakySink(t *testing.T, hold time.Duration) *Sink {
	s := NewSink(t, 0)
	s.failFirst, s.holdFirst = true, hold
	return s
}

// attempts returns the calls of cs that are attempt a.
func attempts(cs []Call, a string) []Call {
	var out []Call
	for _, c := range cs {
		if c.Attempt == a {
			out = append(out, c)
		}
	}
	return out
}

// flakySet is a set of flaky tasks (max_attempts 2, backoff and
// max_backoff backoff) whose endpoint, sink, fails every attempt 1, after
// holding it for sink.holdFirst.
type flakySet struct {
	name    string // as the steps and failures call them
	sink    *Sink
	ids     []string
	backoff time.Duration
	// fires reports whether task id fires in the scheduled second sec; nil:
	// every second.
	fires func(id string, sec int64) bool
	// etcd, when not nil, saw the retries nodes handed on through etcd:
	// then some fires must have had their retry so handed on and run on
	// another node than their attempt 1.
	etcd *retryTriggers
}

// retryTriggers are the fires whose retry a node handed on through etcd,
// as a trigger that carries its attempt (registry.TriggerRetry), as a
// watch of the trigger keys saw them put: the retries of attempts still
// running when their partition's graceful release was sealed.
type retryTriggers struct {
	mu   sync.Mutex
	seen map[FireKey]bool
	err  error // the watch's, if it failed
}

// watchRetryTriggers watches every trigger key put from now on until the
// test ends.
func (c *Cluster) watchRetryTriggers() *retryTriggers {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	reg, err := registry.OpenRegistry(ctx, c.Etcd.Client, "", c.opt.Partitions)
	if err != nil {
		cancel()
		c.t.Fatalf("clustertest: open the registry to watch triggers: %v", err)
	}
	rt := &retryTriggers{seen: map[FireKey]bool{}}
	c.follow(ctx, cancel, "triggers", reg.WatchTriggers(ctx, 0), &rt.mu, &rt.err, func(ev *clientv3.Event) {
		_, _, id, ok := reg.ParseTrigger(string(ev.Kv.Key))
		if _, retry := registry.DecodeTriggerValue(ev.Kv.Value); ok && retry != nil {
			rt.seen[FireKey{id, retry.At.UnixMilli()}] = true // the key's own time is later
		}
	})
	return rt
}

// follow reads wch, a watch opened with ctx, until the test ends (then it
// cancels it): apply is given each event under mu, and *werr the watch's
// error, if it fails. Its first response must say it was created.
func (c *Cluster) follow(ctx context.Context, cancel context.CancelFunc, what string, wch clientv3.WatchChan,
	mu *sync.Mutex, werr *error, apply func(ev *clientv3.Event)) {
	c.t.Helper()
	if wr, ok := <-wch; !ok || wr.Err() != nil || !wr.Created {
		cancel()
		c.t.Fatalf("clustertest: watch %s: %v", what, wr.Err())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wr := range wch {
			mu.Lock()
			if err := wr.Err(); err != nil && ctx.Err() == nil {
				*werr = err
			}
			for _, ev := range wr.Events {
				apply(ev)
			}
			mu.Unlock()
		}
	}()
	c.t.Cleanup(func() { cancel(); <-done })
}

// has reports whether k's retry was handed on through etcd.
func (rt *retryTriggers) has(k FireKey) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.seen[k]
}

// retryCheck is what checkRetries found over the fires of a flaky set in a
// window.
type retryCheck struct {
	first        *Result   // attempts 1: each fire once, none missed
	decided      int       // fires with an attempt 1 whose retry was due while observed, or came
	excluded     int       // fires with an attempt 1 whose retry may be due after the observation
	lost         []FireKey // an attempt 1 and no attempt 2
	twice        []FireKey // attempt 2 more than once
	early        []FireKey // attempt 2 before attempt 1, or sooner than hold and half the backoff after it
	extra        []FireKey // calls other than attempts 1 and 2
	handed       int       // attempt 2 from another node than attempt 1
	viaEtcd      int       // retries handed on through etcd (when watched)
	viaEtcdMoved int       // of viaEtcd, those whose attempt 2 ran on another node than attempt 1
	needEtcd     bool      // viaEtcd must not be 0
	minGap       time.Duration
	maxGap       time.Duration  // the longest from an attempt 1 to its attempt 2
	byNode       map[string]int // attempts 2 by node
	lostByNode   map[string]int // lost retries by the node of their attempt 1
	lostBySecond map[int64]int  // lost retries by the second their attempt 1 arrived
}

func (r *retryCheck) ok() bool {
	return r.first.OK() && len(r.lost)+len(r.twice)+len(r.early)+len(r.extra) == 0 && r.handed > 0 &&
		(!r.needEtcd || r.viaEtcd > 0)
}

// each calls f for every fire of fs scheduled in the seconds [from, to].
func (fs *flakySet) each(from, to int64, f func(k FireKey)) {
	for _, id := range fs.ids {
		for sec := from; sec <= to; sec++ {
			if fs.fires == nil || fs.fires(id, sec) {
				f(FireKey{id, sec * 1000})
			}
		}
	}
}

// checkRetries checks the fires of the flaky set fs scheduled in the
// seconds [from, to]: each fire's attempt 1 arrived once, and each fire
// whose attempt 1 arrived has exactly one attempt 2, none before attempt 1
// nor sooner than half the backoff after it ended (the jitter is between
// half and all of it), that is the hold and half the backoff after it
// arrived. It first waits until every fire of the window has both
// attempts, or until none can still be expected: as Cluster.settle, while attempts keep
// coming it waits on, up to MaxSettle after the window was due, and it
// stops once none came for Settle past the latest retry's due time. A
// fire whose retry, due at most the hold and the backoff after its attempt
// 1 arrived, was not due Settle before the observation ended is left out
// (counted as excluded): its attempt 2 may come after the test stops
// looking.
func (c *Cluster) checkRetries(fs *flakySet, from, to int64) *retryCheck {
	c.t.Helper()
	hold, backoff := fs.sink.holdFirst, fs.backoff
	due := time.Unix(to+1, 0)
	last, since := -1, time.Now()
	for {
		calls, _ := fs.sink.Snapshot()
		incomplete, got := 0, 0
		latest := due
		fs.each(from, to, func(k FireKey) {
			cs := calls[k]
			a1 := attempts(cs, "1")
			if len(a1) == 0 {
				incomplete++
				return
			}
			got++
			if a1[0].Arrived.After(latest) {
				latest = a1[0].Arrived
			}
			if len(attempts(cs, "2")) > 0 {
				got++
				return
			}
			incomplete++
		})
		now := time.Now()
		if got != last {
			last, since = got, now
		}
		// As Cluster.settle: a late attempt is not a lost one, and the
		// wait goes on while they come, until none came for Settle past
		// the latest retry's due time.
		if incomplete == 0 || (now.Sub(since) > c.opt.Settle && now.After(latest.Add(hold+backoff+c.opt.Settle))) || now.Sub(due) > c.opt.MaxSettle {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if d := time.Since(due); d > hold+backoff+c.opt.Settle {
		c.Step("attempts of the %s fires of %s..%s still arrived %v after they were due: a node is behind (backlog)",
			fs.name, c.sched(from), c.sched(to), d.Round(time.Second))
	}
	time.Sleep(200 * time.Millisecond) // a second attempt 2 would come after the first
	observed := time.Now()
	calls, bad := fs.sink.Snapshot()
	if len(bad) > 0 {
		c.fail("the %s endpoint received %d requests without a valid Idempotency-Key, e.g. %q", fs.name, len(bad), bad[0])
	}
	firsts := make(map[FireKey][]Call, len(calls))
	for k, cs := range calls {
		if a1 := attempts(cs, "1"); len(a1) > 0 {
			firsts[k] = a1
		}
	}
	r := &retryCheck{
		first:    Verify(firsts, Window{Tasks: fs.ids, From: from, To: to, Lead: c.opt.Lead, Fires: fs.fires}),
		needEtcd: fs.etcd != nil,
		minGap:   -1, byNode: map[string]int{}, lostByNode: map[string]int{}, lostBySecond: map[int64]int{},
	}
	fs.each(from, to, func(k FireKey) {
		cs := calls[k]
		a1, a2 := attempts(cs, "1"), attempts(cs, "2")
		if len(a1) == 0 {
			return // Verify reports it missed
		}
		if len(a1)+len(a2) != len(cs) {
			r.extra = append(r.extra, k)
		}
		if len(a2) == 0 && a1[0].Arrived.Add(hold+backoff+c.opt.Settle).After(observed) {
			r.excluded++
			return
		}
		r.decided++
		viaEtcd := fs.etcd != nil && fs.etcd.has(k)
		if viaEtcd {
			r.viaEtcd++
		}
		switch len(a2) {
		case 0:
			r.lost = append(r.lost, k)
			r.lostByNode[a1[0].Node]++
			r.lostBySecond[a1[0].Arrived.Unix()]++
			return
		case 1:
		default:
			r.twice = append(r.twice, k)
		}
		for _, cl := range a2 {
			r.byNode[cl.Node]++
		}
		gap := a2[0].Arrived.Sub(a1[0].Arrived)
		if gap < hold+backoff/2 {
			r.early = append(r.early, k)
		}
		if r.minGap < 0 || gap < r.minGap {
			r.minGap = gap
		}
		r.maxGap = max(r.maxGap, gap)
		if a2[0].Node != a1[0].Node {
			r.handed++
			if viaEtcd {
				r.viaEtcdMoved++
			}
		}
	})
	etcd := ""
	if fs.etcd != nil {
		etcd = fmt.Sprintf("; %d retries handed on through etcd (attempt 1 still running when its partition's release was sealed), %d of them ran attempt 2 on another node",
			r.viaEtcd, r.viaEtcdMoved)
		if fs.etcd.err != nil {
			etcd += fmt.Sprintf(" (the watch of the trigger keys failed: %v)", fs.etcd.err)
		}
	}
	c.Step("retries of the %s fires scheduled %s..%s: %d with attempt 1 decided (%d left out: retry due after the observation), "+
		"%d lost, "+
		"%d run twice, %d too early (gaps from attempt 1 to 2 between %v and %v; attempt 1 held %v, half the backoff %v), %d with other attempts, %d ran attempt 2 on another node; attempts 2 by node: %v%s",
		fs.name, c.sched(from), c.sched(to), r.decided, r.excluded, len(r.lost), len(r.twice), len(r.early), r.minGap.Round(time.Millisecond),
		r.maxGap.Round(time.Millisecond), hold, backoff/2, len(r.extra), r.handed, r.byNode, etcd)
	if r.ok() {
		return r
	}
	var b strings.Builder
	if !r.first.OK() {
		fmt.Fprintf(&b, "the %s tasks' attempts 1:\n%s", fs.name, r.first.Format(c.start))
	}
	list := func(title string, ks []FireKey) {
		if len(ks) == 0 {
			return
		}
		fmt.Fprintf(&b, "%d fires %s; the first:\n", len(ks), title)
		for i, k := range ks {
			if i == maxListed {
				fmt.Fprintf(&b, "  ... and %d more\n", len(ks)-maxListed)
				break
			}
			fmt.Fprintf(&b, "  %s:", k)
			for _, cl := range calls[k] {
				fmt.Fprintf(&b, " attempt %s from %s (fence %d) at %s;", cl.Attempt, cl.Node, cl.Fence, c.rel(cl.Arrived))
			}
			b.WriteString("\n")
		}
	}
	slices.SortFunc(r.lost, func(a, b FireKey) int {
		return calls[a][0].Arrived.Compare(calls[b][0].Arrived)
	})
	list("have an attempt 1 and no attempt 2 (lost retries)", r.lost)
	if len(r.lost) > 0 {
		b.WriteString("lost retries by the node of their attempt 1:")
		for _, n := range slices.Sorted(maps.Keys(r.lostByNode)) {
			fmt.Fprintf(&b, " %s:%d", n, r.lostByNode[n])
		}
		b.WriteString("\nlost retries by the second their attempt 1 arrived:")
		for _, s := range slices.Sorted(maps.Keys(r.lostBySecond)) {
			fmt.Fprintf(&b, " %s:%d", c.rel(time.Unix(s, 0)), r.lostBySecond[s])
		}
		b.WriteString("\n")
	}
	list("ran attempt 2 more than once", r.twice)
	list(fmt.Sprintf("ran attempt 2 before attempt 1 or less than the hold (%v) and half the backoff (%v) after it", hold, backoff/2), r.early)
	list("had attempts other than 1 and 2", r.extra)
	if r.handed == 0 {
		b.WriteString("no attempt 2 ran on another node than its attempt 1: no retry went through a hand-over, the scenario proves nothing\n")
	}
	if r.needEtcd && r.viaEtcd == 0 {
		fmt.Fprintf(&b, "no retry was handed on through etcd: no attempt 1 held %v still ran when its partition's release was sealed, "+
			"the scenario proves nothing for them\n", hold)
	}
	c.fail("retries of the %s tasks across the rolling restart failed:\n%s", fs.name, b.String())
	return r
}

// The flaky tasks of TestChaos_RollingRestartHandsRetriesOver.
const (
	flakyTasks   = 200
	flakyBackoff = 4 * time.Second
)

// Its held tasks: heldTasks flaky tasks, each firing every heldEvery
// seconds, at its own offset, so that heldTasks/heldEvery fire each second,
// whose endpoint holds attempt 1 for heldFor before it fails. A release
// waits 2 s (the engine's handOverWait) for the attempts under way of its
// partitions: an attempt 1 that began less than heldFor-2s before the
// release still runs when the release is sealed. Each held attempt takes a
// worker for heldFor, about 7 a node (10 on the two nodes left while
// one restarts): the scenario's nodes have heldWorkers more than the
// harness's 4, and 50 held tasks firing every second would take 200.
// Held 3 s, 3 or 4 retries a run went through etcd, and none in a run
// now and then would have said the scenario proves nothing.
const (
	heldTasks   = 50
	heldEvery   = 10
	heldFor     = 4 * time.Second
	heldWorkers = 8
)

// flakyTask is a task (docs/api.md) of a flaky set: max_attempts 2, backoff
// flakyBackoff, a timeout well beyond heldFor.
func flakyTask(id, schedule, url string) map[string]any {
	return map[string]any{
		"id": id, "schedule": schedule, "timeout": "30s", "concurrency": "allow",
		"retry":    map[string]any{"max_attempts": 2, "backoff": flakyBackoff.String(), "max_backoff": flakyBackoff.String()},
		"executor": map[string]any{"type": "http", "url": url},
	}
}

// TestChaos_RollingRestartHandsRetriesOver restarts every node in turn
// (SIGTERM, then start again) as TestChaos_RollingRestart does, under the
// every-second tasks and 200 flaky every-second tasks (max_attempts 2,
// backoff 4 s) whose endpoint fails attempt 1 and accepts attempt 2: at
// each graceful hand-over, both ways, the retries waiting for their
// backoff or queued go to the next owner in the released checkpoint. Over
// the whole run, every flaky fire whose attempt 1 arrived has exactly one
// attempt 2, no sooner than half the backoff after it, and the
// every-second tasks neither repeat nor miss a fire. Before 8b7cefe,
// which hands the waiting and queued retries over, about 1000 of the 2800
// fires checked lost their retry; before the release waited for attempts
// under way, 85 to 114 more; and until an attempt that ended after its
// release was sealed handed its retry on through etcd, the scenario
// allowed those to be lost.
//
// 50 held tasks, five firing each second (each every 10 s), are flaky
// tasks whose endpoint holds attempt 1 for 4 s before it fails: longer
// than a release waits for the attempts under way, so that those still
// running when their partition's release is sealed hand their retry on
// through etcd, as a trigger that carries its attempt (df00f96; before,
// it was lost). The same rules hold for them, attempt 2 no sooner than
// the hold and half the backoff after attempt 1 arrived, and some retries
// must have been handed on through etcd (as a watch of the trigger keys
// sees them). The nodes have 12 workers rather than 4: the held attempts
// take about 7 a node.
func TestChaos_RollingRestartHandsRetriesOver(t *testing.T) {
	t.Parallel()
	fl := newFlakySink(t, 0)
	held := newFlakySink(t, heldFor)
	// The short form's load whatever -chaos.tasks says: the flaky tasks
	// double their calls, and at 5000 more every node fell a minute behind
	// its schedule (the other scenarios carry the heavier bursts).
	c := start(t, Options{Tasks: 1200, Workers: 4 + heldWorkers})
	flaky := &flakySet{name: "flaky", sink: fl, backoff: flakyBackoff}
	var tasks []map[string]any
	for i := range flakyTasks {
		id := fmt.Sprintf("flaky/%03d", i)
		flaky.ids = append(flaky.ids, id)
		tasks = append(tasks, flakyTask(id, "* * * * * *", fl.URL+"/flaky"))
	}
	heldAt := map[string]int64{} // each held task's offset
	heldSet := &flakySet{name: "held", sink: held, backoff: flakyBackoff, etcd: c.watchRetryTriggers(),
		fires: func(id string, sec int64) bool { return sec%heldEvery == heldAt[id] }}
	for i := range heldTasks {
		id := fmt.Sprintf("held/%02d", i)
		heldSet.ids = append(heldSet.ids, id)
		heldAt[id] = int64(i % heldEvery)
		tasks = append(tasks, flakyTask(id, fmt.Sprintf("%d/%d * * * * *", heldAt[id], heldEvery), held.URL+"/held"))
	}
	c.PutTasks(tasks)
	var from int64
	etcdtest.WaitFor(t, time.Minute, func() bool {
		from = fl.LatestComplete(len(flaky.ids))
		return from > 0
	})
	from++
	c.Step("put %d flaky tasks (attempt 1 fails, retry after %v to %v) and %d held ones (the same, attempt 1 held %v, %d a second): "+
		"each flaky one fired at %s, their checks start with the next second",
		len(flaky.ids), flakyBackoff/2, flakyBackoff, len(heldSet.ids), heldFor, heldTasks/heldEvery, c.sched(from-1))
	c.Check(hold) // retries wait in every node's wheel
	rollingRestart(t, c)
	to := c.next - 1
	c.Finish()
	c.checkRetries(flaky, from, to)
	c.checkRetries(heldSet, from, to)
}
