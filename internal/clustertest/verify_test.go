package clustertest

import (
	"testing"
	"time"
)

func TestVerify(t *testing.T) {
	t0 := time.Unix(1000, 0)
	call := func(node string) Call { return Call{Node: node, Arrived: t0} }
	key := func(task string, sec int64) FireKey { return FireKey{Task: task, At: sec * 1000} }
	kill := Fault{Node: "n2", Kind: FaultKill, At: time.Unix(1005, 300_000_000)}
	tests := []struct {
		name                  string
		calls                 map[FireKey][]Call
		faults                []Fault
		dups, repeats, missed int
	}{
		{"each once", map[FireKey][]Call{key("a", 1001): {call("n1")}, key("a", 1002): {call("n2")}}, nil, 0, 0, 0},
		{"a miss", map[FireKey][]Call{key("a", 1001): {call("n1")}}, nil, 0, 0, 1},
		{"twice without a fault", map[FireKey][]Call{key("a", 1001): {call("n1"), call("n2")}, key("a", 1002): {call("n1")}}, nil, 1, 0, 0},
		{"twice on one node without a fault", map[FireKey][]Call{key("a", 1001): {call("n1"), call("n1")}, key("a", 1002): {call("n1")}}, nil, 1, 0, 0},
		{
			// n2 last fired 1005 before it was killed: 1004 and 1005 may
			// repeat once, 1003 may not, nor a third call.
			"repeats within the lead of a kill",
			map[FireKey][]Call{
				key("a", 1003): {call("n2"), call("n1")},
				key("a", 1004): {call("n2"), call("n1")},
				key("a", 1005): {call("n2"), call("n2")},
				key("a", 1006): {call("n1")},
				key("b", 1003): {call("n3")},
				key("b", 1004): {call("n3")},
				key("b", 1005): {call("n2"), call("n1"), call("n3")},
				key("b", 1006): {call("n1"), call("n3")},
			},
			[]Fault{kill}, 3, 2, 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			from, to := int64(1001), int64(1002)
			tasks := []string{"a"}
			if tt.faults != nil {
				from, to, tasks = 1003, 1006, []string{"a", "b"}
			}
			r := Verify(tt.calls, Window{Tasks: tasks, From: from, To: to, Lead: time.Second, Faults: tt.faults})
			if len(r.Duplicates) != tt.dups || len(r.Repeats) != tt.repeats || len(r.Missed) != tt.missed {
				t.Fatalf("duplicates %d, repeats %d, missed %d; want %d, %d, %d\n%s",
					len(r.Duplicates), len(r.Repeats), len(r.Missed), tt.dups, tt.repeats, tt.missed, r.Format(t0))
			}
		})
	}
}

// A node behind its schedule when it is cut off, and back at once with a
// new session, fires later seconds on its new locks: its faulted session's
// last fire, which the lead counts from, is the latest of its calls with a
// fence of that session. Here n2 had fired 1003 (fence 50) when it was cut
// off at revision 100; n1 repeats 1003 after it, and n2's new session
// (fence 200) fires 1004 to 1006. Counted from 1006, the repeat was a
// duplicate.
func TestVerify_LeadCountsFromTheFaultedSessionsLastFire(t *testing.T) {
	t0 := time.Unix(1000, 0)
	key := func(sec int64) FireKey { return FireKey{Task: "a", At: sec * 1000} }
	calls := map[FireKey][]Call{
		key(1003): {{Node: "n2", Fence: 50}, {Node: "n1", Fence: 150}},
		key(1004): {{Node: "n2", Fence: 200}},
		key(1005): {{Node: "n2", Fence: 200}},
		key(1006): {{Node: "n2", Fence: 200}},
	}
	cut := Fault{Node: "n2", Kind: FaultCut, At: time.Unix(1005, 0), Post: time.Second, Rev: 100}
	r := Verify(calls, Window{Tasks: []string{"a"}, From: 1003, To: 1006, Lead: time.Second, Faults: []Fault{cut}})
	if len(r.Duplicates) != 0 || len(r.Repeats) != 1 {
		t.Errorf("duplicates %d, repeats %d; want 0, 1\n%s", len(r.Duplicates), len(r.Repeats), r.Format(t0))
	}
}

// Nodes of parallel tests never get the same port: one of them would fail
// to bind it (seen as "bind: address already in use" at start). Drawn at
// random from 12 000 ports, 600 draws repeat one almost surely.
func TestReservePort_NeverTwice(t *testing.T) {
	seen := map[string]bool{}
	for range 600 {
		addr := reservePort(t)
		if seen[addr] {
			t.Fatalf("%s reserved twice", addr)
		}
		seen[addr] = true
	}
}

// TestFolds: missed fires followed by a later fire of their task are folds
// (closed by that fire, counted by its node); those after which the task
// never fired again are tails.
func TestFolds(t *testing.T) {
	key := func(task string, sec int64) FireKey { return FireKey{Task: task, At: sec * 1000} }
	calls := map[FireKey][]Call{
		key("a", 1000): {{Node: "n1"}}, key("a", 1004): {{Node: "n1", Arrived: time.Unix(1031, 0)}}, key("a", 1006): {{Node: "n2"}},
		key("b", 1000): {{Node: "n1"}},
	}
	// a's first run as a later window sees it: from 1002 (1001 was missed
	// before), so its fold began at 1001 all the same.
	missed := []FireKey{key("a", 1002), key("a", 1003), key("a", 1005), key("b", 1001), key("b", 1002)}
	folds, tails := Folds(calls, missed)
	if len(folds) != 2 || len(folds[0].Missed) != 2 || folds[0].Next != key("a", 1004) || folds[0].By != "n1" ||
		len(folds[1].Missed) != 1 || folds[1].Next != key("a", 1006) || folds[1].By != "n2" ||
		folds[0].Late != 30*time.Second {
		t.Errorf("folds %+v", folds)
	}
	if len(tails) != 2 || tails[0] != key("b", 1001) || tails[1] != key("b", 1002) {
		t.Errorf("tails %v", tails)
	}
}
