package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/ring"
)

// standbyNode configures a standby test's node: a lease long enough that
// the survivor prepares the dead node's partitions well before it ends
// (suspectAfter is a third of it, then up to a poll).
func standbyNode(id string) func(*Config) {
	return func(cfg *Config) {
		cfg.NodeID, cfg.LeaseTTL, cfg.Partitions = id, 15*time.Second, 8
	}
}

// startCutOffable starts node-a on a client of c through a proxy, which
// the test cuts to make node-a look dead.
func startCutOffable(t *testing.T, c *etcdtest.Cluster) (*testNode, *etcdtest.Proxy) {
	proxy := c.NewProxy(t)
	return startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", nil, standbyNode("node-a")), proxy
}

// startStandbyPair starts node-b on cli beside node-a, and returns it once
// the two share the partitions, with how many node-a owns.
func startStandbyPair(t *testing.T, a *testNode, cli *clientv3.Client) (*testNode, int) {
	b := startNodeOn(t, cli, "", nil, standbyNode("node-b"))
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		na, nb := a.e.Stats().PartitionsOwned, b.e.Stats().PartitionsOwned
		return na > 0 && nb > 0 && na+nb == 8
	})
	return b, a.e.Stats().PartitionsOwned
}

// firstOwned is the lowest partition n owns.
func firstOwned(n *testNode) int {
	p := 0
	for !n.e.owned[p].Load() {
		p++
	}
	return p
}

// A node cut off from etcd stops writing its watermark: the node the ring
// without it names for its partitions prepares them before its lease ends
// (nothing moves yet), and acquires them prepared once it has ended,
// without waiting for a turn to prepare (node-b's are all taken here).
func TestEngine_StandbyPreparesADeadNodesPartitionsBeforeItsLeaseEnds(t *testing.T) {
	t.Parallel() // most of it waits for a lease of 15 s to end
	c := etcdtest.Start(t)
	a, proxy := startCutOffable(t, c)
	b, na := startStandbyPair(t, a, c.Client)
	proxy.Cut()
	etcdtest.WaitFor(t, 12*time.Second, func() bool { return b.e.Stats().StandbyReady == na })
	if got := b.e.Stats().PartitionsOwned; got != 8-na {
		t.Fatalf("node-b owns %d partitions once it prepared node-a's, want its own %d: the lease ended first", got, 8-na)
	}
	for range cap(b.e.preparing) {
		b.e.preparing <- struct{}{}
	}
	t.Cleanup(func() {
		for range cap(b.e.preparing) {
			<-b.e.preparing
		}
	})
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return b.e.Stats().PartitionsOwned == 8 })
	if st := b.e.Stats(); st.StandbyTaken != uint64(na) || st.StandbyReady != 0 {
		t.Errorf("node-b took %d partitions from the standby (%d left), want node-a's %d", st.StandbyTaken, st.StandbyReady, na)
	}
}

// A node whose watermark is written again looks alive: what was prepared
// for it is dropped, and nothing moves.
func TestEngine_StandbyIsDroppedWhenTheWatermarkMovesAgain(t *testing.T) {
	t.Parallel() // most of it waits for a lease of 15 s to end
	c := etcdtest.Start(t)
	cliA := c.NewClient(t)
	faults := injectFaults(cliA)
	a := startNodeOn(t, cliA, "", nil, standbyNode("node-a"))
	b, na := startStandbyPair(t, a, c.Client)
	faults.puts(watermarkWrites) // node-a's keep-alives go on: its lease holds
	etcdtest.WaitFor(t, 12*time.Second, func() bool { return b.e.Stats().StandbyReady == na })
	faults.puts(nil)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return b.e.Stats().StandbyReady == 0 })
	if st := b.e.Stats(); st.StandbyTaken != 0 || st.PartitionsOwned != 8-na || a.e.Stats().PartitionsOwned != na {
		t.Errorf("node-b took %d partitions from the standby and owns %d, node-a %d; want 0, %d and %d",
			st.StandbyTaken, st.PartitionsOwned, a.e.Stats().PartitionsOwned, 8-na, na)
	}
}

