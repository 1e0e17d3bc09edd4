package clustertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"

	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
)

// Options describe a cluster. Zero fields take the defaults noted.
type Options struct {
	// Binary is the shardcron binary (BuildBinary). Required.
	Binary string
	// Seed is printed with every failure, so a random run can be repeated.
	Seed int64
	// Nodes is how many nodes New starts (default 3); more can be added.
	Nodes int
	// Tasks is the number of every-second tasks (default 1200), all with
	// the http executor to the sink.
	Tasks int
	// EtcdMembers (default 1) and QuotaBackendBytes configure the etcd.
	EtcdMembers       int
	QuotaBackendBytes int64
	// Partitions (default 64), Workers (default 4) and Queue (default 32)
	// are the server flags. A queue much shorter than a node's fires per
	// second cuts every burst into batches of at most Queue fires.
	Partitions, Workers, Queue int
	// LeaseTTL is --lease-ttl (default 2s).
	LeaseTTL time.Duration
	// Misfire is --misfire-threshold (default 60s): raised so that fires
	// delayed by a fault are caught up one by one rather than folded.
	Misfire time.Duration
	// Lead is the engine's bounded lead (default 1s, not a flag): the
	// repeats a crash-like fault allows.
	Lead time.Duration
	// SinkDelay is how long the sink holds each request (default 3ms): with
	// 4 workers a node then needs most of a second for 400 fires.
	SinkDelay time.Duration
	// Settle is how long a check waits, once the last second of its window
	// was due, for the window's fires to arrive while none arrives (default
	// 20s): a node with a backlog (workers slower than the burst, a starved
	// CPU) delivers them late, and as long as they keep coming the check
	// waits, up to MaxSettle after the window was due (default 3m). Only a
	// window with fires still missing waits at all.
	Settle, MaxSettle time.Duration
	// Args are extra server flags for every node.
	Args []string
}

func (o *Options) defaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Nodes, 3)
	def(&o.Tasks, 1200)
	def(&o.EtcdMembers, 1)
	def(&o.Partitions, 64)
	def(&o.Workers, 4)
	def(&o.Queue, 32)
	defD(&o.LeaseTTL, 2*time.Second)
	defD(&o.Misfire, time.Minute)
	defD(&o.Lead, time.Second)
	defD(&o.SinkDelay, 3*time.Millisecond)
	defD(&o.Settle, 20*time.Second)
	defD(&o.MaxSettle, 3*time.Minute)
}

// Cluster is an etcd, a sink and shardcron node processes holding a set of
// every-second tasks, plus the record of what a test did to them. Its
// methods must be called from the test goroutine.
type Cluster struct {
	Etcd  *etcdtest.Cluster
	Sink  *Sink
	Nodes []*Node
	// Tasks are the ids of the every-second tasks.
	Tasks []string

	t      testing.TB
	opt    Options
	start  time.Time
	steps  []string
	faults []*Fault
	// first is the first scheduled second checked; next the first one not
	// checked yet.
	first, next int64
	failed      bool
	reported    map[FireKey]bool // offenses already reported by a check
	// folds are the folds (see Folds) accepted so far, by the fire that
	// closed them, and foldsBy their count by the node that counted them.
	folds   map[FireKey]bool
	foldsBy map[string]int
}

