package api

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

func decodePreview(t *testing.T, a answer) *client.Preview {
	t.Helper()
	if a.status != http.StatusOK {
		t.Fatalf("preview: %v", a)
	}
	var p client.Preview
	if err := json.Unmarshal(a.body, &p); err != nil {
		t.Fatalf("decode preview %s: %v", a.body, err)
	}
	return &p
}

// TestServer_PreviewAndDryRun: POST /v1/schedules:preview, GET
// /v1/tasks/{id}/next and PUT ?dry_run=1 answer the same times from one
// computation, within the task's window; bad input is a 400 naming the
// field; a dry run writes nothing.
func TestServer_PreviewAndDryRun(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	ts := n.ts
	ctx := context.Background()
	now := time.Now()

	t.Run("Preview", func(t *testing.T) {
		p := decodePreview(t, call(t, ts, "POST", "/v1/schedules:preview", `{"schedule": "@every 10s", "count": 3}`))
		if len(p.Next) != 3 || p.Timezone != "UTC" || p.Ended != "" || p.Due != nil {
			t.Fatalf("preview %+v", p)
		}
		first, err := time.Parse(time.RFC3339, p.Next[0])
		if err != nil || !first.After(now) || first.Unix()%10 != 0 || first.Sub(now) > 11*time.Second {
			t.Fatalf("first time %s (%v)", p.Next[0], err)
		}
		// The default count, and the zone the times are written in.
		p = decodePreview(t, call(t, ts, "POST", "/v1/schedules:preview", `{"schedule": "0 9 * * *", "timezone": "Asia/Tokyo"}`))
		if len(p.Next) != 5 || p.Timezone != "Asia/Tokyo" || p.Next[0][len(p.Next[0])-6:] != "+09:00" {
			t.Fatalf("preview in Tokyo %+v", p)
		}
	})

	t.Run("PreviewWindow", func(t *testing.T) {
		p := decodePreview(t, call(t, ts, "POST", "/v1/schedules:preview",
			`{"schedule": "0 0 * * *", "not_before": "2030-01-01T00:00:00Z", "not_after": "2030-01-03T12:00:00Z", "count": 10}`))
		if want := []string{"2030-01-01T00:00:00Z", "2030-01-02T00:00:00Z", "2030-01-03T00:00:00Z"}; !slices.Equal(p.Next, want) || p.Ended != task.EndedNotAfter {
			t.Fatalf("preview %+v, want %v ended not_after", p, want)
		}
		// max_fires counts from created_at: 2 or 3 of a minute's 6 times
		// are past.
		created := time.Now().Add(-25 * time.Second).UTC().Truncate(10 * time.Second).Add(5 * time.Second)
		p = decodePreview(t, call(t, ts, "POST", "/v1/schedules:preview",
			`{"schedule": "@every 10s", "max_fires": 6, "created_at": "`+created.Format(time.RFC3339)+`", "count": 10}`))
		if last := created.Add(55 * time.Second).Format(time.RFC3339); len(p.Next) < 3 || len(p.Next) > 4 || p.Next[len(p.Next)-1] != last || p.Ended != task.EndedMaxFires {
			t.Fatalf("preview %+v, want 3 or 4 times to %s, ended max_fires", p, last)
		}
		// One yet to come counts from now, as the create that takes it as
		// now: the preview promised 2030's times.
		p = decodePreview(t, call(t, ts, "POST", "/v1/schedules:preview",
			`{"schedule": "@hourly", "max_fires": 2, "created_at": "2030-05-01T10:30:00Z"}`))
		if len(p.Next) != 2 || p.Ended != task.EndedMaxFires || p.Next[0] > time.Now().UTC().Add(time.Hour).Format(time.RFC3339) {
			t.Fatalf("preview %+v, want the next 2 hours from now, ended max_fires", p)
		}
		p = decodePreview(t, call(t, ts, "POST", "/v1/schedules:preview", `{"schedule": "@at 2030-06-01T09:00:00", "timezone": "Europe/Berlin"}`))
		if want := []string{"2030-06-01T09:00:00+02:00"}; !slices.Equal(p.Next, want) || p.Ended != task.EndedAt {
			t.Fatalf("preview %+v, want %v ended at", p, want)
		}
	})

	t.Run("PreviewJitter", func(t *testing.T) {
		p := decodePreview(t, call(t, ts, "POST", "/v1/schedules:preview",
			`{"schedule": "H * * * *", "id": "billing/invoice-42", "jitter": "30s", "count": 2}`))
		if len(p.Next) != 2 || len(p.Due) != 2 {
			t.Fatalf("preview %+v", p)
		}
		for i := range p.Next {
			sched, _ := time.Parse(time.RFC3339, p.Next[i])
			due, err := time.Parse(time.RFC3339Nano, p.Due[i])
			if want := sched.Add(engine.Delay("billing/invoice-42", sched.UnixNano(), 30000)); err != nil || !due.Equal(want) {
				t.Errorf("due %s, want %s (the owner's jitter)", p.Due[i], want.Format(time.RFC3339Nano))
			}
		}
	})

	t.Run("PreviewInvalid", func(t *testing.T) {
		for _, tc := range []struct {
			name, body string
			want       []string
		}{
			{"bad cron", `{"schedule": "61 * * * * *"}`, []string{"schedule:", "second 61 out of range"}},
			{"no schedule", `{"count": 3}`, []string{"schedule: required"}},
			{"unknown zone", `{"schedule": "@hourly", "timezone": "Mars/Olympus"}`, []string{"timezone:", "Mars/Olympus"}},
			{"count 0", `{"schedule": "@hourly", "count": 0}`, []string{"count: want a whole number from 1 to 100, got 0"}},
			{"count too many", `{"schedule": "@hourly", "count": 101}`, []string{"count:", "101"}},
			{"count a string", `{"schedule": "@hourly", "count": "5"}`, []string{"count:"}},
			{"unknown field", `{"schedule": "@hourly", "executor": {"type": "noop"}}`, []string{"executor: unknown field"}},
			{"H without an id", `{"schedule": "H * * * *"}`, []string{"id: required with H fields or a jitter"}},
			{"jitter without an id", `{"schedule": "@hourly", "jitter": "1m"}`, []string{"id: required"}},
			{"jitter too long", `{"schedule": "@every 10s", "id": "x", "jitter": "1m"}`, []string{"jitter:", "shortest interval"}},
			{"window backwards", `{"schedule": "@hourly", "not_before": "2030-01-02T00:00:00Z", "not_after": "2030-01-01T00:00:00Z"}`, []string{"not_after:", "is not after not_before"}},
			{"bad @at", `{"schedule": "@at tomorrow"}`, []string{"schedule:", "RFC 3339"}},
			{"not an object", `[1]`, []string{"JSON object"}},
			{"bad created_at", `{"schedule": "@hourly", "created_at": "x"}`, []string{"created_at:"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				wantError(t, call(t, ts, "POST", "/v1/schedules:preview", tc.body), http.StatusBadRequest, tc.want...)
			})
		}
	})

	t.Run("NextSharesThePreview", func(t *testing.T) {
		body := `{"schedule": "H/15 * * * *", "timezone": "America/New_York", "jitter": "10s", "max_fires": 3, "executor": {"type": "noop"}}`
		stored := decodeTask(t, call(t, ts, "PUT", "/v1/tasks/shared", body))
		next := decodePreview(t, call(t, ts, "GET", "/v1/tasks/shared/next?count=10", ""))
		p, err := n.c.Preview(ctx, client.PreviewRequest{Schedule: stored.Schedule, Timezone: stored.Timezone, ID: "shared",
			Jitter: stored.Jitter, MaxFires: 3, CreatedAt: stored.CreatedAt, Count: 10})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(next.Next, p.Next) || !slices.Equal(next.Due, p.Due) || len(p.Next) != 3 || p.Ended != task.EndedMaxFires {
			t.Fatalf("next %+v, preview %+v", next, p)
		}
	})

	t.Run("DryRun", func(t *testing.T) {
		a := call(t, ts, "PUT", "/v1/tasks/dry?dry_run=1", `{"schedule": "@at 2030-01-01T00:00:00Z", "executor": {"type": "noop"}, "delete_after_fire": true}`)
		if a.status != http.StatusOK {
			t.Fatalf("dry run: %v", a)
		}
		var d client.DryRun
		if err := json.Unmarshal(a.body, &d); err != nil {
			t.Fatal(err)
		}
		if !d.DryRun || d.Task == nil || d.Task.ID != "dry" || d.Task.Timeout != task.Duration(time.Minute) || d.Task.Version != 0 ||
			d.Preview == nil || !slices.Equal(d.Preview.Next, []string{"2030-01-01T00:00:00Z"}) {
			t.Fatalf("dry run answered %s", a.body)
		}
		wantError(t, call(t, ts, "PUT", "/v1/tasks/dry?dry_run=1", `{"schedule": "@hourly", "executor": {"type": "noop"}, "delete_after_fire": true}`),
			http.StatusBadRequest, "delete_after_fire:", "never ends")
		wantError(t, call(t, ts, "PUT", "/v1/tasks/dry?dry_run=yes", noopJSON("")), http.StatusBadRequest, `dry_run: "yes" is not a boolean`)
		wantError(t, call(t, ts, "PUT", "/v1/tasks/dry?dry_run=1", noopJSON(""), "If-Match", "7"), http.StatusPreconditionFailed)
		if a := call(t, ts, "GET", "/v1/tasks/dry", ""); a.status != http.StatusNotFound {
			t.Fatalf("GET after a dry run: %v", a)
		}
		// The client, on a stored task: its version, and If-Match checked.
		stored := decodeTask(t, call(t, ts, "PUT", "/v1/tasks/dry2", noopJSON("")))
		got, err := n.c.CheckTask(ctx, &task.Task{ID: "dry2", Schedule: "@daily", Executor: task.Executor{Type: task.ExecutorNoop}}, client.PutOptions{IfVersion: stored.Version})
		if err != nil || got.Task.Version != stored.Version || got.Task.Schedule != "@daily" || len(got.Preview.Next) != 5 {
			t.Fatalf("CheckTask: %+v, %v", got, err)
		}
		if again := decodeTask(t, call(t, ts, "GET", "/v1/tasks/dry2", "")); again.Schedule != "0 0 1 1 *" || again.Version != stored.Version {
			t.Fatalf("a dry run changed the task: %+v", again)
		}
	})

	t.Run("EndedState", func(t *testing.T) {
		past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
		decodeTask(t, call(t, ts, "PUT", "/v1/tasks/ended", `{"schedule": "@at `+past+`", "misfire": "skip", "executor": {"type": "noop"}}`))
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			got := decodeTask(t, call(t, ts, "GET", "/v1/tasks/ended", ""))
			return got.State != nil && got.State.Ended == task.EndedAt && got.State.NextFireAt.IsZero()
		})
	})
}