// Only a node whose watermark stopped while this node's moves is suspected,
// and only while at most half of the members are: a stall of etcd's stops
// every watermark, and preparing the whole fleet would not help.
func TestEngine_SuspectsAreTheSilentFew(t *testing.T) {
	e := &Engine{cfg: Config{NodeID: "n1", LeaseTTL: 9 * time.Second, WatermarkInterval: 100 * time.Millisecond}}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	fresh, silent := now.Add(-time.Second), now.Add(-e.suspectAfter())
	members := func(n int) *ring.Assignment {
		ids := []string{"n1", "n2", "n3", "n4", "n5"}[:n]
		a, err := ring.NewAssignment(ring.DefaultConfig(), ids)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for _, tc := range []struct {
		name  string
		nodes int
		moved map[string]time.Time
		want  []string
	}{
		{"one of three silent", 3, map[string]time.Time{"n1": fresh, "n2": silent, "n3": fresh}, []string{"n2"}},
		{"silent for less than suspectAfter", 3, map[string]time.Time{"n1": fresh, "n2": now.Add(-e.suspectAfter() + time.Millisecond), "n3": fresh}, nil},
		{"never seen (joining)", 3, map[string]time.Time{"n1": fresh, "n3": fresh}, nil},
		{"this node silent too", 3, map[string]time.Time{"n1": silent, "n2": silent, "n3": fresh}, nil},
		{"this node not seen", 3, map[string]time.Time{"n2": silent, "n3": fresh}, nil},
		{"two of five", 5, map[string]time.Time{"n1": fresh, "n2": silent, "n3": silent, "n4": fresh, "n5": fresh}, []string{"n2", "n3"}},
		{"three of five", 5, map[string]time.Time{"n1": fresh, "n2": silent, "n3": silent, "n4": silent, "n5": fresh}, nil},
		{"the other of two", 2, map[string]time.Time{"n1": fresh, "n2": silent}, []string{"n2"}},
		{"silent for three lease TTLs: alive, and stuck", 3, map[string]time.Time{"n1": fresh, "n2": now.Add(-3 * e.cfg.LeaseTTL), "n3": fresh}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := e.suspects(members(tc.nodes), tc.moved, now); !slices.Equal(got, tc.want) {
				t.Errorf("suspects %v, want %v", got, tc.want)
			}
		})
	}
}

// A standby read of a partition that ends after the partition's acquire
// read it itself must not put its older read in the Badger cache: the
// cache then missed every change in between, and from its next change on
// recorded a revision past them, so that a restart found a deleted task
// there and armed it again.
func TestEngine_StandbyReadEndingLateLeavesTheCacheRight(t *testing.T) {
	t.Parallel() // most of it waits for a lease of 15 s to end
	c := etcdtest.Start(t)
	a, proxy := startCutOffable(t, c)
	cliB := c.NewClient(t)
	faults := injectFaults(cliB)
	b, _ := startStandbyPair(t, a, cliB)
	p := firstOwned(a)
	gone, later := idIn("gone", p, 8), idIn("later", p, 8)
	putTask(t, b.e.Registry(), handlerTask(gone, "0 0 0 1 1 *"))

	// node-b's standby read of p is held once etcd answered it.
	var once atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	var released sync.Once
	let := func() { released.Do(func() { close(release) }) }
	t.Cleanup(let) // before the nodes stop: a held read would hold the stop
	hook := func(key string) {
		if strings.HasSuffix(key, fmt.Sprintf("/tasks/%05d/", p)) && once.CompareAndSwap(false, true) {
			close(held)
			<-release
		}
	}
	faults.afterGet.Store(&hook)
	proxy.Cut()
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatalf("node-b never read partition %d for the standby: the test proves nothing", p)
	}
	if err := b.e.Registry().Delete(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	// node-a's lease ends. node-b's acquire of p either reads p itself
	// meanwhile (given a few seconds: no timing is asserted, a slow one
	// only lets the test pass) or waits for the standby's read.
	etcdtest.WaitFor(t, 20*time.Second, func() bool {
		ms, _, err := membership.List(context.Background(), c.Client, b.e.cfg.Prefix)
		return err == nil && len(ms) == 1
	})
	for range 30 {
		if b.e.Stats().PartitionsOwned == 8 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	let()
	// Every prepare ended, the held one too: its read went where it goes.
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return b.e.Stats().PartitionsOwned == 8 && len(b.e.preparing) == 0 })
	putTask(t, b.e.Registry(), handlerTask(later, "0 0 0 1 1 *"))
	cached := func() (ids []string) {
		if _, err := b.store.Partition(uint32(p), func(id string, _ []byte, _ int64) error {
			ids = append(ids, id)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return slices.Contains(cached(), later) })
	if ids := cached(); slices.Contains(ids, gone) {
		t.Errorf("node-b's cache of partition %d holds %s, deleted before node-b acquired it: %v", p, gone, ids)
	}
	b.stop(t)
	b = startNodeOn(t, cliB, b.dir, nil, standbyNode("node-b"))
	if owns(b, gone) {
		t.Errorf("restarted on its cache, node-b holds %s, deleted", gone)
	}
}

