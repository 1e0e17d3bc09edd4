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

	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/etcdtest"
)

// The apart tasks of TestChaos_RollingRestartKeepsConcurrencyPolicies:
// apartForbid tasks with concurrency forbid and apartBufferOne with
// buffer_one, all firing every second, whose endpoint holds every request
// for apartHold, longer than a release waits for the runs under way (the
// engine's handOverWait, 2 s). A forbid task then runs one fire in four
// (held 3 s, the next second's fire comes while it runs), a buffer_one
// task always has one: about 240 requests held at a time, 120 on each of
// the two nodes left while one restarts, which take a worker each; the
// scenario's nodes have apartWorkers more than the harness's 4.
const (
	apartForbid    = 240
	apartBufferOne = 60
	apartHold      = 3 * time.Second
	apartWorkers   = 200
	// apartSlack is how far a request may start before the previous one of
	// its task ended, as the sink's clock has them: the sink notes the
	// end before it answers, and the node starts the next fire after the
	// answer, so any overlap at all is a run beside a run.
	apartSlack = 50 * time.Millisecond
	// apartAfter is how many requests each apart task must have started
	// once the rolling restart is over.
	apartAfter = 2
	// apartPhases is how many groups the apart tasks are put in, a second
	// apart.
	apartPhases = 4
)

// markerWatch counts the markers nodes wrote for runs that went on past
// their partition's release (engine/elsewhere.go,
// /<prefix>/running/<partition>/<lease...>/<task-id>), by task, as a
// watch of the prefix saw them put.
type markerWatch struct {
	mu   sync.Mutex
	put  map[string]int
	err  error // the watch's, if it failed
	keys int   // distinct marker keys put
}

// watchMarkers watches the marker keys put from now on until the test
// ends.
func (c *Cluster) watchMarkers() *markerWatch {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	prefix := engine.DefaultPrefix + "/running/"
	wch := c.Etcd.Client.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	mw := &markerWatch{put: map[string]int{}}
	c.follow(ctx, cancel, "the markers of runs elsewhere", wch, &mw.mu, &mw.err, func(ev *clientv3.Event) {
		if ev.Type != clientv3.EventTypePut || !ev.IsCreate() {
			return
		}
		// <partition>/<lease...>/<task-id>; a task id may hold slashes.
		parts := strings.SplitN(strings.TrimPrefix(string(ev.Kv.Key), prefix), "/", 3)
		if len(parts) == 3 {
			mw.put[parts[2]]++
		}
		mw.keys++
	})
	return mw
}

// counts returns how many markers were put and for how many tasks.
func (mw *markerWatch) counts() (keys, tasks int, err error) {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	return mw.keys, len(mw.put), mw.err
}

// apartCall is a request of an apart task, as the sink saw it.
type apartCall struct {
	Call
	key FireKey
}

// apartCalls returns each of ids's requests, by task, in the order they
// arrived.
func apartCalls(s *Sink, ids []string) map[string][]apartCall {
	calls, _ := s.Snapshot()
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	out := make(map[string][]apartCall, len(ids))
	for k, cs := range calls {
		if !want[k.Task] {
			continue
		}
		for _, cl := range cs {
			out[k.Task] = append(out[k.Task], apartCall{cl, k})
		}
	}
	for _, cs := range out {
		slices.SortFunc(cs, func(a, b apartCall) int { return a.Arrived.Compare(b.Arrived) })
	}
	return out
}

// overlap is a request that started while an earlier one of its task
// was still held at the sink.
type overlap struct {
	task        string
	prev, next  apartCall
	by          time.Duration // how long the two ran side by side
	prevRunning bool          // prev was still held when the check looked
}

