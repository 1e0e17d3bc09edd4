package clustertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// hold is how long the cluster runs steady after a step before its window
// is checked.
const hold = 2 * time.Second

// ready bounds how long a node may take to become ready.
const ready = time.Minute

// start checks the first steady seconds and that bursts are cut.
func start(t *testing.T, o Options) *Cluster {
	t.Helper()
	c := newCluster(t, o)
	c.Check(hold)
	c.BurstCut(c.next - 1)
	return c
}

func TestChaos_Join(t *testing.T) {
	t.Parallel()
	c := start(t, Options{Nodes: 2})
	n := c.AddNode()
	c.Step("join: start %s", n.ID)
	n.Start(t)
	n.WaitReady(t, ready)
	c.WaitOwned(ready)
	c.Step("%s ready, every partition owned", n.ID)
	c.Check(hold)
	c.Finish()
}

func TestChaos_GracefulLeave(t *testing.T) {
	t.Parallel()
	c := start(t, Options{})
	n := c.Node("n3")
	c.Step("graceful leave: SIGTERM %s", n.ID)
	n.Stop(t)
	c.Step("%s exited 0", n.ID)
	c.WaitOwned(ready, n.ID)
	c.Step("every partition owned by the others")
	c.Check(hold)
	c.Finish()
}

func TestChaos_Kill(t *testing.T) {
	t.Parallel()
	c := start(t, Options{})
	n := c.Node("n2")
	c.Fault(n.ID, FaultKill, 0)
	n.Kill(t)
	c.WaitOwned(ready, n.ID)
	c.Step("every partition owned by the others")
	c.Check(hold)
	c.Step("restart %s", n.ID)
	c.Recovered(n.ID)
	n.Start(t)
	n.WaitReady(t, ready)
	c.WaitOwned(ready)
	c.Step("%s ready, every partition owned", n.ID)
	c.Check(hold)
	c.Finish()
}

func TestChaos_PausePastLease(t *testing.T) {
	t.Parallel()
	c := start(t, Options{})
	n := c.Node("n2")
	c.Fault(n.ID, FaultPause, 0)
	n.Pause(t)
	c.WaitOwned(ready, n.ID)
	c.Step("every partition owned by the others while %s is stopped", n.ID)
	c.Check(hold)
	c.Step("SIGCONT %s", n.ID)
	c.Recovered(n.ID)
	n.Resume(t)
	n.WaitReady(t, ready)
	c.WaitOwned(ready)
	c.Step("%s ready again, every partition owned", n.ID)
	c.Check(hold)
	c.Finish()
}

func TestChaos_CutOff(t *testing.T) {
	t.Parallel()
	o := Options{}
	c := start(t, o)
	n := c.Node("n2")
	c.cutOff(n)
	c.Step("%s ready again, every partition owned", n.ID)
	c.Check(hold)
	c.Finish()
}

// cutOff cuts n off from etcd until the other nodes own every partition,
// checking the fires meanwhile, then restores it and waits until it is
// ready and every partition owned. It returns the fault it recorded: a
// node cut off keeps dispatching up to the lead past its last
// acknowledged watermark.
func (c *Cluster) cutOff(n *Node) Fault {
	c.t.Helper()
	c.Fault(n.ID, FaultCut, c.opt.Lead)
	n.Cut()
	c.WaitOwned(ready, n.ID)
	c.Step("every partition owned by the others while %s is cut off", n.ID)
	c.Check(hold)
	c.Step("restore %s's connection to etcd", n.ID)
	c.Recovered(n.ID)
	n.Restore()
	n.WaitReady(c.t, ready)
	c.WaitOwned(ready)
	faults := c.Faults()
	return faults[len(faults)-1]
}

func TestChaos_EtcdRestart(t *testing.T) {
	t.Parallel()
	c := start(t, Options{})
	m := c.Etcd.Members[0]
	c.Step("stop etcd")
	// Every node is cut off: whatever it had not recorded when etcd stopped
	// may repeat, up to the bounded lead.
	for _, n := range c.Nodes {
		c.Fault(n.ID, FaultCut, c.opt.Lead)
	}
	m.Stop()
	c.Step("restart etcd on the same data directory and ports")
	m.Restart(t)
	for _, n := range c.Nodes {
		c.Recovered(n.ID)
	}
	c.Step("etcd ready")
	c.WaitReady()
	c.WaitOwned(ready)
	c.Step("every node ready, every partition owned")
	c.Check(hold)
	c.Finish()
}

func TestChaos_EtcdLeaderChange(t *testing.T) {
	t.Parallel()
	c := start(t, Options{EtcdMembers: 3})
	for range 2 {
		from := c.Etcd.Leader(t)
		to := (from + 1) % len(c.Etcd.Members)
		c.Step("move the etcd leader from %s to %s", c.Etcd.Members[from].Name, c.Etcd.Members[to].Name)
		c.Etcd.MoveLeader(t, to)
		c.Step("%s leads", c.Etcd.Members[to].Name)
		c.Check(hold)
	}
	c.Finish()
}

func TestChaos_RollingRestart(t *testing.T) {
	t.Parallel()
	c := start(t, Options{})
	rollingRestart(t, c)
	c.Finish()
}

