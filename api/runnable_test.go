package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// TestServer_RefusesTasksNoLiveNodeCanRun: exec tasks need a node with
// --allow-exec, handler tasks a node that registered the handler; with
// none the PUT is a 400 and nothing is written, with only some it is
// written with a warning. A handler registered after Start counts.
func TestServer_RefusesTasksNoLiveNodeCanRun(t *testing.T) {
	c := etcdtest.Start(t)
	n1 := startNode(t, c, nodeOptions{id: "plain"})
	ts := n1.ts

	execTask := `{"schedule": "@daily", "executor": {"type": "exec", "command": ["/bin/true"]}}`
	a := call(t, ts, "PUT", "/v1/tasks/e1", execTask)
	if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), "no live node runs the exec executor (of 1 live node)") ||
		!strings.Contains(string(a.body), "--allow-exec") {
		t.Fatalf("exec task on a cluster without --allow-exec: %v", a)
	}
	if a := call(t, ts, "GET", "/v1/tasks/e1", ""); a.status != http.StatusNotFound {
		t.Fatalf("a refused task was written: %v", a)
	}
	a = call(t, ts, "PUT", "/v1/tasks/h1", `{"schedule": "@daily", "executor": {"type": "handler", "name": "zz"}}`)
	if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), `no live node runs the handler \"zz\"`) {
		t.Fatalf("handler task nobody registered: %v", a)
	}
	if a := call(t, ts, "PUT", "/v1/tasks/h2", `{"schedule": "@daily", "executor": {"type": "handler", "name": "h"}}`); a.status != http.StatusOK || a.header.Get(client.WarningHeader) != "" {
		t.Fatalf("handler every node registered: %v, warning %q", a, a.header.Get(client.WarningHeader))
	}

	n2 := startNode(t, c, nodeOptions{id: "runner", allowExec: true})
	n2.e.Handle("late", func(context.Context, engine.Fire) error { return nil })
	a = call(t, ts, "PUT", "/v1/tasks/e1", execTask)
	if a.status != http.StatusOK || !strings.Contains(a.header.Get(client.WarningHeader), "only 1 of 2 live nodes run the exec executor") {
		t.Fatalf("exec task with one node of two running it: %v, warning %q", a, a.header.Get(client.WarningHeader))
	}
	a = call(t, ts, "PUT", "/v1/tasks/h3", `{"schedule": "@daily", "executor": {"type": "handler", "name": "late"}}`)
	if a.status != http.StatusOK || !strings.Contains(a.header.Get(client.WarningHeader), `only 1 of 2 live nodes run the handler "late"`) {
		t.Fatalf("handler registered after Start on one node: %v, warning %q", a, a.header.Get(client.WarningHeader))
	}

	batch := `{"id": "b1", "schedule": "@daily", "executor": {"type": "exec", "command": ["/bin/true"]}}
{"id": "b2", "schedule": "@daily", "executor": {"type": "handler", "name": "nobody"}}
{"id": "b3", "schedule": "@daily", "executor": {"type": "noop"}}
`
	a = call(t, ts, "POST", "/v1/tasks:batch", batch)
	var res client.BatchResult
	if err := json.Unmarshal(a.body, &res); err != nil || a.status != http.StatusOK {
		t.Fatalf("batch: %v (%v)", a, err)
	}
	if res.Written != 2 || len(res.Errors) != 1 || res.Errors[0].Index != 1 || !strings.Contains(res.Errors[0].Error, "nobody") ||
		len(res.Warnings) != 1 || res.Warnings[0].Index != 0 {
		t.Fatalf("batch answered %+v", res)
	}
}

func TestRunners_Check(t *testing.T) {
	rs := registry.Runners{Nodes: 3, Exec: 3, Handlers: map[string]int{"all": 3, "some": 1}}
	for _, tc := range []struct {
		ex            task.Executor
		warn, refused bool
	}{
		{task.Executor{Type: task.ExecutorNoop}, false, false},
		{task.Executor{Type: task.ExecutorExec}, false, false},
		{task.Executor{Type: task.ExecutorHandler, Name: "all"}, false, false},
		{task.Executor{Type: task.ExecutorHandler, Name: "some"}, true, false},
		{task.Executor{Type: task.ExecutorHandler, Name: "none"}, false, true},
	} {
		w, err := rs.Check(&task.Task{Executor: tc.ex})
		if (w != "") != tc.warn || (err != nil) != tc.refused {
			t.Errorf("%+v: warning %q, err %v", tc.ex, w, err)
		}
	}
	if _, err := (registry.Runners{Nodes: 2}).Check(&task.Task{Executor: task.Executor{Type: task.ExecutorExec}}); err == nil {
		t.Error("exec with no node running it was accepted")
	}
}

