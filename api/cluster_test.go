package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// settled reports whether every node sees all of them as members and owns
// exactly the partitions its ring assigns it.
func settled(nodes ...*testNode) bool {
	for _, n := range nodes {
		a := n.e.Assignment()
		if a == nil || len(a.Members()) != len(nodes) || !n.e.Ready() {
			return false
		}
		for p := range testPartitions {
			if n.e.Owns(p) != (a.Owner(p) == n.e.NodeID()) {
				return false
			}
		}
	}
	return true
}

// TestServer_TwoNodes checks what one node answers from another: a task's
// state from its owner, history merged from both, the node and partition
// lists, and answers without a node that does not respond. Both nodes
// require the same token, so their requests to each other carry it.
func TestServer_TwoNodes(t *testing.T) {
	c := etcdtest.Start(t)
	const token = "cluster-token"
	n1 := startNode(t, c, nodeOptions{id: "node-1", token: token})
	n2 := startNode(t, c, nodeOptions{id: "node-2", token: token})
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return settled(n1, n2) })
	c1, c2 := n1.client(token), n2.client(token)
	ctx := context.Background()

	// remoteID is a task id in a partition node-2 owns.
	var remoteID string
	for i := 0; remoteID == ""; i++ {
		id := fmt.Sprintf("remote/%d", i)
		if n2.e.Owns(n1.e.Registry().Partition(id)) {
			remoteID = id
		}
	}

	t.Run("StateFromOwner", func(t *testing.T) {
		if _, err := c1.PutTask(ctx, handlerTask(remoteID, "0 0 1 1 *"), 0); err != nil {
			t.Fatal(err)
		}
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			got, err := c1.GetTask(ctx, remoteID)
			if err != nil {
				t.Fatal(err)
			}
			return got.State != nil && got.State.Owner == "node-2"
		})
		// The extension endpoint answers only on the owner.
		path := "/v1/tasks/" + client.EscapeID(remoteID) + "/state"
		wantError(t, call(t, n1.ts, "GET", path, "", "Authorization", "Bearer "+token), http.StatusNotFound, "does not own")
		if a := call(t, n2.ts, "GET", path, "", "Authorization", "Bearer "+token); a.status != http.StatusOK {
			t.Fatalf("state on the owner: %v", a)
		}
		wantError(t, call(t, n2.ts, "GET", path, ""), http.StatusUnauthorized)
	})

	id := "merge/x"
	base := time.Now().UTC().Truncate(time.Millisecond)
	rec := func(sec, attempt int, node, status, errMsg string) task.Execution {
		at := base.Add(time.Duration(sec) * time.Second)
		return task.Execution{TaskID: id, ScheduledAt: at, StartedAt: at.Add(time.Millisecond),
			FinishedAt: at.Add(2 * time.Millisecond), Attempt: attempt, Node: node, Status: status, Error: errMsg}
	}
	shared := rec(2, 1, "node-1", task.ExecutionOK, "")
	for _, r := range []task.Execution{rec(1, 1, "node-1", task.ExecutionOK, ""), rec(3, 1, "node-1", task.ExecutionFailed, "boom"), shared} {
		n1.st.Record(r)
	}
	for _, r := range []task.Execution{rec(2, 2, "node-2", task.ExecutionOK, ""), rec(4, 1, "node-2", task.ExecutionOK, ""), shared} {
		n2.st.Record(r)
	}
	merged := []task.Execution{
		rec(4, 1, "node-2", task.ExecutionOK, ""),
		rec(3, 1, "node-1", task.ExecutionFailed, "boom"),
		rec(2, 2, "node-2", task.ExecutionOK, ""),
		shared,
		rec(1, 1, "node-1", task.ExecutionOK, ""),
	}

	t.Run("HistoryMerged", func(t *testing.T) {
		for name, c := range map[string]*client.Client{"node-1": c1, "node-2": c2} {
			got, err := c.History(ctx, id, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !equalExecutions(got, merged) {
				t.Fatalf("history from %s:\n got %+v\nwant %+v", name, got, merged)
			}
			got, err = c.History(ctx, id, 2)
			if err != nil || !equalExecutions(got, merged[:2]) {
				t.Fatalf("history from %s, limit 2: %+v, %v", name, got, err)
			}
		}
		local, err := c1.LocalHistory(ctx, id, 0)
		if err != nil || len(local) != 3 {
			t.Fatalf("local history of node-1: %+v, %v", local, err)
		}
		if a, err := c1.HistoryAnswer(ctx, id, 0); err != nil || !equalExecutions(a.Executions, merged) || a.Partial != nil {
			t.Fatalf("history answer with every node answering: %+v, %v", a, err)
		}
	})

	t.Run("Nodes", func(t *testing.T) {
		var nodes []client.Node
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			var err error
			if nodes, err = c1.Nodes(ctx); err != nil {
				t.Fatal(err)
			}
			return len(nodes) == 2 && slices.Equal(nodes[0].Owned, nodes[0].PartitionList) &&
				slices.Equal(nodes[1].Owned, nodes[1].PartitionList)
		})
		total := 0
		for i, want := range []*testNode{n1, n2} {
			x := nodes[i]
			if x.ID != want.e.NodeID() || x.APIAddr != want.ts.Listener.Addr().String() || x.Error != "" ||
				!x.Ready || x.Partitions != len(x.PartitionList) || x.Partitions == 0 || x.Version != "test-1" {
				t.Fatalf("node %d: %+v", i, x)
			}
			total += x.Partitions
		}
		if total != testPartitions {
			t.Fatalf("partitions add up to %d", total)
		}
	})

	t.Run("Partitions", func(t *testing.T) {
		var ps []client.Partition
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			var err error
			if ps, err = c2.Partitions(ctx); err != nil {
				t.Fatal(err)
			}
			return !slices.ContainsFunc(ps, func(p client.Partition) bool { return p.State != client.PartitionOwned })
		})
		owners := map[string]int{}
		for i, p := range ps {
			if p.Partition != i {
				t.Fatalf("partition %d at %d", p.Partition, i)
			}
			owners[p.Owner]++
		}
		if len(owners) != 2 || owners["node-1"] == 0 || owners["node-2"] == 0 {
			t.Fatalf("owners %v", owners)
		}
	})

	// node-2's API hangs while it stays a member: node-1 answers within
	// its peer timeout, with node-2's part marked as an error.
	t.Run("PeerHangs", func(t *testing.T) {
		n2.hang.Store(true)
		defer n2.hang.Store(false)
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		nodes, err := c1.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) != 2 || nodes[0].Error != "" || nodes[1].ID != "node-2" || nodes[1].Error == "" {
			t.Fatalf("nodes with node-2 hanging: %+v", nodes)
		}
		if got, err := c1.History(ctx, id, 0); err != nil || len(got) != 3 {
			t.Fatalf("history with node-2 hanging: %+v, %v", got, err)
		}
		wantPartialHistory(t, c1, id, "with node-2 hanging")
		if task, err := c1.GetTask(ctx, remoteID); err != nil || task.State == nil || task.State.Owner != "node-2" || task.State.OwnerError == "" {
			t.Fatalf("GET with the owner hanging: %+v, %v", task.State, err)
		}
	})

	// Last: node-2's API goes away while it stays a member.
	t.Run("PeerDown", func(t *testing.T) {
		n2.ts.Close()
		nodes, err := c1.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) != 2 || nodes[0].Error != "" || nodes[1].ID != "node-2" || nodes[1].Error == "" ||
			nodes[1].Owned != nil || nodes[1].Partitions == 0 {
			t.Fatalf("nodes with node-2 down: %+v", nodes)
		}
		got, err := c1.History(ctx, id, 0)
		if err != nil || len(got) != 3 {
			t.Fatalf("history with node-2 down: %+v, %v", got, err)
		}
		wantPartialHistory(t, c1, id, "with node-2 down")
		// The state names the owner that did not answer, and why.
		task, err := c1.GetTask(ctx, remoteID)
		if err != nil || task.State == nil || task.State.Owner != "node-2" || task.State.OwnerError == "" {
			t.Fatalf("GET with the owner down: %+v, %v", task.State, err)
		}
		ps, err := c1.Partitions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if want := p.Owner == "node-1"; (p.State == client.PartitionOwned) != want {
				t.Fatalf("partition %+v with node-2 down", p)
			}
		}
		// The down node's client sees a transport error, not an *client.Error.
		var ae *client.Error
		if _, err := c2.Nodes(ctx); err == nil || errors.As(err, &ae) {
			t.Fatalf("Nodes from a closed server: %v", err)
		}
	})
}

// wantPartialHistory checks that the history of id, asked of c while
// node-2 does not answer, says that node-2's records are missing: an
// answer without them must not read as complete.
func wantPartialHistory(t *testing.T, c *client.Client, id, when string) {
	t.Helper()
	a, err := c.HistoryAnswer(context.Background(), id, 0)
	if err != nil || len(a.Executions) != 3 || len(a.Partial) != 1 || !strings.HasPrefix(a.Partial[0], "node-2: ") {
		t.Fatalf("history answer %s: %+v, %v; want node-1's 3 records and node-2 named in partial", when, a, err)
	}
}

func equalExecutions(a, b []task.Execution) bool {
	return slices.EqualFunc(a, b, func(x, y task.Execution) bool {
		return x.TaskID == y.TaskID && x.ScheduledAt.Equal(y.ScheduledAt) && x.StartedAt.Equal(y.StartedAt) &&
			x.FinishedAt.Equal(y.FinishedAt) && x.Attempt == y.Attempt && x.Node == y.Node &&
			x.Status == y.Status && x.Error == y.Error
	})
}
