package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// Issue 12's task operations through the HTTP API: chains refused and
// allowed, pause notes, trigger overrides and backfills, each bad request
// with a clear error.
func TestServer_ChainsPauseNotesOverridesBackfills(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	ts := n.ts
	ctx := context.Background()

	t.Run("Chains", func(t *testing.T) {
		body := `{"schedule": "@hourly", "executor": {"type": "handler", "name": "h"}, "on_success": ["chain/b"]}`
		wantError(t, call(t, ts, "PUT", "/v1/tasks/chain%2Fa", body), http.StatusBadRequest,
			`on_success[0]: task "chain/b" does not exist`, "allow_missing_targets")
		wantError(t, call(t, ts, "PUT", "/v1/tasks/chain%2Fa?allow_missing_targets=maybe", body), http.StatusBadRequest,
			"allow_missing_targets")
		if a := call(t, ts, "PUT", "/v1/tasks/chain%2Fa?allow_missing_targets=1", body); a.status != http.StatusOK {
			t.Fatalf("put with a missing target allowed: %v", a)
		}
		back := `{"schedule": "@hourly", "executor": {"type": "handler", "name": "h"}, "on_failure": ["chain/a"]}`
		wantError(t, call(t, ts, "PUT", "/v1/tasks/chain%2Fb", back), http.StatusBadRequest,
			`on_failure: the chains would form a cycle: "chain/b" -> "chain/a" -> "chain/b"`)
		if _, err := n.c.GetTask(ctx, "chain/b"); err == nil {
			t.Error("the refused put wrote chain/b")
		}
	})

	t.Run("PauseNote", func(t *testing.T) {
		id := "pause/noted"
		if _, err := n.c.PutTask(ctx, handlerTask(id, "@hourly"), 0); err != nil {
			t.Fatal(err)
		}
		wantError(t, call(t, ts, "POST", "/v1/tasks/pause%2Fnoted/pause", `{"nope": 1}`), http.StatusBadRequest, "nope")
		wantError(t, call(t, ts, "POST", "/v1/tasks/pause%2Fnoted/pause", `{"note": "`+strings.Repeat("x", 1025)+`"}`),
			http.StatusBadRequest, "note: 1025 bytes")
		before := time.Now().Add(-time.Second)
		if _, err := n.c.PauseWithNote(ctx, id, "provider outage, INC-123"); err != nil {
			t.Fatal(err)
		}
		got, err := n.c.GetTask(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		p := got.State.Pause
		if !got.Paused || p == nil || p.Note != "provider outage, INC-123" || p.By != "anonymous" || p.At.Before(before) {
			t.Fatalf("paused %v, state's pause %+v", got.Paused, p)
		}
		// A put that keeps the task paused keeps who paused it.
		got.Labels = map[string]string{"k": "v"}
		if _, err := n.c.PutTask(ctx, got, 0); err != nil {
			t.Fatal(err)
		}
		if again, _ := n.c.GetTask(ctx, id); again.Pause == nil || again.Pause.Note != p.Note {
			t.Errorf("a put of the paused task dropped its pause record: %+v", again.Pause)
		}
		// Lists that carry states show the pause there too, once the owner
		// has the paused task (within a second).
		for _, q := range []string{"state=1&prefix=pause%2F", "status=paused&prefix=pause%2F"} {
			var page client.ListResponse
			etcdtest.WaitFor(t, 5*time.Second, func() bool {
				a := call(t, ts, "GET", "/v1/tasks?"+q, "")
				page = client.ListResponse{}
				return json.Unmarshal(a.body, &page) == nil && len(page.Tasks) == 1 && page.Tasks[0].State != nil
			})
			if st := page.Tasks[0].State; st.Pause == nil || st.Pause.Note != p.Note {
				t.Errorf("%s: state %+v without the pause", q, st)
			}
		}
		if _, err := n.c.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		if again, _ := n.c.GetTask(ctx, id); again.Pause != nil || again.State != nil && again.State.Pause != nil {
			t.Errorf("a resumed task keeps its pause record: %+v", again.Pause)
		}
	})

	t.Run("TriggerOverride", func(t *testing.T) {
		id := "trigger/override"
		if _, err := n.c.PutTask(ctx, handlerTask(id, "0 0 1 1 *"), 0); err != nil {
			t.Fatal(err)
		}
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			got, err := n.c.GetTask(ctx, id)
			return err == nil && got.State != nil && got.State.Owner != ""
		})
		wantError(t, call(t, ts, "POST", "/v1/tasks/trigger%2Foverride/trigger", `{"body": "x"}`), http.StatusBadRequest,
			"body: task \"trigger/override\" runs a handler executor: only an http task takes a body")
		wantError(t, call(t, ts, "POST", "/v1/tasks/trigger%2Foverride/trigger", `{"payload": {"a": }}`), http.StatusBadRequest)
		at, err := n.c.TriggerWith(ctx, id, &task.Override{Payload: json.RawMessage(`{"once": true}`)})
		if err != nil {
			t.Fatal(err)
		}
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			return n.fires.any(func(f engine.Fire) bool {
				return f.TaskID == id && f.ScheduledAt.Equal(at) && string(f.Payload) == `{"once":true}`
			})
		})
	})

	t.Run("Backfill", func(t *testing.T) {
		id := "backfill/minutely"
		if _, err := n.c.PutTask(ctx, handlerTask(id, "0 * * * * *"), 0); err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC().Truncate(time.Minute)
		path := "/v1/tasks/backfill%2Fminutely/backfill"
		for _, bad := range []struct{ body, want string }{
			{`{}`, "from: required"},
			{fmt.Sprintf(`{"from": %q, "to": %q}`, now.Format(time.RFC3339), now.Add(-time.Hour).Format(time.RFC3339)), "is not after from"},
			{fmt.Sprintf(`{"from": %q, "to": %q}`, now.Add(-time.Hour).Format(time.RFC3339), now.Add(time.Hour).Format(time.RFC3339)), "is in the future"},
			{fmt.Sprintf(`{"from": %q, "to": %q}`, now.AddDate(0, 0, -8).Format(time.RFC3339), now.Format(time.RFC3339)), "more than 10000 scheduled times"},
			{fmt.Sprintf(`{"from": %q, "to": %q, "concurrency": 33}`, now.Add(-time.Hour).Format(time.RFC3339), now.Format(time.RFC3339)), "concurrency: 33 is not within 1-32"},
			// An explicit 0 is no request for the default (it was taken as 1).
			{fmt.Sprintf(`{"from": %q, "to": %q, "concurrency": 0}`, now.Add(-time.Hour).Format(time.RFC3339), now.Format(time.RFC3339)), "concurrency: 0 is not within 1-32"},
		} {
			wantError(t, call(t, ts, "POST", path, bad.body), http.StatusBadRequest, bad.want)
		}
		wantError(t, call(t, ts, "POST", "/v1/tasks/backfill%2Fnone/backfill",
			fmt.Sprintf(`{"from": %q, "to": %q}`, now.Add(-time.Hour).Format(time.RFC3339), now.Format(time.RFC3339))), http.StatusNotFound)
		from, to := now.Add(-10*time.Minute), now.Add(-time.Minute)
		b, err := n.c.Backfill(ctx, id, from, to, 2)
		if err != nil {
			t.Fatal(err)
		}
		if b.Fires != 10 || b.State != task.BackfillRunning {
			t.Fatalf("backfill record %+v, want 10 fires running", b)
		}
		etcdtest.WaitFor(t, 20*time.Second, func() bool {
			got, err := n.c.GetTask(ctx, id)
			return err == nil && got.State != nil && got.State.Backfill != nil && got.State.Backfill.State == task.BackfillDone
		})
		for at := from; !at.After(to); at = at.Add(time.Minute) {
			if !n.fires.fired(id, at) {
				t.Errorf("the backfill did not fire %s", at.Format(time.TimeOnly))
			}
		}
		got, _ := n.c.GetTask(ctx, id)
		if bf := got.State.Backfill; bf.Done != 10 || !bf.Through.Equal(to) {
			t.Errorf("final record %+v", bf)
		}
	})

	// A backfill asked for while another of the task runs is a 409 that
	// says how far that one is, in the API's words: it read "registry: a
	// backfill of the task is running".
	t.Run("BackfillWhileOneRuns", func(t *testing.T) {
		release, started := make(chan struct{}), make(chan struct{}, 1)
		n.e.Handle("block", func(ctx context.Context, f engine.Fire) error {
			select {
			case started <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})
		defer close(release)
		id := "backfill/blocked"
		yearly := &task.Task{ID: id, Schedule: "0 0 0 1 1 *", Executor: task.Executor{Type: task.ExecutorHandler, Name: "block"}}
		etcdtest.WaitFor(t, 10*time.Second, func() bool { _, err := n.c.PutTask(ctx, yearly, 0); return err == nil }) // once the node published the handler
		now := time.Now().UTC()
		from := time.Date(now.Year()-2, 1, 1, 0, 0, 0, 0, time.UTC) // 3 fires: 1 January of 2 years ago, last year and this year
		body := fmt.Sprintf(`{"from": %q, "to": %q}`, from.Format(time.RFC3339), now.Truncate(time.Second).Format(time.RFC3339))
		path := "/v1/tasks/backfill%2Fblocked/backfill"
		if a := call(t, ts, "POST", path, body); a.status != http.StatusAccepted {
			t.Fatalf("first backfill: %v", a)
		}
		select {
		case <-started: // its first fire runs, and holds the backfill
		case <-time.After(20 * time.Second):
			t.Fatal("the backfill's first fire did not start")
		}
		a := call(t, ts, "POST", path, body)
		wantError(t, a, http.StatusConflict,
			`task "backfill/blocked": another backfill of it is running (0 of its 3 fires done): wait until it is done (task get shows its progress) or cancel it (task backfill --cancel, POST backfill:cancel)`)
		if strings.Contains(string(a.body), "registry") {
			t.Errorf("the error names an internal package: %s", a.body)
		}

		// A cancel takes no body (or {}), as a resume: a backfill's body
		// sent to it by mistake, or garbage, is a 400 and cancels nothing.
		// It was ignored, and the backfill canceled.
		for _, bad := range []string{body, "garbage", `{"concurrency": 2}`} {
			if a := call(t, ts, "POST", path+":cancel", bad); a.status != http.StatusBadRequest {
				t.Errorf("cancel with the body %s: %v, want 400", bad, a)
			}
		}
		if got, err := n.c.GetTask(ctx, id); err != nil || got.State == nil || got.State.Backfill == nil ||
			got.State.Backfill.State != task.BackfillRunning {
			t.Fatalf("after the refused cancels: %+v, %v; want the backfill running", got, err)
		}

		// Canceled, it is over: a second cancel finds none running, and
		// a new backfill of the task is taken.
		a = call(t, ts, "POST", path+":cancel", "{}")
		var bf task.Backfill
		if a.status != http.StatusOK || json.Unmarshal(a.body, &bf) != nil || bf.State != task.BackfillCanceled || bf.Fires != 3 {
			t.Fatalf("cancel: %v, want 200 with the record canceled", a)
		}
		wantError(t, call(t, ts, "POST", path+":cancel", ""), http.StatusConflict,
			`task "backfill/blocked": its latest backfill is canceled, not running (0 of its 3 fires done)`)
		wantError(t, call(t, ts, "POST", "/v1/tasks/backfill%2Fnone/backfill:cancel", ""), http.StatusNotFound,
			`task "backfill/none" not found`)
		if a := call(t, ts, "POST", path, body); a.status != http.StatusAccepted {
			t.Errorf("a backfill after the cancel: %v, want 202", a)
		}
	})
}