// checkApart checks that no two requests of an apart task were held at
// the sink at once (beyond apartSlack), and that each task started
// apartAfter requests after since. It reports what it found as a step
// and fails the test on an overlap or a task that stopped firing.
func (c *Cluster) checkApart(s *Sink, ids []string, policy map[string]string, since time.Time, mw *markerWatch) {
	c.t.Helper()
	now := time.Now()
	byTask := apartCalls(s, ids)
	var over []overlap
	total, handed := 0, 0
	overBy := map[string]int{} // overlaps by policy
	pairs := map[string]int{}  // overlaps by node pair, "n1>n2": prev's node, next's
	var stalled []string       // tasks with fewer than apartAfter requests since
	for _, id := range ids {
		cs := byTask[id]
		total += len(cs)
		after := 0
		var last apartCall // the earlier request that ends the latest
		for i, cl := range cs {
			if !cl.Arrived.Before(since) {
				after++
			}
			if i > 0 {
				if cl.Node != cs[i-1].Node {
					handed++
				}
				end, running := last.Ended, last.Ended.IsZero()
				if running {
					end = now
				}
				if cl.Arrived.Before(end.Add(-apartSlack)) {
					over = append(over, overlap{task: id, prev: last, next: cl, by: end.Sub(cl.Arrived), prevRunning: running})
					overBy[policy[id]]++
					pairs[last.Node+">"+cl.Node]++
				}
			}
			if i == 0 || cl.Ended.IsZero() || (!last.Ended.IsZero() && cl.Ended.After(last.Ended)) {
				last = cl
			}
		}
		if after < apartAfter {
			stalled = append(stalled, fmt.Sprintf("%s (%s): %d", id, policy[id], after))
		}
	}
	keys, tasks, werr := mw.counts()
	watch := ""
	if werr != nil {
		watch = fmt.Sprintf(" (the watch of the markers failed: %v)", werr)
	}
	var pairList []string
	for _, p := range slices.Sorted(maps.Keys(pairs)) {
		pairList = append(pairList, fmt.Sprintf("%s:%d", p, pairs[p]))
	}
	c.Step("apart tasks: %d requests of %d tasks, %d of them from another node than the one before; "+
		"%d overlaps (forbid %d, buffer_one %d; by node, earlier>later: %s); %d tasks with fewer than %d requests since %s; "+
		"%d markers of runs past their release put, for %d tasks%s",
		total, len(ids), handed, len(over), overBy["forbid"], overBy["buffer_one"], strings.Join(pairList, " "),
		len(stalled), apartAfter, c.rel(since), keys, tasks, watch)
	var b strings.Builder
	if len(over) > 0 {
		slices.SortFunc(over, func(a, b overlap) int { return a.next.Arrived.Compare(b.next.Arrived) })
		fmt.Fprintf(&b, "%d requests started while an earlier one of their task was still held (more than %v); the first:\n", len(over), apartSlack)
		for i, o := range over {
			if i == maxListed {
				fmt.Fprintf(&b, "  ... and %d more\n", len(over)-maxListed)
				break
			}
			end := "still held"
			if !o.prevRunning {
				end = "ended " + c.rel(o.prev.Ended)
			}
			fmt.Fprintf(&b, "  %s (%s): %s from %s (fence %d) arrived %s, %s; %s from %s (fence %d) arrived %s, %v before that end\n",
				o.task, policy[o.task], o.prev.key, o.prev.Node, o.prev.Fence, c.rel(o.prev.Arrived), end,
				o.next.key, o.next.Node, o.next.Fence, c.rel(o.next.Arrived), o.by.Round(time.Millisecond))
		}
	}
	if len(stalled) > 0 {
		fmt.Fprintf(&b, "%d tasks started fewer than %d requests after the rolling restart (%s), e.g. %s\n",
			len(stalled), apartAfter, c.rel(since), strings.Join(stalled[:min(len(stalled), maxListed)], ", "))
	}
	if handed == 0 {
		b.WriteString("no apart task's request came from another node than the one before: no task changed hands, the scenario proves nothing\n")
	}
	if keys == 0 {
		fmt.Fprintf(&b, "no marker of a run past its release was put: no request held %v still ran when its partition's release was sealed, "+
			"or the nodes write no markers (before d70be7b)\n", apartHold)
	}
	if b.Len() > 0 {
		c.fail("concurrency policies across the rolling restart failed:\n%s", b.String())
	}
}