// New starts an etcd, a sink and o.Nodes nodes, puts o.Tasks every-second
// tasks, and waits until every task fires in one same second: checks start
// with the next one.
func New(t testing.TB, o Options) *Cluster {
	t.Helper()
	o.defaults()
	if o.Binary == "" {
		t.Fatal("clustertest: Options.Binary is required (BuildBinary in TestMain)")
	}
	c := &Cluster{t: t, opt: o, start: time.Now(), reported: make(map[FireKey]bool),
		folds: make(map[FireKey]bool), foldsBy: make(map[string]int)}
	t.Logf("clustertest: seed %d; %d nodes, %d every-second tasks, %d etcd member(s), --workers %d --queue %d --partitions %d --lease-ttl %v",
		o.Seed, o.Nodes, o.Tasks, o.EtcdMembers, o.Workers, o.Queue, o.Partitions, o.LeaseTTL)
	c.Etcd = etcdtest.StartCluster(t, etcdtest.Options{Members: o.EtcdMembers, QuotaBackendBytes: o.QuotaBackendBytes})
	c.Sink = NewSink(t, o.SinkDelay)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("clustertest: seed %d; steps:\n%s", c.opt.Seed, strings.Join(c.steps, "\n"))
		}
	})
	for i := 0; i < o.Nodes; i++ {
		n := c.AddNode()
		n.Start(t)
	}
	for _, n := range c.Nodes {
		n.WaitReady(t, time.Minute)
	}
	c.Step("started %d nodes", o.Nodes)
	c.putTasks()
	c.Step("put %d tasks", o.Tasks)
	var sec int64
	etcdtest.WaitFor(t, time.Minute, func() bool {
		sec = c.Sink.LatestComplete(o.Tasks)
		return sec > 0
	})
	c.first, c.next = sec+1, sec+1
	c.Step("every task fired at %s: checks start with the next second", c.sched(sec))
	return c
}

// AddNode prepares the next node (n1, n2, ...) without starting it.
func (c *Cluster) AddNode() *Node {
	var addrs []string
	for _, m := range c.Etcd.Members {
		addrs = append(addrs, m.Addr())
	}
	args := append([]string{
		"--partitions", strconv.Itoa(c.opt.Partitions),
		"--workers", strconv.Itoa(c.opt.Workers), "--queue", strconv.Itoa(c.opt.Queue),
		"--batch", strconv.Itoa(max(1, c.opt.Queue/4)),
		"--lease-ttl", c.opt.LeaseTTL.String(), "--misfire-threshold", c.opt.Misfire.String(),
		"--history", "none", "--drain-timeout", "10s",
	}, c.opt.Args...)
	n := newNode(c.t, c.opt.Binary, fmt.Sprintf("n%d", len(c.Nodes)+1), addrs, args)
	c.Nodes = append(c.Nodes, n)
	return n
}

// Node returns the node with the given id, or fails the test.
func (c *Cluster) Node(id string) *Node {
	for _, n := range c.Nodes {
		if n.ID == id {
			return n
		}
	}
	c.t.Fatalf("clustertest: no node %q", id)
	return nil
}

// Step records a step of the scenario with its time; failures print them.
func (c *Cluster) Step(format string, args ...any) {
	now := time.Now()
	s := fmt.Sprintf("  %s  %s", c.rel(now), fmt.Sprintf(format, args...))
	c.steps = append(c.steps, s)
	c.t.Log("clustertest: step" + s)
}

func (c *Cluster) rel(t time.Time) string {
	return fmt.Sprintf("T%+.3fs (%s)", t.Sub(c.start).Seconds(), t.Format("15:04:05.000"))
}

func (c *Cluster) sched(sec int64) string { return c.rel(time.Unix(sec, 0)) }

// Fault records that a crash-like fault of node began now; Recovered ends
// it. post is how long the node may still fire on its own session (see
// Fault.Post).
func (c *Cluster) Fault(node, kind string, post time.Duration) {
	f := &Fault{Node: node, Kind: kind, Post: post}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if resp, err := c.Etcd.Client.Get(ctx, "rev"); err == nil { // any key: the answer's header has the revision
		f.Rev = resp.Header.Revision
	}
	cancel()
	f.At = time.Now()
	c.faults = append(c.faults, f)
	c.Step("fault: %s %s", node, kind)
}

// Recovered records that node came back from its open faults (restarted,
// resumed, reconnected).
func (c *Cluster) Recovered(node string) {
	for _, f := range c.faults {
		if f.Node == node && f.Until.IsZero() {
			f.Until = time.Now()
		}
	}
}

// Faults returns a copy of the faults recorded so far.
func (c *Cluster) Faults() []Fault {
	out := make([]Fault, len(c.faults))
	for i, f := range c.faults {
		out[i] = *f
	}
	return out
}

