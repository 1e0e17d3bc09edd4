package api

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// TestServer_FleetHealth runs two nodes firing every-second HTTP tasks at a
// receiver that fails some of them, and checks the fleet health answers
// from either node: the tasks' states, GET /v1/tasks?status= fanned out to
// both owners with prefix, labels and full pages through the cursor,
// GET /v1/tasks?state=1, GET /v1/failures, and a partial answer when a
// node does not answer.
func TestServer_FleetHealth(t *testing.T) {
	_, n1, n2, recv := startHealthPair(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/fail/") {
			http.Error(w, "receiver says no", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	ctx := context.Background()

	// Two failing and two healthy tasks on each node; every other one of
	// each labelled team=x.
	ids := func(prefix string) []string {
		var out []string
		on := map[bool]int{}
		for i := 0; on[true] < 2 || on[false] < 2; i++ {
			id := fmt.Sprintf("%s%02d", prefix, i)
			mine := n1.e.Owns(n1.e.Registry().Partition(id))
			if on[mine] < 2 {
				on[mine]++
				out = append(out, id)
			}
		}
		slices.Sort(out)
		return out
	}
	failing, healthy := ids("fail/"), ids("ok/")
	labelled := map[string]bool{}
	put := func(id string, i int, paused bool) {
		t.Helper()
		task := &task.Task{ID: id, Schedule: "* * * * * *", Paused: paused,
			Executor: task.Executor{Type: task.ExecutorHTTP, URL: recv.URL + "/" + id}}
		if i%2 == 0 {
			task.Labels = map[string]string{"team": "x"}
			labelled[id] = true
		}
		if _, err := n1.c.PutTask(ctx, task, 0); err != nil {
			t.Fatalf("put %s: %v", id, err)
		}
	}
	for i, id := range failing {
		put(id, i, false)
	}
	for i, id := range healthy {
		put(id, i, false)
	}
	put("paused/1", 1, true)

	list := func(cl *client.Client, opts client.ListOptions) ([]*task.Task, string) {
		t.Helper()
		tasks, next, err := cl.ListTasks(ctx, opts)
		if err != nil {
			t.Fatalf("list %+v: %v", opts, err)
		}
		return tasks, next
	}
	idsOf := func(ts []*task.Task) []string {
		out := []string{}
		for _, t := range ts {
			out = append(out, t.ID)
		}
		return out
	}
	// every follows the cursor with pages of limit, checking each page is
	// full but the last.
	every := func(cl *client.Client, opts client.ListOptions) []string {
		t.Helper()
		var out []string
		for {
			p, err := cl.ListPage(ctx, opts)
			if err != nil {
				t.Fatalf("list %+v: %v", opts, err)
			}
			if len(p.Partial) > 0 {
				t.Fatalf("list %+v: partial %q", opts, p.Partial)
			}
			page, next := p.Tasks, p.NextCursor
			out = append(out, idsOf(page)...)
			if next == "" {
				return out
			}
			if len(page) != opts.Limit || next != page[len(page)-1].ID {
				t.Fatalf("a page of %d tasks (limit %d) with cursor %q: %q", len(page), opts.Limit, next, idsOf(page))
			}
			opts.Cursor = next
		}
	}

	etcdtest.WaitFor(t, 20*time.Second, func() bool {
		got, _ := list(n1.c, client.ListOptions{Status: "failing"})
		return slices.Equal(idsOf(got), failing)
	})

	t.Run("States", func(t *testing.T) {
		got, _ := list(n2.c, client.ListOptions{Status: "failing"})
		for _, task := range got {
			st := task.State
			if st == nil || st.ConsecutiveFailures < 1 || st.LastFailureAt.IsZero() ||
				!strings.Contains(st.LastError, "500") || !st.LastSuccessAt.IsZero() {
				t.Errorf("%s: state %+v, want a failing one with its error", task.ID, st)
				continue
			}
			if want := "node-1"; !n1.e.Owns(n1.e.Registry().Partition(task.ID)) {
				if want = "node-2"; st.Owner != want {
					t.Errorf("%s: owner %q, want %s", task.ID, st.Owner, want)
				}
			} else if st.Owner != want {
				t.Errorf("%s: owner %q, want %s", task.ID, st.Owner, want)
			}
		}
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			task, err := n1.c.GetTask(ctx, healthy[0])
			return err == nil && task.State != nil && !task.State.LastSuccessAt.IsZero() && task.State.ConsecutiveFailures == 0
		})
	})

	t.Run("StatusPages", func(t *testing.T) {
		for _, cl := range []*client.Client{n1.c, n2.c} {
			if got := every(cl, client.ListOptions{Status: "failing", Limit: 1}); !slices.Equal(got, failing) {
				t.Errorf("failing, pages of 1: %q, want %q", got, failing)
			}
			if got := every(cl, client.ListOptions{Status: "failing", Limit: 3}); !slices.Equal(got, failing) {
				t.Errorf("failing, pages of 3: %q, want %q", got, failing)
			}
		}
		var withLabel []string
		for _, id := range failing {
			if labelled[id] {
				withLabel = append(withLabel, id)
			}
		}
		if got := every(n1.c, client.ListOptions{Status: "failing", Labels: map[string]string{"team": "x"}, Limit: 1}); !slices.Equal(got, withLabel) {
			t.Errorf("failing with team=x: %q, want %q", got, withLabel)
		}
		if got := every(n2.c, client.ListOptions{Status: "failing", Prefix: failing[1], Limit: 1}); !slices.Equal(got, failing[1:2]) {
			t.Errorf("failing with prefix %s: %q", failing[1], got)
		}
		if got := every(n2.c, client.ListOptions{Status: "failing", Prefix: "ok/", Limit: 1}); len(got) != 0 {
			t.Errorf("failing with prefix ok/: %q, want none", got)
		}
		if got := every(n2.c, client.ListOptions{Status: "paused", Limit: 10}); !slices.Equal(got, []string{"paused/1"}) {
			t.Errorf("paused: %q", got)
		}
		// Failing since they were created, so past two seconds: stale.
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			return slices.Equal(every(n1.c, client.ListOptions{Status: "stale", Limit: 2}), failing)
		})
	})

	t.Run("StateOfAPage", func(t *testing.T) {
		got, _ := list(n1.c, client.ListOptions{State: true})
		if len(got) != len(failing)+len(healthy)+1 {
			t.Fatalf("%d tasks, want %d", len(got), len(failing)+len(healthy)+1)
		}
		for _, task := range got {
			if task.State == nil || task.State.Owner == "" {
				t.Errorf("%s: no state", task.ID)
			} else if !task.Paused && task.State.NextFireAt.IsZero() {
				t.Errorf("%s: no next fire: %+v", task.ID, task.State)
			}
		}
		if got, _ := list(n1.c, client.ListOptions{}); got[0].State != nil {
			t.Errorf("a list without state=1 carries state %+v", got[0].State)
		}
	})

	t.Run("Failures", func(t *testing.T) {
		fs, partial, err := n2.c.Failures(ctx, 0)
		if err != nil || len(partial) > 0 {
			t.Fatalf("failures: %v, partial %q", err, partial)
		}
		nodes := map[string]bool{}
		for i, f := range fs {
			nodes[f.Node] = true
			if !slices.Contains(failing, f.TaskID) || f.Status != "failed" || !strings.Contains(f.Error, "500") {
				t.Errorf("failure %d: %+v", i, f)
			}
			if i > 0 && f.ScheduledAt.After(fs[i-1].ScheduledAt) {
				t.Errorf("failure %d at %v after failure %d at %v: want newest first", i, f.ScheduledAt, i-1, fs[i-1].ScheduledAt)
			}
		}
		if !nodes["node-1"] || !nodes["node-2"] {
			t.Errorf("failures from nodes %v, want both", nodes)
		}
		if fs, _, err := n1.c.Failures(ctx, 2); err != nil || len(fs) != 2 {
			t.Errorf("failures, limit 2: %d, %v", len(fs), err)
		}
		wantError(t, call(t, n1.ts, "GET", "/v1/failures?limit=1001", ""), http.StatusBadRequest, "limit")
	})

	t.Run("BadInput", func(t *testing.T) {
		wantError(t, call(t, n1.ts, "GET", "/v1/tasks?status=broken", ""), http.StatusBadRequest, "status", "failing, paused or stale")
		wantError(t, call(t, n1.ts, "GET", "/v1/tasks?status=failing&limit=0", ""), http.StatusBadRequest, "limit")
		wantError(t, call(t, n1.ts, "GET", "/v1/tasks?state=maybe", ""), http.StatusBadRequest, "state")
		wantError(t, call(t, n1.ts, "GET", "/v1/tasks?status=failing&cursor=%01", ""), http.StatusBadRequest, "cursor")
	})

	t.Run("Partial", func(t *testing.T) {
		n2.hang.Store(true)
		defer n2.hang.Store(false)
		var mine []string
		for _, id := range failing {
			if n1.e.Owns(n1.e.Registry().Partition(id)) {
				mine = append(mine, id)
			}
		}
		a := call(t, n1.ts, "GET", "/v1/tasks?status=failing", "")
		if a.status != http.StatusOK || !strings.Contains(string(a.body), `"partial":["node-2: `) ||
			!strings.Contains(string(a.body), "were held by no node that answered") {
			t.Fatalf("with node-2 not answering: %v", a)
		}
		// As ranges, as the logs give them: node-2's hundreds of partitions
		// were a list of numbers, a screenful in task list's warning.
		if !regexp.MustCompile(`"partitions [0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)* were held by no node`).Match(a.body) {
			t.Errorf("the partitions no node held, not as ranges: %s", a.body)
		}
		uncovered := uncoveredIn(string(a.body))
		for _, id := range failing {
			if p := n1.e.Registry().Partition(id); !slices.Contains(mine, id) && !uncovered[p] {
				t.Errorf("%s is node-2's, but its partition %d is not among those the answer says no node held: %s", id, p, a.body)
			}
		}
		for _, id := range failing {
			if in := strings.Contains(string(a.body), `"id":"`+id+`"`); in != slices.Contains(mine, id) {
				t.Errorf("%s listed: %v, want only node-1's tasks: %s", id, in, a.body)
			}
		}
	})
}