// TestServer_RefusesWhatAllowListsLeaveOut: with every live node's
// --exec-allow leaving a command out, or every --http-allow a host, the
// PUT is a 400 that says why and nothing is written; when only some nodes
// allow it, it is written with a warning.
func TestServer_RefusesWhatAllowListsLeaveOut(t *testing.T) {
	c := etcdtest.Start(t)
	n1 := startNode(t, c, nodeOptions{id: "strict", allowExec: true, execAllow: []string{"/opt/jobs"}, httpAllow: []string{"127.0.0.2"}})
	ts := n1.ts

	a := call(t, ts, "PUT", "/v1/tasks/e1", `{"schedule": "@daily", "executor": {"type": "exec", "command": ["/bin/sh", "-c", "id"]}}`)
	if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), `no live node may run \"/bin/sh\"`) ||
		!strings.Contains(string(a.body), "exec allow-list (/opt/jobs)") {
		t.Fatalf("exec task outside every --exec-allow: %v", a)
	}
	a = call(t, ts, "PUT", "/v1/tasks/h1", `{"schedule": "@daily", "executor": {"type": "http", "url": "http://127.0.0.1:9/"}}`)
	if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), `host \"127.0.0.1\" is outside the node's http allow-list (127.0.0.2)`) {
		t.Fatalf("http task outside every --http-allow: %v", a)
	}
	// A command of the list whose env would have it run other code.
	a = call(t, ts, "PUT", "/v1/tasks/e3", `{"schedule": "@daily", "executor": {"type": "exec", "command": ["/opt/jobs/backup"], "env": {"LD_PRELOAD": "/tmp/x.so"}}}`)
	if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), "env LD_PRELOAD can make the command run code outside the node's exec allow-list (/opt/jobs)") {
		t.Fatalf("exec task under --exec-allow with LD_PRELOAD: %v", a)
	}
	for _, id := range []string{"e1", "h1", "e3"} {
		if a := call(t, ts, "GET", "/v1/tasks/"+id, ""); a.status != http.StatusNotFound {
			t.Fatalf("a refused task was written: %v", a)
		}
	}
	// Alerts go through the http executors' client: the same allow-list.
	a = call(t, ts, "PUT", "/v1/tasks/n1", `{"schedule": "@daily", "executor": {"type": "noop"}, "notify": {"url": "http://127.0.0.1:9/alerts"}}`)
	if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), `notify.url: no live node may send alerts there`) {
		t.Fatalf("notify url outside every --http-allow: %v", a)
	}
	if a := call(t, ts, "PUT", "/v1/tasks/n2", `{"schedule": "@daily", "executor": {"type": "noop"}, "notify": {"url": "http://127.0.0.2:9/alerts"}}`); a.status != http.StatusOK {
		t.Fatalf("notify url under --http-allow: %v", a)
	}
	if a := call(t, ts, "PUT", "/v1/tasks/e2", `{"schedule": "@daily", "executor": {"type": "exec", "command": ["/opt/jobs/backup"]}}`); a.status != http.StatusOK {
		t.Fatalf("exec task under --exec-allow: %v", a)
	}

	startNode(t, c, nodeOptions{id: "open", allowExec: true})
	a = call(t, ts, "PUT", "/v1/tasks/h1", `{"schedule": "@daily", "executor": {"type": "http", "url": "http://127.0.0.1:9/"}}`)
	if a.status != http.StatusOK || !strings.Contains(a.header.Get(client.WarningHeader), "only 1 of 2 live nodes") {
		t.Fatalf("http task one node of two allows: %v, warning %q", a, a.header.Get(client.WarningHeader))
	}
	a = call(t, ts, "PUT", "/v1/tasks/e1", `{"schedule": "@daily", "executor": {"type": "exec", "command": ["/bin/sh", "-c", "id"]}}`)
	if a.status != http.StatusOK || !strings.Contains(a.header.Get(client.WarningHeader), "only 1 of 2 live nodes") {
		t.Fatalf("exec task one node of two allows: %v, warning %q", a, a.header.Get(client.WarningHeader))
	}
}