// live returns the running, unpaused nodes.
func (c *Cluster) live() []*Node {
	var out []*Node
	for _, n := range c.Nodes {
		n.mu.Lock()
		paused := n.paused
		n.mu.Unlock()
		if n.Running() && !paused {
			out = append(out, n)
		}
	}
	return out
}

// putTasks writes the every-second tasks through a node's batch API.
func (c *Cluster) putTasks() {
	c.t.Helper()
	var tasks []map[string]any
	for i := 0; i < c.opt.Tasks; i++ {
		id := fmt.Sprintf("t%05d", i)
		c.Tasks = append(c.Tasks, id)
		tasks = append(tasks, map[string]any{
			"id": id, "schedule": "* * * * * *", "timeout": "30s",
			"executor": map[string]any{"type": "http", "url": c.Sink.URL + "/fire"},
		})
	}
	c.PutTasks(tasks)
}

// PutTasks writes tasks (task JSON objects, docs/api.md) through a live
// node's batch API, or fails the test.
func (c *Cluster) PutTasks(tasks []map[string]any) {
	c.t.Helper()
	api := c.live()[0].API()
	for len(tasks) > 0 {
		chunk := tasks[:min(len(tasks), 5000)]
		tasks = tasks[len(chunk):]
		body, _ := json.Marshal(chunk)
		resp, err := http.Post(api+"/v1/tasks:batch", "application/json", bytes.NewReader(body))
		if err != nil {
			c.t.Fatalf("clustertest: put tasks: %v", err)
		}
		var out struct {
			Written int               `json:"written"`
			Errors  []json.RawMessage `json:"errors"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || out.Written != len(chunk) {
			c.t.Fatalf("clustertest: put tasks: status %d, written %d of %d, errors %s, decode %v",
				resp.StatusCode, out.Written, len(chunk), out.Errors, err)
		}
	}
}

// partitions is GET /v1/partitions.
type partitions struct {
	Partitions []struct {
		Partition int    `json:"partition"`
		Owner     string `json:"owner"`
		State     string `json:"state"`
	} `json:"partitions"`
}

// Owned reports whether, as a live node sees it, every partition is owned by
// a node other than those of exclude; the string says what is not.
func (c *Cluster) Owned(exclude ...string) (bool, string) {
	live := c.live()
	if len(live) == 0 {
		return false, errNoLiveNode.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	code, body, err := getStatus(ctx, live[0].API()+"/v1/partitions")
	if err != nil || code != http.StatusOK {
		return false, fmt.Sprintf("GET %s/v1/partitions: %d %v", live[0].API(), code, err)
	}
	var ps partitions
	if err := json.Unmarshal(body, &ps); err != nil {
		return false, err.Error()
	}
	var bad []string
	for _, p := range ps.Partitions {
		excluded := false
		for _, x := range exclude {
			excluded = excluded || p.Owner == x
		}
		if p.State != "owned" || p.Owner == "" || excluded {
			bad = append(bad, fmt.Sprintf("%d:%s/%s", p.Partition, p.Owner, p.State))
		}
	}
	if len(bad) > 0 {
		return false, fmt.Sprintf("%d of %d partitions not owned (partition:owner/state): %s",
			len(bad), len(ps.Partitions), strings.Join(bad[:min(len(bad), 20)], " "))
	}
	return true, ""
}

// WaitOwned waits until every partition is owned by a live node other than
// those of exclude, and returns how long that took. It fails the test after
// timeout.
func (c *Cluster) WaitOwned(timeout time.Duration, exclude ...string) time.Duration {
	c.t.Helper()
	start := time.Now()
	var why string
	for {
		ok, w := c.Owned(exclude...)
		if ok {
			return time.Since(start)
		}
		why = w
		if time.Since(start) > timeout {
			c.Step("partitions not all owned within %v: %s", timeout, why)
			c.fail("not every partition has an owner within %v after %s: %s", timeout, c.rel(start), why)
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitReady waits until every live node is ready.
func (c *Cluster) WaitReady() {
	c.t.Helper()
	for _, n := range c.live() {
		n.WaitReady(c.t, time.Minute)
	}
}

// fail reports a failed check with the seed, steps and node logs, and lets
// the scenario go on so later steps are checked too.
func (c *Cluster) fail(format string, args ...any) {
	c.t.Helper()
	c.failed = true
	var b strings.Builder
	fmt.Fprintf(&b, "clustertest: %s\nseed: %d (the steps so far are logged above, all of them at the end)\n",
		fmt.Sprintf(format, args...), c.opt.Seed)
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "--- tail of %s's log:\n%s\n", n.ID, n.LogTail(25))
	}
	c.t.Error(b.String())
}

// Check holds the cluster steady for hold, then checks every scheduled
// second since the previous check, through now + hold: each task fired
// exactly once in each, but for the bounded-lead repeats the recorded
// faults allow. It waits until the fires are due and then up to
// Options.Settle for them to arrive. It reports a failure (without stopping
// the test) and returns false when a fire is missed or repeated.
func (c *Cluster) Check(hold time.Duration) bool {
	c.t.Helper()
	to := time.Now().Add(hold).Unix()
	if to < c.next {
		to = c.next
	}
	due := time.Unix(to+1, 0)
	time.Sleep(time.Until(due))
	c.settle(c.next, to, due)
	// Repeats arrive after the first fire; give stragglers a moment.
	time.Sleep(200 * time.Millisecond)
	r := c.verify(c.next, to)
	c.next = to + 1
	return c.report(r, "check")
}

// settle waits until every fire of the scheduled seconds [from, to] has
// arrived, or none has for Options.Settle, or MaxSettle has passed since
// due. A late fire is not a missed one: a backlogged node delivers its
// fires late, in order, and the wait goes on for as long as they come.
func (c *Cluster) settle(from, to int64, due time.Time) {
	last, since := -1, time.Now()
	for !c.Sink.Complete(from, to, len(c.Tasks)) {
		now := time.Now()
		if n := c.Sink.Count(from, to); n != last {
			last, since = n, now
		}
		if now.Sub(since) > c.opt.Settle || now.Sub(due) > c.opt.MaxSettle {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := time.Since(due); d > c.opt.Settle {
		c.Step("fires of %s..%s still arrived %v after they were due: a node is behind (backlog)",
			c.sched(from), c.sched(to), d.Round(time.Second))
	}
}

func (c *Cluster) verify(from, to int64) *Result {
	calls, bad := c.Sink.Snapshot()
	if len(bad) > 0 {
		c.fail("the sink received %d requests without a valid Idempotency-Key, e.g. %q", len(bad), bad[0])
	}
	return Verify(calls, Window{Tasks: c.Tasks, From: from, To: to, Lead: c.opt.Lead, Faults: c.Faults()})
}

func (c *Cluster) report(r *Result, what string) bool {
	c.t.Helper()
	var fresh int
	for _, o := range r.Duplicates {
		if !c.reported[o.Key] {
			fresh++
		}
	}
	for _, k := range r.Missed {
		if !c.reported[k] {
			fresh++
		}
	}
	var per []string
	for _, n := range c.Nodes {
		if k := r.PerNode[n.ID]; k > 0 {
			per = append(per, fmt.Sprintf("%s %d", n.ID, k))
		}
	}
	c.Step("%s %s..%s: %d fires expected, %d duplicates, %d missed, %d repeats within the lead; calls by node: %s",
		what, c.sched(r.From), c.sched(r.To), r.Expected, len(r.Duplicates), len(r.Missed), len(r.Repeats), strings.Join(per, ", "))
	if r.OK() {
		return true
	}
	if len(r.Duplicates) == 0 && c.accountFolds(r, what) {
		return true
	}
	if fresh > 0 {
		for _, o := range r.Duplicates {
			c.reported[o.Key] = true
		}
		for _, k := range r.Missed {
			c.reported[k] = true
		}
		c.fail("%s failed:\n%s", what, r.Format(c.start))
	}
	return false
}

// Finish checks the whole run once more, catching fires that arrived after
// the check of their window (a node that wakes up and fires old times), and
// reports only offenses no check reported yet.
func (c *Cluster) Finish() {
	c.t.Helper()
	if c.next <= c.first {
		return
	}
	c.settle(c.first, c.next-1, time.Unix(c.next, 0))
	time.Sleep(time.Second)
	c.report(c.verify(c.first, c.next-1), "final check of the whole run")
}

// accountFolds accepts the missed fires of r that nodes counted as
// misfires: runs of fires of a task followed by a later fire of it (Folds),
// as a node's misfire policy leaves them when it released them later than
// --misfire-threshold (a node far behind): each closed at least that long
// after its first fire was due, and no more of them per node than its
// shardcron_misfires_total. Tails (no later fire of the task at all)
// and folds beyond the count stay missed. It reports whether every missed
// fire was accounted for.
func (c *Cluster) accountFolds(r *Result, what string) bool {
	if len(r.Missed) == 0 {
		return true
	}
	calls, _ := c.Sink.Snapshot()
	folds, tails := Folds(calls, r.Missed)
	counted := make(map[string]uint64)
	for _, n := range c.Nodes {
		counted[n.ID] = n.Misfires()
	}
	var fresh []Fold
	early := 0 // folds whose fires were not late enough to be misfires
	for _, f := range folds {
		if f.Late < c.opt.Misfire {
			early++
		} else if !c.folds[f.Next] {
			fresh = append(fresh, f)
		}
	}
	by := maps.Clone(c.foldsBy)
	for _, f := range fresh {
		by[f.By]++
	}
	var over []string
	for node, k := range by {
		if uint64(k) > counted[node] {
			over = append(over, fmt.Sprintf("%s folded %d, counted %d", node, k, counted[node]))
		}
	}
	missedInFolds := len(r.Missed) - len(tails)
	if len(tails) > 0 || len(over) > 0 || early > 0 {
		c.Step("%s: of %d missed fires, %d were not followed by any fire of their task; %d lie in %d folds, "+
			"%d of them closed less than --misfire-threshold %v after their first fire was due (%s)",
			what, len(r.Missed), len(tails), missedInFolds, len(folds), early, c.opt.Misfire, strings.Join(over, "; "))
		return false
	}
	for _, f := range fresh {
		c.folds[f.Next] = true
	}
	c.foldsBy = by
	var per []string
	for _, n := range c.Nodes {
		per = append(per, fmt.Sprintf("%s %d folds / %d misfires counted", n.ID, by[n.ID], counted[n.ID]))
	}
	c.Step("%s: all %d missed fires lie in %d folds that the nodes counted as misfires (--misfire-threshold %v passed: "+
		"the machine is too slow for this scenario, not a lost fire): %s",
		what, len(r.Missed), len(folds), c.opt.Misfire, strings.Join(per, ", "))
	return true
}

// BurstCut reports, for the scheduled second sec, each node's fires and the
// batches its burst needed at most Queue per batch, and the arrival spread;
// it fails the test unless some node's burst took more than one batch.
func (c *Cluster) BurstCut(sec int64) {
	c.t.Helper()
	per := c.Sink.PerNode(sec)
	var parts []string
	cut := false
	for _, n := range c.Nodes {
		if k, ok := per[n.ID]; ok {
			parts = append(parts, fmt.Sprintf("%s %d fires (>= %d batches)", n.ID, k, (k+c.opt.Queue-1)/c.opt.Queue))
			cut = cut || k > c.opt.Queue
		}
	}
	c.Step("burst of %s: %s; arrivals spread over %v", c.sched(sec), strings.Join(parts, ", "),
		c.Sink.Spread(sec).Round(time.Millisecond))
	if !cut {
		c.fail("the burst of %s was not cut into batches: no node fired more than --queue %d", c.sched(sec), c.opt.Queue)
	}
}
