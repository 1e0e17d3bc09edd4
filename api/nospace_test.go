package api

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/registry"
)

// TestServer_NoSpace: while etcd's NOSPACE alarm is raised, every write
// route answers 503 with a message that says what happened and what to
// do (never a 500), reads and deletes answer as usual, and writes succeed
// again once the alarm is disarmed.
func TestServer_NoSpace(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	ts := n.ts
	json := []string{"Content-Type", "application/json"}
	for _, id := range []string{"kept", "deleted"} {
		if a := call(t, ts, "PUT", "/v1/tasks/"+id, noopJSON(""), json...); a.status != http.StatusOK {
			t.Fatalf("PUT before the alarm: %v", a)
		}
	}

	every := handlerTask("every", "* * * * * *")
	if _, err := n.e.Registry().Put(context.Background(), every, registry.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return call(t, ts, "GET", "/v1/tasks/kept/state", "").status == http.StatusOK && n.fires.count() >= 1
	})
	noSpace := func(want string) func() bool {
		return func() bool {
			return strings.Contains(string(call(t, ts, "GET", "/metrics", "").body), "\nshardcron_etcd_no_space "+want+"\n")
		}
	}
	if !noSpace("0")() {
		t.Error("shardcron_etcd_no_space is not 0 before the alarm")
	}
	c.RaiseNoSpace(t)
	// The node finds the alarm at its next watermark write, a tenth of a
	// second away.
	etcdtest.WaitFor(t, 10*time.Second, noSpace("1"))
	writes := []struct{ method, path, body string }{
		{"PUT", "/v1/tasks/refused", noopJSON("")},
		{"PUT", "/v1/tasks/kept", `{"schedule": "0 0 2 1 *", "executor": {"type": "noop"}}`},
		{"POST", "/v1/tasks/kept/pause", ""},
		{"POST", "/v1/tasks/kept/trigger", ""},
		{"POST", "/v1/tasks:batch", "[" + noopJSON("batch-1") + "]"},
		{"POST", "/v1/tasks:pause", `{"all": true}`},
	}
	for _, w := range writes {
		a := call(t, ts, w.method, w.path, w.body, json...)
		wantError(t, a, http.StatusServiceUnavailable, "etcd is out of space", "NOSPACE", "etcdctl alarm disarm",
			"database space exceeded")
	}
	for _, path := range []string{"/v1/tasks/kept", "/v1/tasks", "/v1/tasks/kept/state", "/v1/nodes", "/healthz"} {
		if a := call(t, ts, "GET", path, ""); a.status != http.StatusOK {
			t.Errorf("GET %s under NOSPACE: %v", path, a)
		}
	}
	// etcd takes deletes under the alarm: they are how space is freed.
	if a := call(t, ts, "DELETE", "/v1/tasks/deleted", ""); a.status != http.StatusNoContent {
		t.Errorf("DELETE under NOSPACE: %v", a)
	}
	if a := call(t, ts, "GET", "/v1/tasks/refused", ""); a.status != http.StatusNotFound {
		t.Errorf("a refused PUT left a task: %v", a)
	}

	c.ClearNoSpace(t)
	// The alarm is disarmed on every member before ClearNoSpace returns;
	// the first write may still race the members applying it.
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return call(t, ts, "PUT", "/v1/tasks/after", noopJSON(""), json...).status == http.StatusOK
	})
	// Nothing is stranded: the node, which fired on unrecorded while the
	// alarm lasted, still fires once it records its watermark again.
	after := time.Now()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return n.fires.firedAfter("every", after) })
	etcdtest.WaitFor(t, 10*time.Second, noSpace("0"))
	if a := call(t, ts, "GET", "/v1/tasks/kept", ""); a.status != http.StatusOK || !strings.Contains(string(a.body), `"schedule":"0 0 1 1 *","timezone"`) ||
		strings.Contains(string(a.body), `"paused":true`) {
		t.Errorf("the task changed under NOSPACE: %v", a)
	}
}
