package clustertest

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// TestSoak runs random faults, chosen by a seeded generator, against three
// nodes (and a fourth that joins and leaves) for -chaos.soak, checking every
// window after every step. The seed fixes the sequence of faults and nodes;
// their timing still follows the machine, so a failure found by a seed may
// need a few runs of it to show again. For example:
//
//	go test ./internal/clustertest -run TestSoak -chaos.soak=10m -chaos.seed=42 -timeout 30m -v
func TestSoak(t *testing.T) {
	if *soakFlag <= 0 {
		t.Skip("the soak runs with -chaos.soak=<duration> (and optionally -chaos.seed=N)")
	}
	seed := *seedFlag
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	repro := func() string {
		return "go test ./internal/clustertest -run TestSoak -v -chaos.soak=" + soakFlag.String() +
			" -chaos.seed=" + itoa(seed) + " -chaos.tasks=" + itoa(int64(*tasksFlag)) +
			" -timeout " + (*soakFlag + 20*time.Minute).String()
	}
	t.Logf("soak: seed %d; reproduce with: %s", seed, repro())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("soak failed: seed %d; reproduce with: %s", seed, repro())
		}
	})
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	c := newCluster(t, Options{Seed: seed})
	c.Check(hold)
	c.BurstCut(c.next - 1)
	spare := c.AddNode()

	running := func() []*Node {
		var out []*Node
		for _, n := range c.Nodes[:3] {
			if n.Running() {
				out = append(out, n)
			}
		}
		return out
	}
	// outage applies a crash-like fault to n, checks the cluster once the
	// others own every partition, and undoes the fault.
	outage := func(step int, n *Node, kind string, post, check time.Duration, do func(), undo string, undoFn func()) {
		c.Fault(n.ID, kind, post)
		do()
		c.WaitOwned(ready, n.ID)
		c.Check(check)
		c.Step("soak %d: %s %s", step, undo, n.ID)
		c.Recovered(n.ID)
		undoFn()
		n.WaitReady(t, ready)
	}
	deadline := time.Now().Add(*soakFlag)
	for step := 1; time.Now().Before(deadline); step++ {
		nodes := running()
		n := nodes[rng.IntN(len(nodes))]
		check := time.Duration(1+rng.IntN(3)) * time.Second
		switch action := rng.IntN(8); action {
		case 0: // graceful restart
			c.Step("soak %d: SIGTERM %s", step, n.ID)
			n.Stop(t)
			c.WaitOwned(ready, n.ID)
			c.Check(check)
			c.Step("soak %d: start %s", step, n.ID)
			n.Start(t)
			n.WaitReady(t, ready)
		case 1: // crash and restart
			outage(step, n, FaultKill, 0, check, func() { n.Kill(t) }, "restart", func() { n.Start(t) })
		case 2: // pause past the lease
			outage(step, n, FaultPause, 0, check, func() { n.Pause(t) }, "SIGCONT", func() { n.Resume(t) })
		case 3: // a short pause, which may or may not pass the fencing deadline
			d := time.Duration(200+rng.IntN(2000)) * time.Millisecond
			c.Fault(n.ID, FaultShortPause, 0)
			n.Pause(t)
			time.Sleep(d)
			c.Step("soak %d: SIGCONT %s after %v", step, n.ID, d)
			c.Recovered(n.ID)
			n.Resume(t)
			n.WaitReady(t, ready)
		case 4: // cut off from etcd past the lease
			outage(step, n, FaultCut, c.opt.Lead, check, n.Cut, "restore", n.Restore)
		case 5: // etcd restart
			c.Step("soak %d: restart etcd", step)
			c.Etcd.Members[0].Stop()
			c.Etcd.Members[0].Restart(t)
			c.WaitReady()
		default: // the spare joins or leaves
			if spare.Running() {
				c.Step("soak %d: %s leaves (SIGTERM)", step, spare.ID)
				spare.Stop(t)
				c.WaitOwned(ready, spare.ID)
			} else {
				c.Step("soak %d: %s joins", step, spare.ID)
				spare.Start(t)
				spare.WaitReady(t, ready)
			}
		}
		c.WaitOwned(ready)
		c.Check(check)
	}
	c.Finish()
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