// TestChaos_RollingRestartKeepsConcurrencyPolicies restarts every node in
// turn (SIGTERM, then start again), as TestChaos_RollingRestart does,
// under 200 every-second tasks and 300 apart tasks, every second too:
// 240 with concurrency forbid and 60 with buffer_one, whose endpoint holds
// every request for 3 s, put in four groups a second apart. A release
// waits 2 s for the runs under way of its partitions' tasks that keep
// their fires apart; a request held 3 s that began less than a second
// before the release was sealed still runs when its next owner arms the
// task. Over the whole run no two requests of an apart task were held at
// the sink at once (but for 50 ms), the every-second tasks neither repeat
// nor miss a fire, and every apart task started two requests or more once
// the restarts were over: the runs past a release did not stop their
// tasks.
//
// Before d70be7b, which has the releasing node write a marker in etcd for
// each such run, which the next owner counts as a run in flight, the next
// owner started the task's next fire beside it: 100 and 78 overlaps in two
// runs of the scenario with the engine of d70be7b~1 (about two thirds of
// them forbid, the rest buffer_one; each between two nodes), and 0 in four
// with d70be7b's, where 76 to 98 markers were put. A watch of the marker keys must
// see some put, or no run outlived its release and the scenario proves
// nothing.
func TestChaos_RollingRestartKeepsConcurrencyPolicies(t *testing.T) {
	t.Parallel()
	held := NewSink(t, apartHold)
	// Few every-second tasks: they are not what this checks, and the
	// nodes' CPU goes to the apart tasks' requests.
	c := start(t, Options{Tasks: 200, Workers: 4 + apartWorkers})
	markers := c.watchMarkers()
	var ids []string
	policy := map[string]string{}
	var tasks []map[string]any
	for i := range apartForbid + apartBufferOne {
		id, p := fmt.Sprintf("apart/forbid/%03d", i), "forbid"
		if i >= apartForbid {
			id, p = fmt.Sprintf("apart/buffer_one/%03d", i-apartForbid), "buffer_one"
		}
		ids = append(ids, id)
		policy[id] = p
		tasks = append(tasks, map[string]any{
			"id": id, "schedule": "* * * * * *", "timeout": "30s", "concurrency": p,
			"executor": map[string]any{"type": "http", "url": held.URL + "/apart"},
		})
	}
	// Put a quarter each second, so that their runs, one second in four
	// (forbid) or back to back (buffer_one), do not all start in the same
	// second: each release then finds some begun less than a second
	// before it.
	for g := range apartPhases {
		if g > 0 {
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		}
		var group []map[string]any
		for i := g; i < len(tasks); i += apartPhases {
			group = append(group, tasks[i])
		}
		c.PutTasks(group)
	}
	etcdtest.WaitFor(t, time.Minute, func() bool {
		byTask := apartCalls(held, ids)
		for _, id := range ids {
			if len(byTask[id]) == 0 {
				return false
			}
		}
		return true
	})
	c.Step("put %d forbid and %d buffer_one tasks firing every second, in %d groups a second apart, each request held %v: every one has fired",
		apartForbid, apartBufferOne, apartPhases, apartHold)
	c.Check(hold)
	rollingRestart(t, c)
	since := time.Now()
	c.Step("rolling restart over: the apart tasks must fire on")
	// A forbid task fires one second in four, a buffer_one one in three.
	deadline := since.Add(20 * time.Second)
	for time.Now().Before(deadline) {
		byTask, done := apartCalls(held, ids), true
		for _, id := range ids {
			n := 0
			for _, cl := range byTask[id] {
				if !cl.Arrived.Before(since) {
					n++
				}
			}
			done = done && n >= apartAfter
		}
		if done {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.Finish()
	c.checkApart(held, ids, policy, since, markers)
}