// rollingRestart stops each node gracefully (SIGTERM) and starts it again,
// in turn, checking the fires after each step.
func rollingRestart(t *testing.T, c *Cluster) {
	for _, n := range c.Nodes {
		c.Step("rolling restart: SIGTERM %s", n.ID)
		n.Stop(t)
		c.WaitOwned(ready, n.ID)
		c.Step("%s exited 0, every partition owned by the others", n.ID)
		c.Check(time.Second)
		c.Step("start %s", n.ID)
		n.Start(t)
		n.WaitReady(t, ready)
		c.WaitOwned(ready)
		c.Step("%s ready, every partition owned", n.ID)
		c.Check(time.Second)
	}
}

// TestChaos_ReleaseDuringNoSpace leaves a node gracefully while etcd refuses
// every write (its NOSPACE alarm: Put and Txn fail, keep-alives pass), so the
// release's checkpoint write fails. Once the alarm is disarmed every
// partition must have an owner within the lease TTL, and nothing may be
// missed. The leaving node could record nothing, so its successor repeats
// up to the lead, as after a crash.
func TestChaos_ReleaseDuringNoSpace(t *testing.T) {
	t.Parallel()
	const quota = 16 << 20
	c := start(t, Options{QuotaBackendBytes: quota})
	cli := c.Etcd.Client
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	c.Step("fill etcd up to its %d MiB quota", quota>>20)
	junk := strings.Repeat("x", 512<<10)
	for i := 0; ; i++ {
		_, err := cli.Put(ctx, fmt.Sprintf("/clustertest/junk/%04d", i), junk)
		if errors.Is(err, rpctypes.ErrGRPCNoSpace) || errors.Is(err, rpctypes.ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatalf("fill etcd: %v", err)
		}
		if i > 4*quota/len(junk) {
			t.Fatalf("etcd took %d puts of %d bytes without raising NOSPACE", i, len(junk))
		}
	}
	alarms, err := cli.AlarmList(ctx)
	if err != nil || len(alarms.Alarms) == 0 || alarms.Alarms[0].Alarm != etcdserverpb.AlarmType_NOSPACE {
		t.Fatalf("no NOSPACE alarm after filling etcd: %v %v", alarms, err)
	}
	c.Step("NOSPACE alarm raised")

	n := c.Node("n3")
	c.Step("graceful leave during the alarm: SIGTERM %s", n.ID)
	// The node fires on until its loop takes the release, which may come
	// after the next second's tick (a CI run saw SIGTERM 20 ms before one
	// and every fire of that second repeated): those fires are its session's
	// too, recorded nowhere, so repeats within the lead of them are allowed.
	c.Fault(n.ID, FaultFailedRelease, c.opt.Lead)
	n.Stop(t)
	c.Step("%s exited", n.ID)

	c.Step("free the space: delete the filler, compact, defragment, disarm")
	resp, err := cli.Delete(ctx, "/clustertest/junk/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("delete the filler: %v", err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact: %v", err)
	}
	for _, ep := range c.Etcd.Endpoints {
		if _, err := cli.Defragment(ctx, ep); err != nil {
			t.Fatalf("defragment %s: %v", ep, err)
		}
	}
	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: alarms.Alarms[0].MemberID, Alarm: etcdserverpb.AlarmType_NOSPACE}); err != nil {
		t.Fatalf("disarm: %v", err)
	}
	c.Step("alarm disarmed")
	took := c.WaitOwned(c.opt.LeaseTTL+time.Second, n.ID)
	c.Step("every partition owned by the others %v after the alarm cleared (lease TTL %v)", took.Round(time.Millisecond), c.opt.LeaseTTL)
	c.Check(hold)
	c.Finish()
}

// TestChaos_JoinDuringNoSpace raises etcd's NOSPACE alarm right after a
// fourth node registers, before the others (which debounce membership
// changes) release what the new ring takes from them: their release writes
// fail while their sessions live on, and the newcomer cannot lock. Once the
// alarm is disarmed every partition must have an owner within the lease TTL
// (plus a second for the API's member cache), and nothing may be missed.
// The releasing nodes could record nothing while the alarm lasted, so
// repeats within the lead of their fires are allowed.
func TestChaos_JoinDuringNoSpace(t *testing.T) {
	t.Parallel()
	c := start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := c.AddNode()
	key := "/shardcron/nodes/" + n.ID
	wch := c.Etcd.Client.Watch(ctx, key)
	before := make(map[string]int)
	for _, o := range c.Nodes {
		before[o.ID] = o.LogCount("writing release checkpoints failed")
	}
	c.Step("join: start %s", n.ID)
	n.Start(t)
	for registered := false; !registered; {
		select {
		case resp := <-wch:
			registered = len(resp.Events) > 0
		case <-ctx.Done():
			t.Fatalf("%s never registered", n.ID)
		}
	}
	c.Etcd.RaiseNoSpace(t)
	c.Step("NOSPACE alarm raised as soon as %s registered", n.ID)
	for _, o := range c.Nodes[:3] {
		c.Fault(o.ID, FaultFailedRelease, c.opt.Lead)
	}
	// Past the debounce and the bounded release attempts.
	time.Sleep(3 * time.Second)
	var failed []string
	for _, o := range c.Nodes {
		if k := o.LogCount("writing release checkpoints failed") - before[o.ID]; k > 0 {
			failed = append(failed, fmt.Sprintf("%s %d", o.ID, k))
		}
	}
	c.Step("release write failures logged during the alarm: %v", failed)
	c.Etcd.ClearNoSpace(t)
	c.Step("alarm disarmed")
	took := c.WaitOwned(c.opt.LeaseTTL + time.Second)
	c.Step("every partition owned %v after the alarm cleared (lease TTL %v)", took.Round(time.Millisecond), c.opt.LeaseTTL)
	c.Check(hold)
	c.Finish()
}
