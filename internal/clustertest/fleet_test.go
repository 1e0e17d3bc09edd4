package clustertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// alertSink records the alerts nodes POST to --notify-url.
type alertSink struct {
	*httptest.Server
	mu     sync.Mutex
	alerts []alert
}

type alert struct {
	Event  string `json:"event"`
	TaskID string `json:"task_id"`
	Key    string `json:"idempotency_key"`
	Node   string `json:"node"`
}

func newAlertSink(t *testing.T) *alertSink {
	s := &alertSink{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var a alert
		if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.alerts = append(s.alerts, a)
		s.mu.Unlock()
	}))
	t.Cleanup(s.Close)
	return s
}

// of returns, per task, the events it alerted in order.
func (s *alertSink) of(event string) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, a := range s.alerts {
		if a.Event == event {
			out[a.TaskID]++
		}
	}
	return out
}

// TestFleet_ThreeNodes operates a fleet on three node processes, under the
// load of the every-second tasks, through the Go client: failing tasks
// alert once each whichever node owns them and once more on recovery, are
// found by status and in the cluster's failures with their captured
// output, are paused by label in one bulk action, and the whole fleet
// exports; every node serves the dashboard. The every-second tasks fire
// with no repeat and no miss throughout.
func TestFleet_ThreeNodes(t *testing.T) {
	t.Parallel()
	alerts := newAlertSink(t)
	var healthy atomic.Bool
	var succeeded atomic.Int64
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if healthy.Load() {
			succeeded.Add(1)
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "boom from %s", r.Header.Get("Idempotency-Key"))
	}))
	defer failing.Close()
	c := start(t, Options{Nodes: 3, Args: []string{"--notify-url", alerts.URL}})
	ctx := context.Background()
	cl := client.NewClient(c.Nodes[0].API(), "")

	var red []string
	for i := range 9 {
		id := fmt.Sprintf("red/%02d", i)
		red = append(red, id)
		if _, err := cl.PutTask(ctx, &task.Task{
			ID: id, Schedule: "* * * * * *", Labels: map[string]string{"team": "red"},
			Executor: task.Executor{Type: task.ExecutorHTTP, URL: failing.URL + "/" + id},
			Capture:  &task.Capture{MaxBytes: 256, On: task.CaptureFailure},
		}, 0); err != nil {
			t.Fatalf("put %s: %v", id, err)
		}
	}
	c.Step("put %d failing tasks labelled team=red", len(red))
	owners := map[string]bool{}
	for _, id := range red {
		etcdtest.WaitFor(t, 20*time.Second, func() bool {
			st, err := cl.GetTask(ctx, id)
			if err == nil && st.State != nil && st.State.Owner != "" {
				owners[st.State.Owner] = true
				return true
			}
			return false
		})
	}
	if len(owners) < 2 {
		t.Logf("the failing tasks landed on %d node(s) only: %v", len(owners), owners)
	}

	// One failure alert per task, not one per failed fire.
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return len(alerts.of("failure")) == len(red) })
	// Three more failed fires of each task, after their alerts.
	etcdtest.WaitFor(t, 20*time.Second, func() bool {
		fs, _, err := cl.Failures(ctx, 1000)
		return err == nil && len(fs) >= 4*len(red)
	})
	for id, n := range alerts.of("failure") {
		if n != 1 || !slices.Contains(red, id) {
			t.Errorf("task %s sent %d failure alerts, want 1 for each failing task", id, n)
		}
	}

	// Found by status across the three owners, in id order, on a full page.
	got, _, err := cl.ListTasks(ctx, client.ListOptions{Status: string(task.StatusFailing), Limit: 100})
	if err != nil {
		t.Fatalf("list failing: %v", err)
	}
	if ids := taskIDs(got); !slices.Equal(ids, red) {
		t.Errorf("status=failing listed %v, want %v", ids, red)
	}
	fs, partial, err := cl.Failures(ctx, 1000)
	if err != nil || len(partial) > 0 {
		t.Fatalf("failures: %v, partial %v", err, partial)
	}
	seen := map[string]bool{}
	for _, f := range fs {
		if !strings.HasPrefix(f.Output, "boom from "+f.TaskID+"@") {
			t.Errorf("failure of %s at %v captured %q", f.TaskID, f.ScheduledAt, f.Output)
		}
		seen[f.TaskID] = true
	}
	if len(seen) != len(red) {
		t.Errorf("the cluster's failures name %d tasks, want %d: %v", len(seen), len(red), seen)
	}

	// Recovery: one alert each.
	healthy.Store(true)
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return len(alerts.of("recovery")) == len(red) })
	after := succeeded.Load()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return succeeded.Load() >= after+int64(2*len(red)) })
	for id, n := range alerts.of("recovery") {
		if n != 1 {
			t.Errorf("task %s sent %d recovery alerts, want 1", id, n)
		}
	}
	if n := len(alerts.of("failure")); n != len(red) {
		t.Errorf("%d tasks alerted failure after the recovery, want %d", n, len(red))
	}
	alerts.mu.Lock()
	for _, a := range alerts.alerts {
		if !strings.HasPrefix(a.Key, a.TaskID+"@") || a.Node == "" {
			t.Errorf("alert %+v: want the fire's idempotency key and the owner", a)
		}
	}
	alerts.mu.Unlock()
	c.Step("one failure and one recovery alert per task")

	// Paused by label in one bulk action, seen paused by every owner.
	res, err := cl.Bulk(ctx, task.BulkPause, task.Selector{Labels: map[string]string{"team": "red"}})
	if err != nil || res.Matched != len(red) || res.Changed != len(red) {
		t.Fatalf("bulk pause team=red: %+v, %v", res, err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		got, _, err := cl.ListTasks(ctx, client.ListOptions{Status: string(task.StatusPaused), Limit: 100})
		return err == nil && slices.Equal(taskIDs(got), red)
	})
	c.Step("bulk pause by label")

	// The whole fleet exports as JSON Lines that decode as tasks.
	var buf bytes.Buffer
	if err := cl.Export(ctx, client.ListOptions{}, &buf); err != nil {
		t.Fatalf("export: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if want := len(c.Tasks) + len(red); len(lines) != want {
		t.Errorf("export wrote %d lines, want %d", len(lines), want)
	}
	for _, n := range c.Nodes {
		resp, err := http.Get(n.API() + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("<html")) {
			t.Errorf("%s's dashboard: %d, %d bytes", n.ID, resp.StatusCode, len(body))
		}
	}
	c.Check(hold)
	c.Finish()
}

func taskIDs(ts []*task.Task) []string {
	ids := make([]string, len(ts))
	for i, t := range ts {
		ids[i] = t.ID
	}
	return ids
}