func TestMergeStatus(t *testing.T) {
	ans := func(more bool, ids ...string) client.StatusAnswer {
		a := client.StatusAnswer{More: more, Tasks: []task.Match{}}
		for _, id := range ids {
			a.Tasks = append(a.Tasks, task.Match{ID: id})
		}
		return a
	}
	tests := []struct {
		name      string
		answers   []client.StatusAnswer
		want      []string
		wantBound string
		wantMore  bool
	}{
		{"none", []client.StatusAnswer{ans(false), ans(false)}, nil, "", false},
		{"all", []client.StatusAnswer{ans(false, "b", "d"), ans(false, "a", "c")}, []string{"a", "b", "c", "d"}, "", false},
		// node 1 may hold c, which comes before node 2's d: d waits.
		{"bounded", []client.StatusAnswer{ans(true, "a", "b"), ans(false, "d")}, []string{"a", "b"}, "b", true},
		{"smallest bound", []client.StatusAnswer{ans(true, "a", "e"), ans(true, "b", "c"), ans(false, "d")}, []string{"a", "b", "c"}, "c", true},
		{"seen twice", []client.StatusAnswer{ans(false, "a", "b"), ans(false, "b")}, []string{"a", "b"}, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms, bound, more := mergeStatus(tt.answers)
			var got []string
			for _, m := range ms {
				got = append(got, m.ID)
			}
			if !slices.Equal(got, tt.want) || bound != tt.wantBound || more != tt.wantMore {
				t.Errorf("got %q, bound %q, more %v; want %q, %q, %v", got, bound, more, tt.want, tt.wantBound, tt.wantMore)
			}
		})
	}
}

