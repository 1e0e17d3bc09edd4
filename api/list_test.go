package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// decodedPage is the answer of GET /v1/tasks without state as it was
// written before pages passed stored tasks through: the registry's
// decoded tasks, encoded one by one.
func decodedPage(t *testing.T, tasks []*task.Task, next string) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	buf.WriteString(`{"tasks":[`)
	for i, tsk := range tasks {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := enc.Encode(tsk); err != nil {
			t.Fatal(err)
		}
	}
	cur, _ := json.Marshal(next)
	buf.WriteString(`],"next_cursor":` + string(cur) + "}\n")
	return buf.Bytes()
}

// TestServer_ListPassesStoredTasksThrough: a page without state is each
// task's stored JSON with its partition and version added: for tasks as
// the registry stores them, byte for byte the answer that decoding and
// encoding the tasks gave, page after page in the same order; for one
// rewritten by hand (spaces, its fields in another order, defaults left
// out), JSON that reads as the same tasks. A stored value that is not a
// JSON object, or that holds a field only responses write, fails the page
// instead of reaching it.
func TestServer_ListPassesStoredTasksThrough(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	ctx := context.Background()
	reg := n.e.Registry()
	bodies := [][2]string{ // in order: a/2 chains to a/1
		{"a/1", `{"schedule":"* * * * *","executor":{"type":"noop"}}`},
		{"a/2", `{"schedule":"*/5 * * * * *","timezone":"Europe/Paris","executor":{"type":"handler","name":"h",` +
			`"payload":{"k": ["v<&>", 1.5e3, null]}},"labels":{"team":"pay","env":"prod"},"retry":{"max_attempts":3,"backoff":"2s"},` +
			`"jitter":"1s","not_after":"2099-01-01T00:00:00+02:00","max_fires":5,"on_failure":["a/1"]}`},
		{"a/3", `{"schedule":"@every 1h","executor":{"type":"noop"},"history_limit":{"failures":3},"pause_on_failure":2,` +
			`"notify":{"on":["failure"],"url":"http://127.0.0.1:9/n"},"capture":{"max_bytes":100,"on":"always"}}`},
		{"a/4", `{"schedule":"0 0 1 1 *","executor":{"type":"noop"},"labels":{"note":"\"quoted\" back\\slash é \u2028"}}`},
		{"a/5", `{"schedule":"* * * * *","executor":{"type":"noop"}}`},
	}
	for _, b := range bodies {
		id, body := b[0], b[1]
		if a := call(t, n.ts, "PUT", "/v1/tasks/"+url.PathEscape(id), body); a.status != http.StatusOK {
			t.Fatalf("put %s: %s", id, a)
		}
	}
	if a := call(t, n.ts, "POST", "/v1/tasks/a%2F5/pause", `{"note":"by hand"}`); a.status != http.StatusOK {
		t.Fatalf("pause: %s", a)
	}
	// pages compares every page of each query with the registry's List:
	// byte for byte, or as the tasks they read as.
	pages := func(byteForByte bool) {
		t.Helper()
		for _, q := range []registry.ListOptions{{Limit: 2}, {Limit: 1000}, {Prefix: "a/", Limit: 3}, {Labels: map[string]string{"team": "pay"}}} {
			for page := 0; ; page++ {
				want, next, err := reg.List(ctx, q)
				if err != nil {
					t.Fatal(err)
				}
				v := url.Values{"cursor": {q.Cursor}, "prefix": {q.Prefix}}
				if q.Limit > 0 {
					v.Set("limit", fmt.Sprint(q.Limit))
				}
				for k, val := range q.Labels {
					v.Add("label", k+"="+val)
				}
				a := call(t, n.ts, "GET", "/v1/tasks?"+v.Encode(), "")
				if a.status != http.StatusOK {
					t.Fatalf("%+v: %s", q, a)
				}
				w := decodedPage(t, want, next)
				if byteForByte && !bytes.Equal(a.body, w) {
					t.Fatalf("%+v, page %d:\n got %s\nwant %s", q, page, a.body, w)
				}
				var got, wantPage client.ListResponse
				if err := json.Unmarshal(a.body, &got); err != nil || json.Unmarshal(w, &wantPage) != nil || !reflect.DeepEqual(got, wantPage) {
					t.Fatalf("%+v, page %d (%v):\n got %s\nwant %s", q, page, err, a.body, w)
				}
				if next == "" {
					break
				}
				q.Cursor = next
			}
		}
	}
	pages(true)

	taskKey := fmt.Sprintf("%s/tasks/%05d/a/3", membership.DefaultPrefix, reg.Partition("a/3"))
	if _, err := c.Client.Put(ctx, taskKey, `{ "schedule": "@every 1h", "id": "a/3", "executor": {"type": "noop"},
		"labels": {"z": "1", "a": "2"}, "paused": false }`); err != nil {
		t.Fatal(err)
	}
	pages(false)

	for _, corrupt := range []string{`{"id":"a/3","schedule":"@every 1h"`, `{"id":"a/3","schedule":"@every 1h","state":{}}`} {
		if _, err := c.Client.Put(ctx, taskKey, corrupt); err != nil {
			t.Fatal(err)
		}
		wantError(t, call(t, n.ts, "GET", "/v1/tasks?prefix=a/3", ""), http.StatusInternalServerError, "a/3", "corrupt")
	}
}