// A partition prepared in standby is brought up to its acquisition by the
// acquire's catch-up, however long before it was read: a task deleted,
// paused, changed or created meanwhile is armed as etcd has it then, also
// when etcd compacted past the prepared read.
func TestEngine_StandbyPartitionCatchesUpWithChangesSinceItsRead(t *testing.T) {
	t.Parallel() // most of it waits for a lease of 15 s to end
	c := etcdtest.Start(t)
	a, proxy := startCutOffable(t, c)
	b, na := startStandbyPair(t, a, c.Client)
	p := firstOwned(a)
	id := func(name string) string { return idIn(name, p, 8) }
	reg := b.e.Registry()
	for _, name := range []string{"gone", "paused", "changed"} {
		putTask(t, reg, handlerTask(id(name), "0 0 0 1 1 *"))
	}
	proxy.Cut()
	etcdtest.WaitFor(t, 12*time.Second, func() bool { return b.e.Stats().StandbyReady == na })
	ctx := context.Background()
	if err := reg.Delete(ctx, id("gone")); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.SetPaused(ctx, id("paused"), true); err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, handlerTask(id("changed"), "0 0 0 1 6 *"))
	putTask(t, reg, handlerTask(id("new"), "0 0 0 1 1 *"))
	resp, err := c.Client.Get(ctx, "compact")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return b.e.Stats().PartitionsOwned == 8 })
	if st := b.e.Stats(); st.StandbyTaken != uint64(na) {
		t.Fatalf("node-b took %d partitions from the standby, want %d: the test proves nothing", st.StandbyTaken, na)
	}
	if owns(b, id("gone")) {
		t.Errorf("node-b holds %s, deleted after the standby read", id("gone"))
	}
	if s := taskState(t, b, id("paused")); !s.NextFireAt.IsZero() {
		t.Errorf("%s, paused after the standby read, fires next at %s", id("paused"), s.NextFireAt)
	}
	if s := taskState(t, b, id("changed")); s.NextFireAt.Month() != time.June {
		t.Errorf("%s, moved to June after the standby read, fires next at %s", id("changed"), s.NextFireAt)
	}
	if !owns(b, id("new")) {
		t.Errorf("node-b does not hold %s, created after the standby read", id("new"))
	}
}