func TestUncovered(t *testing.T) {
	answers := []client.StatusAnswer{{Held: []int{0, 2}}, {Held: []int{3, 9}}}
	if got := uncovered(answers, 5); !slices.Equal(got, []int{1, 4}) {
		t.Errorf("uncovered: %v, want [1 4]", got)
	}
	if got := uncovered(append(answers, client.StatusAnswer{Held: []int{1, 4}}), 5); got != nil {
		t.Errorf("uncovered with every partition held: %v", got)
	}
}

// TestServer_StatusListDuringHandOver pages through the failing tasks of
// two nodes while a third joins and partitions move: no task comes twice
// or out of id order across the pages, none is missing unless a page
// said its partition may be, and once the cluster has settled
// every node lists every failing task again, those that moved too: their
// health went with their partitions' checkpoints (the tasks fire once a
// year, so no new failure tells the new owner).
func TestServer_StatusListDuringHandOver(t *testing.T) {
	c, n1, n2, recv := startHealthPair(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	})
	ctx := context.Background()
	var failing []string
	for i := range 24 {
		id := fmt.Sprintf("hand/%02d", i)
		failing = append(failing, id)
		task := &task.Task{ID: id, Schedule: "0 0 0 1 1 *",
			Executor: task.Executor{Type: task.ExecutorHTTP, URL: recv.URL + "/" + id}}
		if _, err := n1.c.PutTask(ctx, task, 0); err != nil {
			t.Fatal(err)
		}
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		tasks, _, err := n1.c.ListTasks(ctx, client.ListOptions{Prefix: "hand/", State: true})
		for _, task := range tasks {
			if task.State == nil {
				return false
			}
		}
		return err == nil && len(tasks) == len(failing)
	})
	if _, err := n1.e.Registry().Bulk(ctx, task.BulkTrigger, task.Selector{Prefix: "hand/"}); err != nil {
		t.Fatal(err)
	}
	complete := func(n *testNode) bool {
		tasks, _, err := n.c.ListTasks(ctx, client.ListOptions{Status: "failing"})
		return err == nil && len(tasks) == len(failing)
	}
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return complete(n1) })

	var n3 *testNode
	seen := map[string]bool{}
	last := ""
	uncoveredP := map[int]bool{} // partitions a page said it may miss
	opts := client.ListOptions{Status: "failing", Limit: 2}
	for page := 0; ; page++ {
		if page == 3 {
			n3 = startNode(t, c, nodeOptions{id: "node-3"})
		}
		p, err := n1.c.ListPage(ctx, opts)
		if err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		for _, m := range p.Partial {
			maps.Copy(uncoveredP, uncoveredIn(m))
		}
		for _, task := range p.Tasks {
			if seen[task.ID] || task.ID <= last {
				t.Errorf("page %d: %s again or out of order (last %s)", page, task.ID, last)
			}
			seen[task.ID], last = true, task.ID
		}
		if p.NextCursor == "" {
			break
		}
		opts.Cursor = p.NextCursor
	}
	// A task may be missing only when a page said its partition was.
	for _, id := range failing {
		if p := n1.e.Registry().Partition(id); !seen[id] && !uncoveredP[p] {
			t.Errorf("%s (partition %d) missing from the pages, none of which said its partition may be", id, p)
		}
	}
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return settled(n1, n2, n3) })
	for _, n := range []*testNode{n1, n2, n3} {
		etcdtest.WaitFor(t, 20*time.Second, func() bool { return complete(n) })
	}
	tasks, _, err := n3.c.ListTasks(ctx, client.ListOptions{Status: "failing"})
	if err != nil {
		t.Fatal(err)
	}
	moved := 0
	for _, task := range tasks {
		if task.State.Owner == "node-3" {
			moved++
			if task.State.ConsecutiveFailures != 1 || task.State.LastFailureAt.IsZero() || !strings.Contains(task.State.LastError, "503") {
				t.Errorf("%s moved to node-3 with state %+v", task.ID, task.State)
			}
		}
	}
	if moved == 0 {
		t.Fatal("no failing task moved to node-3: the test shows nothing")
	}
}