// writeCounter is a ResponseWriter that keeps the size of every write.
type writeCounter struct {
	header http.Header
	status int
	body   bytes.Buffer
	writes []int
}

func (w *writeCounter) Header() http.Header { return w.header }
func (w *writeCounter) WriteHeader(s int)   { w.status = s }
func (w *writeCounter) Write(b []byte) (int, error) {
	w.writes = append(w.writes, len(b))
	return w.body.Write(b)
}

// TestServer_ListStreamsThePage: a page is written in pieces of about
// streamChunk bytes as its tasks are read, never built whole, and the
// pieces make the page.
func TestServer_ListStreamsThePage(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	ctx := context.Background()
	reg := n.e.Registry()
	var batch []*task.Task
	for i := range 600 {
		batch = append(batch, &task.Task{ID: fmt.Sprintf("s/%04d", i), Schedule: "0 0 1 1 *",
			Executor: task.Executor{Type: task.ExecutorNoop}, Labels: map[string]string{"team": "streaming", "pad": fmt.Sprintf("%0200d", i)}})
	}
	if res, err := reg.PutBatch(ctx, batch); err != nil || len(res.Errors) > 0 {
		t.Fatalf("put: %v %v", err, res.Errors)
	}
	want, next, err := reg.List(ctx, registry.ListOptions{Limit: 10000})
	if err != nil || len(want) != 600 {
		t.Fatalf("list: %d tasks, %v", len(want), err)
	}
	w := &writeCounter{header: http.Header{}}
	req, _ := http.NewRequestWithContext(ctx, "GET", "/v1/tasks?limit=10000", nil)
	n.srv.Handler().ServeHTTP(w, req)
	if w.status != http.StatusOK || !bytes.Equal(w.body.Bytes(), decodedPage(t, want, next)) {
		t.Fatalf("status %d, body %.300s", w.status, w.body.Bytes())
	}
	if len(w.writes) < w.body.Len()/streamChunk {
		t.Fatalf("%d bytes in %d writes: the page was built whole", w.body.Len(), len(w.writes))
	}
	for _, size := range w.writes {
		if size > streamChunk+task.MaxTaskSize {
			t.Fatalf("a write of %d bytes: more than a chunk", size)
		}
	}
}

// TestServer_ListPagesUnusualIDs: ids with bytes that a URL, a query or
// an index key treat specially ('/', '%', '?', '#', '&', '+', ';', '=',
// spaces, characters beyond ASCII), ids that are prefixes of others and
// ids around a cursor page through GET /v1/tasks in id order, each once,
// by prefix and by label, the status filter included; and a bad state
// flag is refused with a status as without one.
func TestServer_ListPagesUnusualIDs(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	ctx := context.Background()
	ids := []string{"u", "u ", "u%", "u%2F", "u&v=w", "u+v", "u/", "u/.", "u/..", "u/a", "u/a/b", "u;v", "u=v", "u?v#w", "u~", "u\u00a0", "u\u00e9", "u\U0010FFFF"}
	for _, id := range ids {
		tsk := &task.Task{ID: id, Schedule: "0 0 1 1 *", Executor: task.Executor{Type: task.ExecutorNoop},
			Paused: true, Labels: map[string]string{"odd": "a=b/c%d"}}
		if _, err := n.c.PutTask(ctx, tsk, 0); err != nil {
			t.Fatalf("put %q: %v", id, err)
		}
	}
	slices.Sort(ids)
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		p, err := n.c.ListPage(ctx, client.ListOptions{Status: "paused", Limit: 100})
		return err == nil && len(p.Tasks) == len(ids)
	})
	for _, opts := range []client.ListOptions{
		{Prefix: "u"}, {Prefix: "u/"}, {Prefix: "u/a"}, {Labels: map[string]string{"odd": "a=b/c%d"}},
		{Status: "paused"}, {Status: "paused", Prefix: "u/", Labels: map[string]string{"odd": "a=b/c%d"}},
	} {
		var want []string
		for _, id := range ids {
			if strings.HasPrefix(id, opts.Prefix) {
				want = append(want, id)
			}
		}
		for _, limit := range []int{1, 2, 1000} {
			opts := opts
			opts.Limit = limit
			var got []string
			for page := 0; ; page++ {
				p, err := n.c.ListPage(ctx, opts)
				if err != nil {
					t.Fatalf("%+v: %v", opts, err)
				}
				if p.NextCursor != "" && (len(p.Tasks) != limit || p.NextCursor != p.Tasks[len(p.Tasks)-1].ID) {
					t.Fatalf("%+v, page %d: %d tasks, cursor %q", opts, page, len(p.Tasks), p.NextCursor)
				}
				for _, tsk := range p.Tasks {
					got = append(got, tsk.ID)
				}
				if p.NextCursor == "" {
					break
				}
				opts.Cursor = p.NextCursor
			}
			if !slices.Equal(got, want) {
				t.Errorf("%+v: %q, want %q", opts, got, want)
			}
		}
	}
	for _, q := range []string{"/v1/tasks?state=maybe", "/v1/tasks?status=paused&state=maybe"} {
		wantError(t, call(t, n.ts, "GET", q, ""), http.StatusBadRequest, "state")
	}
}