// What a node prepared for a suspect stays while the suspect is silent,
// also while this node cannot tell a dead node from etcd's stall (its own
// watermark stalled, or more than half of the members silent): no new
// node is suspected then, but the suspect did not write again, and
// dropping its partitions made a node whose own writes are slow read
// them again at every poll that found its own watermark moving.
func TestEngine_StandbyStaysWhileItsSuspectIsSilent(t *testing.T) {
	now := time.Now()
	e := &Engine{cfg: Config{NodeID: "n1", LeaseTTL: 9 * time.Second, WatermarkInterval: 100 * time.Millisecond},
		standby: newStandby(), log: quietLogger()}
	fresh, silent := now.Add(-time.Second), now.Add(-e.suspectAfter()-time.Second)
	for _, tc := range []struct {
		name    string
		nodes   int
		moved   map[string]time.Time
		dropped bool
	}{
		{"this node's watermark stalled", 3, map[string]time.Time{"n1": silent, "n2": silent, "n3": fresh}, false},
		{"more than half silent", 5, map[string]time.Time{"n1": fresh, "n2": silent, "n3": silent, "n4": silent, "n5": fresh}, false},
		{"the suspect writes again", 3, map[string]time.Time{"n1": silent, "n2": fresh, "n3": fresh}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := ring.NewAssignment(ring.DefaultConfig(), []string{"n1", "n2", "n3", "n4", "n5"}[:tc.nodes])
			if err != nil {
				t.Fatal(err)
			}
			without, err := ring.NewAssignment(a.Config(), slices.DeleteFunc(a.Members(), func(m string) bool { return m == "n2" }))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := &serving{e: e, ctx: ctx, assign: a, parts: map[int]*owned{}, acquiring: map[int]context.CancelFunc{},
				desired: map[int]bool{}, standing: map[int]*standing{}, suspected: []string{"n2"}}
			e.standby.reset()
			var plan []int
			for _, p := range without.Owned("n1") {
				if a.Owner(p) == "n2" {
					plan = append(plan, p)
					s.standing[p] = &standing{from: "n2", cancel: func() {}}
					e.standby.parts[p] = &prepared{p: p}
				}
			}
			if len(plan) == 0 {
				t.Fatal("n1 takes none of n2's partitions: the test proves nothing")
			}
			s.suspect(tc.moved)
			if kept := len(e.standby.parts); tc.dropped != (kept == 0) || (!tc.dropped && kept != len(plan)) {
				t.Errorf("%d of the %d partitions prepared for n2 kept, want dropped: %v", kept, len(plan), tc.dropped)
			}
		})
	}
}

// A standby read that fails (etcd slow or out of reach for a moment, as
// it may well be while a node dies) is tried again at the next poll: the
// partition is not left for its acquire to read.
func TestEngine_StandbyRetriesAFailedRead(t *testing.T) {
	t.Parallel() // most of it waits for a lease of 15 s to end
	c := etcdtest.Start(t)
	a, proxy := startCutOffable(t, c)
	cliB := c.NewClient(t)
	faults := injectFaults(cliB)
	b, na := startStandbyPair(t, a, cliB)
	p := firstOwned(a)
	faults.failsGetOnceOf(func(key string) bool { return strings.HasSuffix(key, fmt.Sprintf("/tasks/%05d/", p)) })
	proxy.Cut()
	etcdtest.WaitFor(t, 12*time.Second, func() bool { return b.e.Stats().StandbyReady == na })
	if faults.failGet.Load() != nil {
		t.Fatal("no standby read of the partition failed: the test proves nothing")
	}
}

// marksKV answers the watermark polls with the revisions of answers, one
// per poll, the last again after.
type marksKV struct {
	clientv3.KV
	mu      sync.Mutex // guards answers
	answers []*clientv3.GetResponse
}

func (m *marksKV) Get(context.Context, string, ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	resp := m.answers[0]
	if len(m.answers) > 1 {
		m.answers = m.answers[1:]
	}
	return resp, nil
}

// marksAt is a watermark poll's answer at etcd revision rev, with the mod
// revisions of the nodes' keys.
func marksAt(k keys, rev int64, mods map[string]int64) *clientv3.GetResponse {
	resp := &clientv3.GetResponse{Header: &etcdserverpb.ResponseHeader{Revision: rev}}
	for node, mod := range mods {
		resp.Kvs = append(resp.Kvs, &mvccpb.KeyValue{Key: []byte(k.watermark(node, "1")), ModRevision: mod})
	}
	return resp
}

// After etcd was restored from a backup, its revisions start again below
// the ones seen, and every node starts over as written at the first poll
// after. Compared with the highest seen, no node looked written until etcd
// passed the revision of before, and what was prepared for a suspect then
// stayed, to be armed from a read of a history etcd no longer has.
func TestEngine_WatermarksWrittenAfterARestoreOfEtcdMove(t *testing.T) {
	k := newKeys("")
	e := &Engine{keys: k, cli: &clientv3.Client{KV: &marksKV{answers: []*clientv3.GetResponse{
		marksAt(k, 100, map[string]int64{"n1": 100, "n2": 90}),
		marksAt(k, 20, map[string]int64{"n1": 20, "n2": 15}), // restored
	}}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	marks := e.watchMarks(ctx)
	before := <-marks
	after := <-marks
	for _, node := range []string{"n1", "n2"} {
		if !after[node].After(before[node]) {
			t.Errorf("%s's watermark last moved at the poll before the restore", node)
		}
	}
}
