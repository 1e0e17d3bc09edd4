package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/logbuf"
	"github.com/shardcron/shardcron/task"
)

// noopJSON is a valid task body that fires once a year.
func noopJSON(id string) string {
	idField := ""
	if id != "" {
		idField = fmt.Sprintf(`"id": %q, `, id)
	}
	return `{` + idField + `"schedule": "0 0 1 1 *", "executor": {"type": "noop"}}`
}

func decodeTask(t *testing.T, a answer) *task.Task {
	t.Helper()
	var tsk task.Task
	if err := json.Unmarshal(a.body, &tsk); err != nil {
		t.Fatalf("decode task %s: %v", a.body, err)
	}
	return &tsk
}

// TestServer_SingleNode exercises every endpoint of one node; the node is
// shared by the subtests, which run in order.
func TestServer_SingleNode(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	ts := n.ts
	ctx := context.Background()

	t.Run("PutGet", func(t *testing.T) {
		body := `{"schedule": "0 0 1 1 *", "executor": {"type": "noop"}, "labels": {"team": "billing"}}`
		a := call(t, ts, "PUT", "/v1/tasks/billing%2Finvoice-42", body, "Content-Type", "application/json")
		if a.status != http.StatusOK {
			t.Fatalf("PUT: %v", a)
		}
		put := decodeTask(t, a)
		if put.ID != "billing/invoice-42" || put.Version <= 0 || put.Partition == nil || put.CreatedAt.IsZero() ||
			put.Labels["team"] != "billing" || put.Timeout != task.Duration(time.Minute) {
			t.Fatalf("PUT answered %+v", put)
		}
		if got, want := a.header.Get("ETag"), strconv.Quote(strconv.FormatInt(put.Version, 10)); got != want {
			t.Fatalf("ETag %q, want %q", got, want)
		}
		// The owner (this node) loads the task from its watch; the state
		// appears once it has.
		var got *task.Task
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			a := call(t, ts, "GET", "/v1/tasks/billing%2Finvoice-42", "")
			if a.status != http.StatusOK {
				t.Fatalf("GET: %v", a)
			}
			got = decodeTask(t, a)
			return got.State != nil
		})
		if got.Version != put.Version || got.State.Owner != "node-1" || got.State.NextFireAt.IsZero() {
			t.Fatalf("GET answered %+v, state %+v", got, got.State)
		}
	})

	// A body is read as JSON whatever its Content-Type, as docs/api.md
	// says: curl -d sends a task as a form, and a batch's form is told by
	// its first character.
	t.Run("AnyContentType", func(t *testing.T) {
		for _, ct := range []string{"application/x-www-form-urlencoded", "text/plain", "application/octet-stream"} {
			if a := call(t, ts, "PUT", "/v1/tasks/ct-1", noopJSON(""), "Content-Type", ct); a.status != http.StatusOK {
				t.Fatalf("PUT of %s: %v", ct, a)
			}
		}
		for body, ct := range map[string]string{
			noopJSON("ct-2") + "\n" + noopJSON("ct-3") + "\n":     "application/json",
			"[" + noopJSON("ct-4") + "," + noopJSON("ct-5") + "]": "application/x-ndjson",
		} {
			a := call(t, ts, "POST", "/v1/tasks:batch", body, "Content-Type", ct)
			if a.status != http.StatusOK || !strings.Contains(string(a.body), `"written":2`) {
				t.Fatalf("batch of %s labelled %s: %v", body, ct, a)
			}
		}
	})

	t.Run("PutInvalid", func(t *testing.T) {
		big := strings.Repeat("x", task.MaxTaskSize)
		for _, tc := range []struct {
			name, id, body string
			want           []string
		}{
			{"bad cron", "inv-1", `{"schedule": "61 * * * * *", "executor": {"type": "noop"}}`, []string{"schedule:", "61"}},
			{"unknown zone", "inv-2", `{"schedule": "@hourly", "timezone": "Mars/Olympus", "executor": {"type": "noop"}}`, []string{"timezone:", "Mars/Olympus"}},
			{"never fires", "inv-3", `{"schedule": "0 0 30 2 *", "executor": {"type": "noop"}}`, []string{"schedule:"}},
			{"unknown executor", "inv-4", `{"schedule": "@hourly", "executor": {"type": "ftp"}}`, []string{"executor.type", "ftp"}},
			{"malformed JSON", "inv-5", `{"schedule": "@hourly", `, []string{"malformed JSON"}},
			{"not an object", "inv-6", `[1, 2]`, []string{"JSON object"}},
			{"wrong type", "inv-7", `{"schedule": "@hourly", "executor": {"type": "noop"}, "paused": "yes"}`, []string{"paused"}},
			{"unknown field", "inv-8", `{"schedul": "@hourly", "executor": {"type": "noop"}}`, []string{"schedul", "did you mean"}},
			{"id mismatch", "inv-10", noopJSON("inv-other"), []string{"id:", "inv-other", "inv-10"}},
			{"control character in id", "inv\x01", noopJSON(""), []string{"id:", "control character"}},
			{"invalid UTF-8 in id", "inv\xff", noopJSON(""), []string{"id:", "is not valid UTF-8"}},
			{"empty body", "inv-11", ``, []string{"malformed JSON"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				path := "/v1/tasks/" + client.EscapeID(tc.id)
				wantError(t, call(t, ts, "PUT", path, tc.body), http.StatusBadRequest, tc.want...)
				// Refused input changes nothing.
				if a := call(t, ts, "GET", path, ""); a.status != http.StatusNotFound && a.status != http.StatusBadRequest {
					t.Fatalf("GET after a refused PUT: %v", a)
				}
			})
		}
		oversized := `{"schedule": "@hourly", "executor": {"type": "http", "url": "http://x/", "body": "` + big + `"}}`
		wantError(t, call(t, ts, "PUT", "/v1/tasks/inv-9", oversized), http.StatusRequestEntityTooLarge, "64 KiB")
		wantError(t, call(t, ts, "GET", "/v1/tasks/inv-9", ""), http.StatusNotFound)
	})

	t.Run("IfMatch", func(t *testing.T) {
		a := call(t, ts, "PUT", "/v1/tasks/ifm", noopJSON("ifm"))
		v1 := decodeTask(t, a).Version
		body2 := `{"schedule": "0 0 2 1 *", "executor": {"type": "noop"}}`
		a = call(t, ts, "PUT", "/v1/tasks/ifm", body2, "If-Match", strconv.FormatInt(v1, 10))
		if a.status != http.StatusOK {
			t.Fatalf("PUT If-Match current: %v", a)
		}
		v2 := decodeTask(t, a).Version
		if v2 <= v1 {
			t.Fatalf("version %d after %d", v2, v1)
		}
		body3 := `{"schedule": "0 0 3 1 *", "executor": {"type": "noop"}}`
		wantError(t, call(t, ts, "PUT", "/v1/tasks/ifm", body3, "If-Match", strconv.Quote(strconv.FormatInt(v1, 10))),
			http.StatusPreconditionFailed, "ifm")
		if a := call(t, ts, "PUT", "/v1/tasks/ifm", body3, "If-Match", a.header.Get("ETag")); a.status != http.StatusOK {
			t.Fatalf("PUT with the ETag as If-Match: %v", a)
		}
		for _, bad := range []string{"abc", "0", "-4", `"12`, "W/\"12\""} {
			wantError(t, call(t, ts, "PUT", "/v1/tasks/ifm", body3, "If-Match", bad), http.StatusBadRequest, "If-Match")
		}
		wantError(t, call(t, ts, "PUT", "/v1/tasks/ifm-absent", noopJSON(""), "If-Match", "5"), http.StatusPreconditionFailed)

		// The client: a stale version is a 412 *client.Error.
		_, err := n.c.PutTask(ctx, &task.Task{ID: "ifm", Schedule: "@daily", Executor: task.Executor{Type: task.ExecutorNoop}}, v1)
		var ae *client.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusPreconditionFailed {
			t.Fatalf("PutTask with a stale version: %v", err)
		}
	})

	t.Run("Delete", func(t *testing.T) {
		call(t, ts, "PUT", "/v1/tasks/del", noopJSON(""))
		if a := call(t, ts, "DELETE", "/v1/tasks/del", ""); a.status != http.StatusNoContent || len(a.body) != 0 {
			t.Fatalf("DELETE: %v", a)
		}
		wantError(t, call(t, ts, "DELETE", "/v1/tasks/del", ""), http.StatusNotFound, `"del"`, "not found")
		wantError(t, call(t, ts, "GET", "/v1/tasks/del", ""), http.StatusNotFound, "not found")
	})

	// A body announced too big is refused before it is read: a client that
	// waits on Expect: 100-continue gets the answer, not a 100 and then a
	// reset once it sent more than the limit.
	t.Run("TooBigBeforeContinue", func(t *testing.T) {
		for _, tc := range []struct {
			method, path string
			size         int
			status       string
		}{
			{"PUT", "/v1/tasks/big", 2 << 20, "413"},
			{"POST", "/v1/tasks/big/trigger", 2 << 20, "413"},
			{"POST", "/v1/tasks:batch", 65 << 20, "413"},
			{"POST", "/v1/tasks:delete", 1 << 20, "413"},
		} {
			conn, err := net.Dial("tcp", ts.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n",
				tc.method, tc.path, ts.Listener.Addr(), tc.size)
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			line, err := bufio.NewReader(conn).ReadString('\n')
			conn.Close()
			if err != nil || !strings.HasPrefix(line, "HTTP/1.1 "+tc.status) {
				t.Errorf("%s %s with %d bytes announced: first line %q (%v), want %s", tc.method, tc.path, tc.size, line, err, tc.status)
			}
		}
	})

	// A body without a Content-Length (chunked) is cut at the limit as it
	// is read.
	t.Run("TooBigChunked", func(t *testing.T) {
		for _, tc := range []struct {
			method, path string
			size         int
			status       int
		}{
			{"PUT", "/v1/tasks/big", 2 << 20, http.StatusRequestEntityTooLarge},
			{"POST", "/v1/tasks/big/trigger", 2 << 20, http.StatusRequestEntityTooLarge},
			{"POST", "/v1/tasks:pause", 128 << 10, http.StatusRequestEntityTooLarge},
			// Not a batch past its 64 MiB: reading that much would starve
			// this test node's lease on a 2-core machine.
		} {
			body := struct{ io.Reader }{bytes.NewReader(bytes.Repeat([]byte(" "), tc.size))} // no length: sent chunked
			req, err := http.NewRequest(tc.method, ts.URL+tc.path, body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := ts.Client().Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", tc.method, tc.path, err)
			}
			msg, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(string(msg), "more than") {
				t.Errorf("%s %s, %d bytes chunked: %d %s, want %d", tc.method, tc.path, tc.size, resp.StatusCode, msg, tc.status)
			}
		}
	})

	t.Run("DeleteIfMatch", func(t *testing.T) {
		v1 := decodeTask(t, call(t, ts, "PUT", "/v1/tasks/delifm", noopJSON(""))).Version
		a := call(t, ts, "PUT", "/v1/tasks/delifm", `{"schedule": "0 0 2 1 *", "executor": {"type": "noop"}}`)
		v2 := decodeTask(t, a).Version
		// A delete conditioned on a version since replaced changes nothing.
		wantError(t, call(t, ts, "DELETE", "/v1/tasks/delifm", "", "If-Match", strconv.FormatInt(v1, 10)),
			http.StatusPreconditionFailed, "delifm")
		wantError(t, call(t, ts, "DELETE", "/v1/tasks/delifm", "", "If-Match", "abc"), http.StatusBadRequest, "If-Match")
		if a := call(t, ts, "GET", "/v1/tasks/delifm", ""); a.status != http.StatusOK {
			t.Fatalf("GET after refused deletes: %v", a)
		}
		if a := call(t, ts, "DELETE", "/v1/tasks/delifm", "", "If-Match", a.header.Get("ETag")); a.status != http.StatusNoContent {
			t.Fatalf("DELETE with the current ETag (version %d): %v", v2, a)
		}
		wantError(t, call(t, ts, "GET", "/v1/tasks/delifm", ""), http.StatusNotFound, "not found")
		wantError(t, call(t, ts, "DELETE", "/v1/tasks/delifm", "", "If-Match", "5"), http.StatusPreconditionFailed, "delifm")
	})

	t.Run("NotFound", func(t *testing.T) {
		for _, r := range [][2]string{
			{"GET", "/v1/tasks/missing"}, {"DELETE", "/v1/tasks/missing"},
			{"POST", "/v1/tasks/missing/pause"}, {"POST", "/v1/tasks/missing/resume"},
			{"POST", "/v1/tasks/missing/trigger"},
		} {
			wantError(t, call(t, ts, r[0], r[1], ""), http.StatusNotFound, `task "missing" not found`)
		}
		var ae *client.Error
		if _, err := n.c.GetTask(ctx, "missing"); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
			t.Fatalf("GetTask: %v", err)
		}
	})

	t.Run("IDsRoundTrip", func(t *testing.T) {
		for _, id := range []string{"billing/invoice-42", "/", "//", "with space", "a/b/c", "/leading", "trailing/",
			"100%", "%2F", "q?x#y&z=1", ".", "..", "../up", "ünï cødé", "semi;colon", "plus+sign"} {
			t.Run(id, func(t *testing.T) {
				tsk, err := n.c.PutTask(ctx, handlerTask(id, "0 0 1 1 *"), 0)
				if err != nil {
					t.Fatalf("PutTask: %v", err)
				}
				if tsk.ID != id {
					t.Fatalf("PutTask stored id %q", tsk.ID)
				}
				if got, err := n.c.GetTask(ctx, id); err != nil || got.ID != id {
					t.Fatalf("GetTask: %v, %+v", err, got)
				}
				tasks, _, err := n.c.ListTasks(ctx, client.ListOptions{Prefix: id})
				if err != nil || !slices.ContainsFunc(tasks, func(x *task.Task) bool { return x.ID == id }) {
					t.Fatalf("ListTasks prefix %q: %v, %d tasks", id, err, len(tasks))
				}
				if p, err := n.c.Pause(ctx, id); err != nil || !p.Paused || p.ID != id {
					t.Fatalf("Pause: %v, %+v", err, p)
				}
				if _, err := n.c.Trigger(ctx, id); err != nil {
					t.Fatalf("Trigger: %v", err)
				}
				if _, err := n.c.History(ctx, id, 5); err != nil {
					t.Fatalf("History: %v", err)
				}
				if err := n.c.DeleteTask(ctx, id); err != nil {
					t.Fatalf("DeleteTask: %v", err)
				}
			})
		}
		// An id with "/" that is not escaped is another path: a JSON 404
		// that says how to escape it.
		wantError(t, call(t, ts, "GET", "/v1/tasks/billing/invoice-42", ""), http.StatusNotFound, "path-escaped")
	})

	t.Run("List", func(t *testing.T) {
		var want []string
		for i := range 25 {
			id := fmt.Sprintf("list/t-%02d", i)
			tsk := handlerTask(id, "0 0 1 1 *")
			tsk.Labels = map[string]string{}
			if i%3 == 0 {
				tsk.Labels["team"] = "x"
			}
			if i%2 == 0 {
				tsk.Labels["env"] = "prod"
			}
			if _, err := n.c.PutTask(ctx, tsk, 0); err != nil {
				t.Fatal(err)
			}
			want = append(want, id)
		}
		if _, err := n.c.PutTask(ctx, handlerTask("lisp/other", "0 0 1 1 *"), 0); err != nil {
			t.Fatal(err)
		}
		// Page through with the raw API, to see next_cursor as sent.
		var got []string
		cursor, pages := "", 0
		for {
			a := call(t, ts, "GET", "/v1/tasks?prefix=list%2F&limit=10&cursor="+cursor, "")
			if a.status != http.StatusOK {
				t.Fatalf("list: %v", a)
			}
			var page struct {
				Tasks      []*task.Task `json:"tasks"`
				NextCursor *string      `json:"next_cursor"`
			}
			if err := json.Unmarshal(a.body, &page); err != nil {
				t.Fatal(err)
			}
			if page.NextCursor == nil {
				t.Fatalf("answer without next_cursor: %s", a.body)
			}
			for _, x := range page.Tasks {
				got = append(got, x.ID)
			}
			pages++
			if *page.NextCursor == "" {
				break
			}
			if pages > 10 {
				t.Fatal("paging does not end")
			}
			cursor = *page.NextCursor
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("paged through %v, want %v", got, want)
		}
		if pages < 3 {
			t.Fatalf("%d pages of at most 10 for 25 tasks", pages)
		}

		count := func(opts client.ListOptions) int {
			t.Helper()
			n2 := 0
			for {
				tasks, next, err := n.c.ListTasks(ctx, opts)
				if err != nil {
					t.Fatal(err)
				}
				n2 += len(tasks)
				if next == "" {
					return n2
				}
				opts.Cursor = next
			}
		}
		if got := count(client.ListOptions{Prefix: "list/", Labels: map[string]string{"team": "x"}}); got != 9 {
			t.Fatalf("label team=x: %d tasks, want 9", got)
		}
		if got := count(client.ListOptions{Prefix: "list/", Labels: map[string]string{"team": "x", "env": "prod"}, Limit: 2}); got != 5 {
			t.Fatalf("labels team=x, env=prod: %d tasks, want 5", got)
		}
		if got := count(client.ListOptions{Prefix: "lis"}); got != 26 {
			t.Fatalf("prefix lis: %d tasks, want 26", got)
		}
		if a := call(t, ts, "GET", "/v1/tasks?prefix=nothing-has-this", ""); a.status != http.StatusOK ||
			!strings.Contains(string(a.body), `"tasks":[]`) || !strings.Contains(string(a.body), `"next_cursor":""`) {
			t.Fatalf("empty list: %v", a)
		}
		for _, q := range []struct{ query, want string }{
			{"label=team", "label"}, {"label==x", "label"}, {"label=a=1&label=a=2", "twice"},
			{"limit=0", "limit"}, {"limit=-1", "limit"}, {"limit=abc", "limit"}, {"limit=10001", "limit"},
			{"cursor=not%01an-id", "cursor"},
		} {
			wantError(t, call(t, ts, "GET", "/v1/tasks?"+q.query, ""), http.StatusBadRequest, q.want)
		}
	})

	t.Run("Export", func(t *testing.T) {
		var buf bytes.Buffer
		if err := n.c.Export(ctx, client.ListOptions{Prefix: "list/", Labels: map[string]string{"team": "x"}}, &buf); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
		if len(lines) != 9 {
			t.Fatalf("export: %d lines, want 9:\n%s", len(lines), buf.String())
		}
		// Importing an export into the same cluster finds every task as it is.
		res, err := n.c.PutBatch(ctx, buf.Bytes())
		if err != nil || res.Written != 9 || len(res.Errors) != 0 {
			t.Fatalf("re-import: %+v, %v", res, err)
		}
		var again bytes.Buffer
		if err := n.c.Export(ctx, client.ListOptions{Prefix: "list/", Labels: map[string]string{"team": "x"}}, &again); err != nil || again.String() != buf.String() {
			t.Fatalf("export after re-import differs (%v):\n%s\nwant\n%s", err, again.String(), buf.String())
		}
		wantError(t, call(t, ts, "GET", "/v1/tasks:export?limit=5", ""), http.StatusBadRequest, `unknown query parameter "limit"`, "takes prefix, label")
	})

	t.Run("Batch", func(t *testing.T) {
		array := `[` + noopJSON("batch/a") + `, {"id": "batch/bad", "schedule": "61 * * * * *", "executor": {"type": "noop"}}, ` + noopJSON("batch/b") + `]`
		a := call(t, ts, "POST", "/v1/tasks:batch", array, "Content-Type", "application/json")
		if a.status != http.StatusOK || !strings.Contains(string(a.body), `"written":2`) {
			t.Fatalf("array batch: %v", a)
		}
		var res client.BatchResult
		if err := json.Unmarshal(a.body, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Errors) != 1 || res.Errors[0].Index != 1 || !strings.Contains(res.Errors[0].Error, "schedule") {
			t.Fatalf("array batch errors %+v", res.Errors)
		}
		// A created_at given to a create is kept (an export read back by
		// an import: max_fires counts from it).
		then := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
		created := fmt.Sprintf(`{"id": "batch/created", "schedule": "@hourly", "executor": {"type": "noop"}, "created_at": %q}`, then.Format(time.RFC3339))
		if r, err := n.c.PutBatch(ctx, []byte(created)); err != nil || r.Written != 1 {
			t.Fatalf("batch with created_at: %+v, %v", r, err)
		}
		if got, err := n.c.GetTask(ctx, "batch/created"); err != nil || !got.CreatedAt.Equal(then) {
			t.Fatalf("batch/created: %+v, %v; want created_at %v", got, err, then)
		}
		// Sent again, it writes nothing, and says so.
		if a := call(t, ts, "POST", "/v1/tasks:batch", array, "Content-Type", "application/json"); a.status != http.StatusOK ||
			!strings.Contains(string(a.body), `"written":2,"unchanged":2`) {
			t.Fatalf("array batch sent again: %v", a)
		}
		for _, id := range []string{"batch/a", "batch/b"} {
			if _, err := n.c.GetTask(ctx, id); err != nil {
				t.Fatalf("GetTask %s: %v", id, err)
			}
		}

		// JSON Lines through the client: blank lines are not items.
		jsonl := noopJSON("batch/c") + "\n\n" + `{"id": "batch/d", "schedule": ` + "\r\n" + noopJSON("batch/e") + "\n" +
			`{"id": "batch/f", "schedule": "@hourly", "executor": {"type": "ftp"}}` + "\n"
		r, err := n.c.PutBatch(ctx, []byte(jsonl))
		if err != nil {
			t.Fatal(err)
		}
		if r.Written != 2 || len(r.Errors) != 2 || r.Errors[0].Index != 1 || !strings.HasPrefix(r.Errors[0].Error, "line 3: malformed JSON") ||
			r.Errors[1].Index != 3 || !strings.Contains(r.Errors[1].Error, "line 5: executor.type") {
			t.Fatalf("JSON Lines batch: %+v", r)
		}

		// An id given again later: the later one is stored, the earlier
		// warned of by its place in the batch (after an item not decoded).
		twice := "{\n" + noopJSON("batch/t") + "\n" + noopJSON("batch/u") + "\n" +
			`{"id": "batch/t", "schedule": "@daily", "executor": {"type": "noop"}}` + "\n"
		r, err = n.c.PutBatch(ctx, []byte(twice))
		if err != nil || r.Written != 3 || len(r.Errors) != 1 || len(r.Warnings) != 1 || r.Warnings[0].Index != 1 ||
			!strings.Contains(r.Warnings[0].Warning, "comes again later in this batch") {
			t.Fatalf("a batch with an id twice: %+v, %v", r, err)
		}
		if got, err := n.c.GetTask(ctx, "batch/t"); err != nil || got.Schedule != "@daily" {
			t.Fatalf("batch/t: %+v, %v; want the later one", got, err)
		}
		// A later item the registry refuses as it writes it (its chain
		// closes a cycle) replaces nothing: no warning says it does, and the
		// earlier item is an error too.
		refused := `{"id": "batch/y", "schedule": "@daily", "executor": {"type": "noop"}, "on_success": ["batch/x"]}` + "\n" +
			noopJSON("batch/x") + "\n" +
			`{"id": "batch/x", "schedule": "@daily", "executor": {"type": "noop"}, "on_success": ["batch/y"]}` + "\n"
		r, err = n.c.PutBatch(ctx, []byte(refused))
		if err != nil || r.Written != 1 || len(r.Errors) != 2 || r.Errors[0].Index != 1 || r.Errors[1].Index != 2 || len(r.Warnings) != 0 {
			t.Fatalf("a batch whose later duplicate is refused: %+v, %v", r, err)
		}

		// The same when the later item is refused before the write (its
		// schedule, its executor, its decoding), however often the id came
		// before; a valid item after the refused one is the last word.
		early := noopJSON("batch/v") + "\n" + noopJSON("batch/v") + "\n" +
			`{"id": "batch/v", "schedule": "61 * * * * *", "executor": {"type": "noop"}}` + "\n" +
			noopJSON("batch/w") + "\n" + `{"id": "batch/w", "schedule": "@daily", "executor": {"type": "ftp"}}` + "\n" +
			`{"id": "batch/w", "schedule": "@daily", "executor": {"type": "noop"}}` + "\n"
		r, err = n.c.PutBatch(ctx, []byte(early))
		if err != nil || r.Written != 2 || len(r.Errors) != 4 || r.Errors[0].Index != 0 || r.Errors[1].Index != 1 ||
			!strings.Contains(r.Errors[0].Error, `task "batch/v" comes again later in this batch, and that item was refused`) {
			t.Fatalf("a batch whose later duplicate is refused before the write: %+v, %v", r, err)
		}
		wantError(t, call(t, ts, "GET", "/v1/tasks/batch%2Fv", ""), http.StatusNotFound, `task "batch/v" not found`)
		if got, err := n.c.GetTask(ctx, "batch/w"); err != nil || got.Schedule != "@daily" {
			t.Errorf("batch/w: %+v, %v; want the last item", got, err)
		}

		// Nothing but whitespace: an empty batch.
		if r, err := n.c.PutBatch(ctx, []byte("\n \n")); err != nil || r.Written != 0 || r.Errors == nil || len(r.Errors) != 0 {
			t.Fatalf("empty batch: %+v, %v", r, err)
		}

		// More than 10,000 items: refused whole, nothing written.
		var lines, items []string
		for i := range MaxBatchItems + 1 {
			lines = append(lines, noopJSON(fmt.Sprintf("toomany/%05d", i)))
		}
		items = lines
		wantError(t, call(t, ts, "POST", "/v1/tasks:batch", strings.Join(lines, "\n")), http.StatusBadRequest, "at most 10000")
		wantError(t, call(t, ts, "POST", "/v1/tasks:batch", "["+strings.Join(items, ",")+"]"), http.StatusBadRequest, "at most 10000")
		if tasks, _, err := n.c.ListTasks(ctx, client.ListOptions{Prefix: "toomany/"}); err != nil || len(tasks) != 0 {
			t.Fatalf("after refused batches: %d tasks, %v", len(tasks), err)
		}

		// A malformed array cannot be split into items.
		wantError(t, call(t, ts, "POST", "/v1/tasks:batch", `[`+noopJSON("batch/g")+`, {"id": `), http.StatusBadRequest, "malformed JSON array")
		wantError(t, call(t, ts, "POST", "/v1/tasks:batch", `[]x`), http.StatusBadRequest, "malformed JSON array")
		if _, err := n.c.GetTask(ctx, "batch/g"); err == nil {
			t.Fatal("a malformed batch wrote a task")
		}

		// A body over MaxBatchBytes: 413.
		_, small := n.serve(t, Config{MaxBatchBytes: 1024})
		wantError(t, call(t, small, "POST", "/v1/tasks:batch", "["+strings.Join(items[:20], ",")+"]"),
			http.StatusRequestEntityTooLarge, "1024 bytes")
	})

	t.Run("PauseResume", func(t *testing.T) {
		if _, err := n.c.PutTask(ctx, handlerTask("pr", "0 0 1 1 *"), 0); err != nil {
			t.Fatal(err)
		}
		a := call(t, ts, "POST", "/v1/tasks/pr/pause", "")
		if a.status != http.StatusOK || !decodeTask(t, a).Paused {
			t.Fatalf("pause: %v", a)
		}
		if got, err := n.c.GetTask(ctx, "pr"); err != nil || !got.Paused {
			t.Fatalf("after pause: %+v, %v", got, err)
		}
		if got, err := n.c.Resume(ctx, "pr"); err != nil || got.Paused {
			t.Fatalf("resume: %+v, %v", got, err)
		}
	})

	t.Run("Trigger", func(t *testing.T) {
		id := "trigger/me"
		if _, err := n.c.PutTask(ctx, handlerTask(id, "0 0 1 1 *"), 0); err != nil {
			t.Fatal(err)
		}
		// Trigger once the owner holds the task (its state is known).
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			got, err := n.c.GetTask(ctx, id)
			return err == nil && got.State != nil
		})
		a := call(t, ts, "POST", "/v1/tasks/trigger%2Fme/trigger", "")
		if a.status != http.StatusAccepted {
			t.Fatalf("trigger: %v", a)
		}
		var tr struct {
			ScheduledAt string `json:"scheduled_at"`
		}
		if err := json.Unmarshal(a.body, &tr); err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`).MatchString(tr.ScheduledAt) {
			t.Fatalf("scheduled_at %q is not RFC 3339 with milliseconds in UTC", tr.ScheduledAt)
		}
		at, err := time.Parse(time.RFC3339, tr.ScheduledAt)
		if err != nil {
			t.Fatal(err)
		}
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return n.fires.fired(id, at) })

		at2, err := n.c.Trigger(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return n.fires.fired(id, at2) })
	})

	t.Run("History", func(t *testing.T) {
		id := "history/every-second"
		if _, err := n.c.PutTask(ctx, handlerTask(id, "* * * * * *"), 0); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = n.c.DeleteTask(ctx, id) }()
		var recs []task.Execution
		etcdtest.WaitFor(t, 15*time.Second, func() bool {
			h, err := n.c.History(ctx, id, 0)
			if err != nil {
				t.Fatal(err)
			}
			recs = h
			return len(h) >= 3
		})
		for i, r := range recs {
			if r.TaskID != id || r.Node != "node-1" || r.Status != "ok" || r.Attempt != 1 {
				t.Fatalf("record %d: %+v", i, r)
			}
			if i > 0 && !r.ScheduledAt.Before(recs[i-1].ScheduledAt) {
				t.Fatalf("records not newest first: %v then %v", recs[i-1].ScheduledAt, r.ScheduledAt)
			}
		}
		one, err := n.c.History(ctx, id, 1)
		if err != nil || len(one) != 1 || one[0].ScheduledAt.Before(recs[0].ScheduledAt) {
			t.Fatalf("limit 1: %+v, %v", one, err)
		}
		if a := call(t, ts, "GET", "/v1/tasks/history%2Fevery-second/history?local=1&limit=2", ""); a.status != http.StatusOK ||
			strings.Count(string(a.body), `"task_id"`) != 2 {
			t.Fatalf("local history: %v", a)
		}
		call(t, ts, "PUT", "/v1/tasks/never-ran", noopJSON(""))
		if a := call(t, ts, "GET", "/v1/tasks/never-ran/history", ""); a.status != http.StatusOK || !strings.Contains(string(a.body), `"executions":[]`) {
			t.Fatalf("history of a task without records: %v", a)
		}
		// A mistyped id is not a task that never ran.
		wantError(t, call(t, ts, "GET", "/v1/tasks/no-such-task/history", ""), http.StatusNotFound, `"no-such-task"`, "not found")
		for _, l := range []string{"0", "1001", "x"} {
			wantError(t, call(t, ts, "GET", "/v1/tasks/h/history?limit="+l, ""), http.StatusBadRequest, "limit")
		}
		for _, path := range []string{"/v1/tasks/h/history?local=yes", "/v1/failures?local=yes", "/v1/tasks?state=T"} {
			wantError(t, call(t, ts, "GET", path, ""), http.StatusBadRequest, "is not a boolean (1, true, 0, false)")
		}
	})

	t.Run("Nodes", func(t *testing.T) {
		nodes, err := n.c.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) != 1 {
			t.Fatalf("%d nodes: %+v", len(nodes), nodes)
		}
		x := nodes[0]
		if x.ID != "node-1" || x.APIAddr != n.ts.Listener.Addr().String() || x.Version != "test-1" || x.StartedAt.IsZero() ||
			x.Partitions != testPartitions || len(x.PartitionList) != testPartitions || len(x.Owned) != testPartitions ||
			!x.Ready || x.Fenced || x.Error != "" || x.Tasks == 0 || x.Fires == 0 || x.FireRate < 0 {
			t.Fatalf("node %+v", x)
		}
		a := call(t, ts, "GET", "/v1/nodes", "")
		for _, field := range []string{`"id"`, `"api_addr"`, `"started_at"`, `"version"`, `"partitions"`,
			`"partition_list"`, `"owned"`, `"tasks"`, `"fire_rate"`} {
			if !strings.Contains(string(a.body), field) {
				t.Fatalf("/v1/nodes lacks %s: %s", field, a.body)
			}
		}
		a = call(t, ts, "GET", "/v1/nodes/self", "")
		var self client.Node
		if err := json.Unmarshal(a.body, &self); err != nil || self.ID != "node-1" || len(self.Owned) != testPartitions {
			t.Fatalf("self: %v, %s", err, a.body)
		}
	})

	t.Run("Partitions", func(t *testing.T) {
		ps, err := n.c.Partitions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != testPartitions {
			t.Fatalf("%d partitions", len(ps))
		}
		for i, p := range ps {
			if p.Partition != i || p.Owner != "node-1" || p.State != client.PartitionOwned {
				t.Fatalf("partition %d: %+v", i, p)
			}
		}
	})

	t.Run("Health", func(t *testing.T) {
		if a := call(t, ts, "GET", "/healthz", ""); a.status != http.StatusOK || strings.TrimSpace(string(a.body)) != `{"status":"ok"}` {
			t.Fatalf("healthz: %v", a)
		}
		if a := call(t, ts, "GET", "/readyz", ""); a.status != http.StatusOK {
			t.Fatalf("readyz: %v", a)
		}
		if err := n.c.Ready(ctx); err != nil {
			t.Fatalf("Ready: %v", err)
		}
		// A bare host:port with a trailing slash is a base URL too.
		bare := client.NewClient(strings.TrimPrefix(ts.URL, "http://")+"/", "")
		bare.HTTP = ts.Client()
		if err := bare.Ready(ctx); err != nil {
			t.Fatalf("Ready with a bare address: %v", err)
		}
	})

	t.Run("Metrics", func(t *testing.T) {
		call(t, ts, "GET", "/", "")
		a := call(t, ts, "GET", "/metrics", "")
		if a.status != http.StatusOK || !strings.HasPrefix(a.header.Get("Content-Type"), "text/plain") {
			t.Fatalf("metrics: %d %s", a.status, a.header.Get("Content-Type"))
		}
		text := string(a.body)
		for _, want := range []string{
			"# TYPE shardcron_fires_total counter",
			"# TYPE shardcron_fire_lag_seconds histogram",
			`shardcron_fire_lag_seconds_bucket{le="+Inf"}`,
			"shardcron_fire_lag_seconds_sum",
			"shardcron_fire_lag_seconds_count",
			`shardcron_executions_total{status="ok"}`,
			`shardcron_executions_total{status="failed"}`,
			"# TYPE shardcron_queue_depth gauge",
			"shardcron_partitions_owned 16",
			"shardcron_partitions 16",
			"# TYPE shardcron_tasks gauge",
			`shardcron_etcd_requests_total{op="range"}`,
			`shardcron_etcd_requests_total{op="txn"}`,
			"shardcron_fenced 0",
			"shardcron_ready 1",
			"# TYPE shardcron_misfires_total counter",
			"# TYPE shardcron_history_dropped_total counter",
			`shardcron_build_info{goversion="` + runtime.Version() + `",version="test-1"} 1`,
			"shardcron_queue_capacity 1024",
			"shardcron_workers 4",
			"# TYPE shardcron_fence_events_total counter",
			"shardcron_fence_events_total 0",
			"# TYPE shardcron_execution_duration_seconds histogram",
			`shardcron_api_requests_total{code="200",method="GET",route="/v1/tasks/{id}"}`,
			`shardcron_api_requests_total{code="404",method="GET",route="unmatched"}`,
			`shardcron_api_requests_total{code="200",method="GET",route="/"}`, // the dashboard, not the pattern's "/{$}"
			`shardcron_api_request_duration_seconds_bucket{method="PUT",route="/v1/tasks/{id}",le="+Inf"}`,
			"go_goroutines",
			"process_cpu_seconds_total",
		} {
			if !strings.Contains(text, want) {
				t.Errorf("metrics lack %q", want)
			}
		}
		// The fires of the earlier subtests show.
		if regexp.MustCompile(`(?m)^shardcron_fires_total 0$`).MatchString(text) {
			t.Error("shardcron_fires_total is 0 after fires")
		}
		// They ran handler executions, which are timed.
		if regexp.MustCompile(`(?m)^shardcron_execution_duration_seconds_count 0$`).MatchString(text) {
			t.Error("shardcron_execution_duration_seconds_count is 0 after handler executions")
		}
		// Gather checks consistency (bucket order, label sets) too.
		mfs, err := n.srv.metrics.Gather()
		if err != nil {
			t.Fatal(err)
		}
		types := map[string]string{}
		for _, mf := range mfs {
			types[mf.GetName()] = mf.GetType().String()
		}
		for name, typ := range map[string]string{
			"shardcron_fires_total": "COUNTER", "shardcron_fire_lag_seconds": "HISTOGRAM",
			"shardcron_fires_staged_total": "COUNTER", "shardcron_stage_drops_total": "COUNTER",
			"shardcron_executions_total": "COUNTER", "shardcron_queue_depth": "GAUGE",
			"shardcron_partitions_owned": "GAUGE", "shardcron_partitions": "GAUGE", "shardcron_tasks": "GAUGE",
			"shardcron_etcd_requests_total": "COUNTER", "shardcron_fenced": "GAUGE",
			"shardcron_misfires_total": "COUNTER", "shardcron_history_dropped_total": "COUNTER",
			"shardcron_ready": "GAUGE",
		} {
			if types[name] != typ {
				t.Errorf("%s is %q, want %s", name, types[name], typ)
			}
		}
		// Prometheus's naming conventions, as promtool check metrics
		// has them.
		problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	})

	t.Run("Dashboard", func(t *testing.T) {
		a := call(t, ts, "GET", "/", "")
		if a.status != http.StatusOK || !strings.HasPrefix(a.header.Get("Content-Type"), "text/html") {
			t.Fatalf("dashboard: %d %s", a.status, a.header.Get("Content-Type"))
		}
		page := string(a.body)
		for _, want := range []string{"<title>shardcron</title>", "/v1/nodes", "/v1/partitions", "/v1/tasks",
			"/history", "sessionStorage", "Authorization"} {
			if !strings.Contains(page, want) {
				t.Errorf("dashboard lacks %q", want)
			}
		}
		if regexp.MustCompile(`(src|href)\s*=\s*["']?(https?:)?//`).MatchString(page) {
			t.Error("dashboard loads an external asset")
		}
	})

	t.Run("Routes", func(t *testing.T) {
		wantError(t, call(t, ts, "GET", "/v1/nope", ""), http.StatusNotFound, "no such endpoint", "/v1/nope")
		wantError(t, call(t, ts, "GET", "/v1", ""), http.StatusNotFound)
		wantError(t, call(t, ts, "GET", "/nope", ""), http.StatusNotFound)
		for _, tc := range []struct{ method, path, allow string }{
			{"PATCH", "/v1/tasks/x", "PUT"},
			{"POST", "/v1/tasks", "GET"},
			{"GET", "/v1/tasks:batch", "POST"},
			{"DELETE", "/v1/nodes", "GET"},
			{"GET", "/v1/tasks/x/trigger", "POST"},
			{"POST", "/metrics", "GET"},
		} {
			a := call(t, ts, tc.method, tc.path, "")
			wantError(t, a, http.StatusMethodNotAllowed, tc.method, "allowed")
			if !strings.Contains(a.header.Get("Allow"), tc.allow) {
				t.Fatalf("%s %s: Allow %q lacks %s", tc.method, tc.path, a.header.Get("Allow"), tc.allow)
			}
		}
	})

	t.Run("UncleanPaths", func(t *testing.T) {
		// ServeMux redirected a path with an empty, "." or ".." segment to
		// its clean form with a 307 in HTML, a write included, which a
		// client following redirects sent again there: this put wrote the
		// task "unclean". Such a segment of an id is path-escaped.
		body := `{"schedule": "@hourly", "executor": {"type": "noop"}}`
		for _, path := range []string{"/v1/tasks/q/../unclean", "/v1/tasks/./unclean", "/v1//tasks/unclean"} {
			wantError(t, call(t, ts, "PUT", path, body), http.StatusNotFound, "no such endpoint", path)
		}
		wantError(t, call(t, ts, "PUT", "/v1/tasks/..", body), http.StatusNotFound, "%2E%2E")
		wantError(t, call(t, ts, "GET", "/v1/tasks/unclean", ""), http.StatusNotFound)
		wantError(t, call(t, ts, "GET", "//healthz", ""), http.StatusNotFound, "no such endpoint")
		if a := call(t, ts, "PUT", "/v1/tasks/q%2F..%2Funclean?dry_run=1", body); a.status != http.StatusOK {
			t.Errorf("PUT of the id q/../unclean, escaped: %v", a)
		}
	})

	t.Run("UnknownQueryParameters", func(t *testing.T) {
		// A typo of dry_run writes nothing.
		body := `{"schedule": "@hourly", "executor": {"type": "noop"}}`
		wantError(t, call(t, ts, "PUT", "/v1/tasks/q%2Ftypo?dryrun=1", body), http.StatusBadRequest,
			`unknown query parameter "dryrun"`, "dry_run, allow_missing_targets")
		wantError(t, call(t, ts, "GET", "/v1/tasks/q%2Ftypo", ""), http.StatusNotFound)
		wantError(t, call(t, ts, "GET", "/v1/tasks?prefix=q/&foo=bar", ""), http.StatusBadRequest, `"foo"`)
		wantError(t, call(t, ts, "GET", "/v1/nodes?verbose=1", ""), http.StatusBadRequest, `"verbose"`, "takes none")
		// A scope other than self answered every node's series, as none does.
		wantError(t, call(t, ts, "GET", "/v1/series?scope=local", ""), http.StatusBadRequest, `scope: want self (this node's series) or none (every node's), got "local"`)
		for _, path := range []string{"/v1/tasks?prefix=q/&label=a=b&limit=5&state=1", "/v1/series?scope=self", "/healthz?x=1", "/metrics?x=1"} {
			if a := call(t, ts, "GET", path, ""); a.status != http.StatusOK {
				t.Errorf("GET %s: %v", path, a)
			}
		}
	})

	t.Run("MalformedQuery", func(t *testing.T) {
		// url.URL.Query drops a pair it cannot unescape: ?dry_run=1% wrote
		// the task, ?prefix=a%zz listed and exported every task, and
		// ?limit=1&limit=%zz passed as one limit.
		body := `{"schedule": "@hourly", "executor": {"type": "noop"}}`
		wantError(t, call(t, ts, "PUT", "/v1/tasks/q%2Fmalformed?dry_run=1%", body), http.StatusBadRequest,
			"malformed query", `invalid URL escape "%"`)
		wantError(t, call(t, ts, "GET", "/v1/tasks/q%2Fmalformed", ""), http.StatusNotFound)
		for _, path := range []string{"/v1/tasks?prefix=a%zz", "/v1/tasks:export?prefix=a%zz",
			"/v1/tasks?limit=1&limit=%zz", "/v1/tasks?label=team=%zz", "/v1/tasks?prefix=q/;limit=1"} {
			wantError(t, call(t, ts, "GET", path, ""), http.StatusBadRequest, "malformed query")
		}
		if a := call(t, ts, "GET", "/healthz?x=%zz", ""); a.status != http.StatusOK {
			t.Errorf("GET /healthz?x=%%zz: %v (the probes ignore their query)", a)
		}
	})

	t.Run("Panic", func(t *testing.T) {
		srv, pts := n.serve(t, Config{})
		srv.mux.HandleFunc("GET /v1/test-panic", func(http.ResponseWriter, *http.Request) { panic("boom") })
		wantError(t, call(t, pts, "GET", "/v1/test-panic", ""), http.StatusInternalServerError, "internal error")
		if a := call(t, pts, "GET", "/healthz", ""); a.status != http.StatusOK {
			t.Fatalf("after a panic: %v", a)
		}
	})

	t.Run("Auth", func(t *testing.T) {
		var logs logbuf.Buffer
		_, ats := n.serve(t, Config{AuthToken: "s3cret",
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		wantError(t, call(t, ats, "GET", "/v1/tasks", ""), http.StatusUnauthorized, "Bearer")
		wantError(t, call(t, ats, "GET", "/v1/tasks", "", "Authorization", "Bearer wrong"), http.StatusUnauthorized)
		wantError(t, call(t, ats, "GET", "/v1/tasks", "", "Authorization", "Bearer s3cret-and-more"), http.StatusUnauthorized)
		wantError(t, call(t, ats, "GET", "/v1/tasks", "", "Authorization", "Basic czNjcmV0"), http.StatusUnauthorized)
		wantError(t, call(t, ats, "PUT", "/v1/tasks/auth", noopJSON("")), http.StatusUnauthorized)
		wantError(t, call(t, ats, "GET", "/v1/nope", ""), http.StatusUnauthorized)
		for _, h := range []string{"Bearer s3cret", "bearer s3cret"} {
			if a := call(t, ats, "GET", "/v1/tasks?limit=1", "", "Authorization", h); a.status != http.StatusOK {
				t.Fatalf("with %q: %v", h, a)
			}
		}
		wantError(t, call(t, ats, "GET", "/v1/nope", "", "Authorization", "Bearer s3cret"), http.StatusNotFound)
		// Every /v1 route refuses a request without the token, or with a
		// wrong one, before it reads or changes anything: the etcd
		// revision does not move. With the token, none answers 401.
		if a := call(t, ats, "PUT", "/v1/tasks/auth-kept", noopJSON(""), "Authorization", "Bearer s3cret"); a.status != http.StatusOK {
			t.Fatalf("PUT with the token: %v", a)
		}
		routes := []struct{ method, path, body string }{
			{"PUT", "/v1/tasks/auth-new", noopJSON("")},
			{"GET", "/v1/tasks/auth-kept", ""},
			{"DELETE", "/v1/tasks/auth-kept", ""},
			{"GET", "/v1/tasks", ""},
			{"POST", "/v1/tasks:batch", noopJSON("auth-batch") + "\n"},
			{"POST", "/v1/tasks/auth-kept/pause", ""},
			{"POST", "/v1/tasks/auth-kept/resume", ""},
			{"POST", "/v1/tasks/auth-kept/trigger", ""},
			{"GET", "/v1/tasks/auth-kept/history", ""},
			{"GET", "/v1/tasks/auth-kept/state", ""},
			{"GET", "/v1/nodes", ""},
			{"GET", "/v1/nodes/self", ""},
			{"GET", "/v1/partitions", ""},
		}
		// What a request could change: tasks, triggers and the index (the
		// node's own watermark writes move etcd's revision all along).
		rev := func() string {
			var out []string
			for _, prefix := range []string{"/shardcron/tasks/", "/shardcron/triggers/", "/shardcron/index/"} {
				r, err := c.Client.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
				if err != nil {
					t.Fatal(err)
				}
				var latest int64
				for _, kv := range r.Kvs {
					latest = max(latest, kv.ModRevision)
				}
				out = append(out, fmt.Sprintf("%s: %d keys, last changed at %d", prefix, len(r.Kvs), latest))
			}
			return strings.Join(out, "; ")
		}
		before := rev()
		for _, rt := range routes {
			for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}} {
				wantError(t, call(t, ats, rt.method, rt.path, rt.body, hdr...), http.StatusUnauthorized)
			}
		}
		if after := rev(); after != before {
			t.Errorf("requests without the token changed etcd: before %s; after %s", before, after)
		}
		for _, rt := range routes {
			if a := call(t, ats, rt.method, rt.path, rt.body, "Authorization", "Bearer s3cret"); a.status == http.StatusUnauthorized {
				t.Errorf("%s %s with the token: %v", rt.method, rt.path, a)
			}
		}
		for _, open := range []string{"/healthz", "/readyz", "/metrics", "/"} {
			if a := call(t, ats, "GET", open, ""); a.status != http.StatusOK {
				t.Fatalf("%s without a token: %v", open, a)
			}
		}
		wantError(t, call(t, ats, "GET", "/nope", ""), http.StatusNotFound)

		good := &client.Client{BaseURL: ats.URL, Token: "s3cret", HTTP: ats.Client()}
		if _, _, err := good.ListTasks(ctx, client.ListOptions{Limit: 1}); err != nil {
			t.Fatalf("client with the token: %v", err)
		}
		var ae *client.Error
		bad := &client.Client{BaseURL: ats.URL, HTTP: ats.Client()}
		if _, _, err := bad.ListTasks(ctx, client.ListOptions{}); !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
			t.Fatalf("client without the token: %v", err)
		}
		// The access log, at debug level.
		if l := logs.String(); !strings.Contains(l, "http request") || !strings.Contains(l, "status=401") {
			t.Fatalf("access log: %s", l)
		}
	})

	t.Run("ReadTokenAndProbeAuth", func(t *testing.T) {
		var logs logbuf.Buffer
		_, rts := n.serve(t, Config{AuthToken: "full-XYZ", ReadToken: "read-XYZ", ProbeAuth: true,
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		read, full := []string{"Authorization", "Bearer read-XYZ"}, []string{"Authorization", "Bearer full-XYZ"}
		if a := call(t, rts, "PUT", "/v1/tasks/rt", noopJSON(""), full...); a.status != http.StatusOK {
			t.Fatalf("PUT with the auth token: %v", a)
		}
		for _, path := range []string{"/v1/tasks?limit=1", "/v1/tasks/rt", "/v1/tasks/rt/history", "/v1/nodes", "/v1/partitions", "/healthz", "/readyz", "/metrics"} {
			if a := call(t, rts, "GET", path, "", read...); a.status != http.StatusOK {
				t.Fatalf("GET %s with the read token: %v", path, a)
			}
		}
		// Every write the API has, refused with the read token, and
		// nothing changed.
		for _, w := range []struct{ method, path, body string }{
			{"PUT", "/v1/tasks/rt", noopJSON("")}, {"PUT", "/v1/tasks/rt2", noopJSON("")}, {"DELETE", "/v1/tasks/rt", ""},
			{"POST", "/v1/tasks:batch", `{"id": "rt3", "schedule": "@daily", "executor": {"type": "noop"}}`},
			{"POST", "/v1/tasks/rt/pause", ""}, {"POST", "/v1/tasks/rt/resume", ""}, {"POST", "/v1/tasks/rt/trigger", ""},
		} {
			wantError(t, call(t, rts, w.method, w.path, w.body, read...), http.StatusForbidden, "read-only token")
		}
		if a := call(t, rts, "GET", "/v1/tasks/rt", "", read...); a.status != http.StatusOK || decodeTask(t, a).Paused {
			t.Fatalf("after refused writes: %v", a)
		}
		wantError(t, call(t, rts, "GET", "/v1/tasks/rt2", "", read...), http.StatusNotFound)
		for _, probe := range []string{"/healthz", "/readyz", "/metrics"} {
			wantError(t, call(t, rts, "GET", probe, ""), http.StatusUnauthorized)
		}
		if a := call(t, rts, "GET", "/", ""); a.status != http.StatusOK {
			t.Fatalf("the dashboard page without a token: %v", a)
		}
		if l := logs.String(); strings.Contains(l, "XYZ") {
			t.Fatalf("a token reached the log: %s", l)
		}
	})

	t.Run("TokenConfigRefused", func(t *testing.T) {
		for _, c := range []Config{{ReadToken: "r"}, {AuthToken: "a", ReadToken: "a"}, {ProbeAuth: true}} {
			c.Engine = n.e
			if _, err := New(c); !errors.Is(err, ErrConfig) {
				t.Errorf("%+v: %v", c, err)
			}
		}
	})

	// Last: a closed engine is fenced, and /readyz says so.
	t.Run("NotReadyAfterClose", func(t *testing.T) {
		if err := n.e.Close(); err != nil {
			t.Fatal(err)
		}
		a := call(t, ts, "GET", "/readyz", "")
		wantError(t, a, http.StatusServiceUnavailable, "fenced")
		if !strings.Contains(string(a.body), `"status":"not ready"`) || !strings.Contains(string(a.body), `"reason":"fenced`) {
			t.Fatalf("readyz: %s", a.body)
		}
		var ae *client.Error
		if err := n.c.Ready(ctx); !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || !strings.Contains(ae.Message, "fenced") {
			t.Fatalf("Ready: %v", err)
		}
		if a := call(t, ts, "GET", "/metrics", ""); !strings.Contains(string(a.body), "shardcron_fenced 1") ||
			!strings.Contains(string(a.body), "shardcron_ready 0") {
			t.Fatal("metrics do not show the node fenced and not ready")
		}
		// The registry still answers; the state is just unknown.
		if got, err := n.c.GetTask(ctx, "pr"); err != nil || got.State != nil {
			t.Fatalf("GET after close: %+v, %v", got, err)
		}
	})
}

// A request about a task or the cluster answers 504 once etcd has not
// answered within EtcdTimeout: it hung for as long as etcd was out of
// reach.
func TestServer_EtcdOutOfReachIs504(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "cut-off"})
	_, ts := n.serve(t, Config{EtcdTimeout: 300 * time.Millisecond})
	ts.Client().Timeout = 20 * time.Second // without the bound, the calls below never end
	c.Members[0].Stop()
	defer c.Members[0].Restart(t)
	for _, rt := range []struct{ method, path, body string }{
		{"GET", "/v1/tasks/x", ""}, {"PUT", "/v1/tasks/x", noopJSON("")}, {"GET", "/v1/nodes", ""}, {"GET", "/v1/tasks?limit=1", ""},
	} {
		wantError(t, call(t, ts, rt.method, rt.path, rt.body), http.StatusGatewayTimeout, "etcd did not answer in time")
	}
}