// uncoveredIn returns the partitions a partial answer's message m says no
// node held, given as ring.Ranges gives them ("2-3,5").
func uncoveredIn(m string) map[int]bool {
	out := map[int]bool{}
	for _, ps := range uncoveredRE.FindAllStringSubmatch(m, -1) {
		for _, r := range strings.Split(ps[1], ",") {
			lo, hi, _ := strings.Cut(r, "-")
			if hi == "" {
				hi = lo
			}
			a, _ := strconv.Atoi(lo)
			b, _ := strconv.Atoi(hi)
			for p := a; p <= b; p++ {
				out[p] = true
			}
		}
	}
	return out
}

var uncoveredRE = regexp.MustCompile(`partitions ([0-9,-]+) were held by no node`)

// startHealthPair starts two settled nodes and a receiver of their HTTP
// tasks that answers with h.
func startHealthPair(t *testing.T, h http.HandlerFunc) (*etcdtest.Cluster, *testNode, *testNode, *httptest.Server) {
	t.Helper()
	c := etcdtest.Start(t)
	n1 := startNode(t, c, nodeOptions{id: "node-1"})
	n2 := startNode(t, c, nodeOptions{id: "node-2"})
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return settled(n1, n2) })
	recv := httptest.NewServer(h)
	t.Cleanup(recv.Close)
	return c, n1, n2, recv
}
