package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/ring"
)

// A lock attempt canceled by a membership change (the ring moved the
// partition to a node that just joined) deletes its lock key, but etcd can
// apply the attempt's put after that delete. The key, under the live
// session's lease, would stand ahead of the partition's new owner, which
// would wait for it as long as the session lives: the node that joined
// never became ready (the chaos suite's "not ready within 1m0s"). The
// session that put it deletes it, whether the put lands while the
// coordinator still waits for the attempt's end or after it, and the new
// owner takes the partition.
func TestEngine_LockKeyPutAfterItsAttemptFailedIsDeleted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ended bool // the put lands once node-a handled the attempt's end
	}{
		{"put as the attempt ends", false},
		{"put after the attempt ended", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			strayLockKey(t, tc.ended)
		})
	}
}

func strayLockKey(t *testing.T, ended bool) {
	c := etcdtest.Start(t)
	cfg := func(id string) func(*Config) {
		return func(c *Config) { c.NodeID = id; c.Partitions = 16 }
	}
	p := movingPartition(t, 16)
	lockOfP := func(key, _ string) bool { return strings.HasPrefix(key, newKeys("").lock(p)+"/") }

	b := startNode(t, c, "", nil, cfg("node-b"))
	cliA := c.NewClient(t)
	after := make(chan struct{})
	if !ended {
		close(after)
	}
	late := injectFaults(cliA).lateCommits(lockOfP, after)
	a := startNodeOn(t, cliA, "", nil, cfg("node-a"), noWait)
	select {
	case <-late.reached:
	case <-time.After(20 * time.Second):
		t.Fatalf("node-a did not try to lock partition %d", p)
	}
	// node-c's lock of p waits until node-a's put is in.
	cliC := c.NewClient(t)
	until := make(chan struct{})
	injectFaults(cliC).pauses(lockOfP, until)
	cn := startNodeOn(t, cliC, "", nil, cfg("node-c"), noWait)
	if ended {
		// node-a is ready once it has no acquire left: it handled the
		// failed attempt's result.
		etcdtest.WaitFor(t, 20*time.Second, func() bool { return a.e.Ready() && !a.e.Owns(p) })
		close(after)
	}
	select {
	case resp := <-late.done:
		if resp == nil || !resp.Succeeded {
			t.Fatalf("node-a's late put of its lock key of partition %d did not apply: %v", p, resp)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("node-a did not give up its lock of partition %d", p)
	}
	close(until)
	etcdtest.WaitFor(t, 20*time.Second, func() bool {
		return cn.e.Ready() && cn.e.Owns(p) && a.e.Ready() && b.e.Ready()
	})
	if a.e.sess.Load().Fenced() {
		t.Error("node-a's session ended; deleting the key was enough")
	}
}

// movingPartition returns a partition that node-a takes from node-b when
// it joins, and node-c from node-a when node-c joins.
func movingPartition(t *testing.T, partitions int) int {
	t.Helper()
	cfg := DefaultConfig("node-a")
	cfg.Partitions = partitions
	two, err := ring.NewAssignment(cfg.ring(), []string{"node-a", "node-b"})
	if err != nil {
		t.Fatal(err)
	}
	three, err := ring.NewAssignment(cfg.ring(), []string{"node-a", "node-b", "node-c"})
	if err != nil {
		t.Fatal(err)
	}
	for p := range partitions {
		if two.Owner(p) == "node-a" && three.Owner(p) == "node-c" {
			return p
		}
	}
	t.Fatal("no partition moves from node-a to node-c")
	return -1
}
