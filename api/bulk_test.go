package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// TestServer_Bulk: POST /v1/tasks:<action> by selector through the HTTP
// API: bad selectors are 400 and change nothing, a dry run counts, a
// pause by label pauses exactly those tasks, a trigger by prefix fires
// them.
func TestServer_Bulk(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	ctx := context.Background()
	batch := `{"id":"bulk/a","schedule":"@yearly","executor":{"type":"handler","name":"h"},"labels":{"team":"billing"}}
{"id":"bulk/b","schedule":"@yearly","executor":{"type":"noop"},"labels":{"team":"billing"}}
{"id":"bulk/c","schedule":"@yearly","executor":{"type":"noop"},"labels":{"team":"ads"}}
{"id":"other","schedule":"@yearly","executor":{"type":"noop"},"labels":{"team":"billing"}}`
	if res, err := n.c.PutBatch(ctx, []byte(batch)); err != nil || len(res.Errors) > 0 {
		t.Fatalf("batch: %v %+v", err, res)
	}

	for _, tc := range []struct{ name, path, body, want string }{
		{"empty body", "/v1/tasks:pause", "", "body is empty"},
		{"empty selector", "/v1/tasks:delete", `{}`, "selector:"},
		{"misspelt field", "/v1/tasks:delete", `{"prefix":"bulk/","lables":{"team":"ads"}}`, "lables"},
		{"all and prefix", "/v1/tasks:delete", `{"all":true,"prefix":"bulk/"}`, `"all"`},
		{"two values", "/v1/tasks:pause", `{"all":true} {"all":true}`, "after top-level value"},
		{"a field twice", "/v1/tasks:delete", `{"prefix":"bulk/","dry_run":true,"dry_run":false}`, "dry_run: given twice"},
		{"a note not a pause's", "/v1/tasks:delete", `{"prefix":"bulk/","note":"x"}`, "note: only a pause takes a note"},
		{"a note too long", "/v1/tasks:pause", `{"prefix":"bulk/","note":"` + strings.Repeat("x", 1025) + `"}`, "note: 1025 bytes, more than the limit of 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, call(t, n.ts, "POST", tc.path, tc.body), http.StatusBadRequest, tc.want)
		})
	}
	if tasks, _, _ := n.c.ListTasks(ctx, client.ListOptions{}); len(tasks) != 4 {
		t.Fatalf("refused bulk actions left %d tasks, want 4", len(tasks))
	}

	a := call(t, n.ts, "POST", "/v1/tasks:pause", `{"labels":{"team":"billing"},"prefix":"bulk/","dry_run":true}`)
	var res task.BulkResult
	if a.status != http.StatusOK || json.Unmarshal(a.body, &res) != nil {
		t.Fatalf("dry run: %v", a)
	}
	if res.Matched != 2 || res.Changed != 2 || !res.DryRun || res.Action != task.BulkPause {
		t.Fatalf("dry run: %+v", res)
	}
	if got, _ := n.c.GetTask(ctx, "bulk/a"); got.Paused {
		t.Fatal("a dry run paused bulk/a")
	}

	// A pause by selector records who paused each task it pauses, and
	// when, with its note; a task paused already keeps its own record.
	if _, err := n.c.PauseWithNote(ctx, "bulk/b", "by hand"); err != nil {
		t.Fatal(err)
	}
	before := time.Now().Add(-time.Second)
	got, err := n.c.Bulk(ctx, task.BulkPause, task.Selector{Prefix: "bulk/", Labels: map[string]string{"team": "billing"}, Note: "INC-9"})
	if err != nil || got.Changed != 1 || got.Unchanged != 1 {
		t.Fatalf("pause: %+v %v; want 1 changed, 1 paused already", got, err)
	}
	for id, want := range map[string]bool{"bulk/a": true, "bulk/b": true, "bulk/c": false, "other": false} {
		if task, err := n.c.GetTask(ctx, id); err != nil || task.Paused != want {
			t.Fatalf("%s: paused %v (err %v), want %v", id, task.Paused, err, want)
		}
	}
	for id, note := range map[string]string{"bulk/a": "INC-9", "bulk/b": "by hand"} {
		got, _ := n.c.GetTask(ctx, id)
		if p := got.Pause; p == nil || p.Note != note || p.By != "anonymous" || p.At.Before(before) || got.State == nil || got.State.Pause == nil {
			t.Errorf("%s: pause record %+v (in its state: %v); want anonymous's, at or after %s, note %q", id, p, got.State != nil && got.State.Pause != nil, before.Format(time.RFC3339), note)
		}
	}

	got, err = n.c.Bulk(ctx, task.BulkTrigger, task.Selector{Prefix: "bulk/a"})
	if err != nil || got.Changed != 1 {
		t.Fatalf("trigger: %+v %v", got, err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		n.fires.mu.Lock()
		defer n.fires.mu.Unlock()
		return len(n.fires.fires) == 1 && n.fires.fires[0].TaskID == "bulk/a"
	})

	got, err = n.c.Bulk(ctx, task.BulkDelete, task.Selector{Labels: map[string]string{"team": "billing"}})
	if err != nil || got.Changed != 3 {
		t.Fatalf("delete: %+v %v", got, err)
	}
	if tasks, _, _ := n.c.ListTasks(ctx, client.ListOptions{}); len(tasks) != 1 || tasks[0].ID != "bulk/c" {
		t.Fatalf("after deleting billing: %d tasks, want bulk/c alone", len(tasks))
	}
}
