package api

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// Schedule previews: the next fire times of a schedule as its owner would
// compute them (H fields, the time zone's DST rules, the window, jitter),
// from one function for GET /v1/tasks/{id}/next, POST
// /v1/schedules:preview and PUT /v1/tasks/{id}?dry_run=1.

// maxNextFires bounds the count of a preview.
const maxNextFires = 100

// defaultNextFires is the count of a preview that gives none.
const defaultNextFires = 5

// preview computes the first n fire times of the validated task t after
// from. max_fires counts from not_before, else created_at, else from.
func preview(t *task.Task, from time.Time, n int) (*client.Preview, error) {
	zone := t.Timezone
	if zone == "" {
		zone = task.DefaultTimezone
	}
	sched, err := schedule.Parse(t.Schedule, zone, t.ID)
	if err != nil {
		return nil, fmt.Errorf("schedule of task %q: %w", t.ID, err)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("time zone of task %q: %w", t.ID, err)
	}
	win := t.Window(sched, from)
	p := &client.Preview{Timezone: zone, Next: []string{}}
	at := from
	if !win.From.IsZero() && at.Before(win.From) {
		at = win.From.Add(-time.Nanosecond) // not_before itself may fire
	}
	jitter := uint32(time.Duration(t.Jitter) / time.Millisecond)
	for len(p.Next) < n {
		at = sched.Next(at)
		if at.IsZero() || !win.Contains(at) {
			if !win.To.IsZero() {
				p.Ended = win.End
			}
			break
		}
		p.Next = append(p.Next, at.In(loc).Format(time.RFC3339))
		if jitter > 0 {
			due := at.Add(engine.Delay(t.ID, at.UnixNano(), jitter))
			p.Due = append(p.Due, due.In(loc).Format("2006-01-02T15:04:05.000Z07:00"))
		}
	}
	return p, nil
}

// previewFields are the fields of a preview request: the task fields its
// times depend on, count, and created_at (what max_fires counts from
// without not_before; default now, and one yet to come counts as now).
var previewFields = []string{"schedule", "timezone", "id", "jitter", "not_before", "not_after", "max_fires", "count", "created_at"}

// previewSchedule: POST /v1/schedules:preview {schedule, timezone, id,
// jitter, not_before, not_after, max_fires, count, created_at} answers the
// next count (1-100, default 5) fire times from now, validated as a task's
// fields are.
func (s *Server) previewSchedule(w http.ResponseWriter, r *http.Request) {
	body, ok := readBodyOr(w, r, task.MaxTaskSize, "a preview request is at most %d bytes (64 KiB)", task.MaxTaskSize)
	if !ok {
		return
	}
	if err := task.CheckNames(body); err != nil {
		s.fail(w, r, "", err)
		return
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil || obj == nil {
		writeError(w, http.StatusBadRequest, "want a JSON object such as {\"schedule\": \"*/5 * * * *\", \"id\": \"billing/invoice-42\", \"count\": 5}")
		return
	}
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if !slices.Contains(previewFields, k) {
			writeError(w, http.StatusBadRequest, "%s: unknown field (want one of %s)", k, strings.Join(previewFields, ", "))
			return
		}
	}
	n := defaultNextFires
	if raw, ok := obj["count"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &n); err != nil || n < 1 || n > maxNextFires {
			writeError(w, http.StatusBadRequest, "count: want a whole number from 1 to %d, got %s", maxNextFires, raw)
			return
		}
	}
	var created time.Time
	if raw, ok := obj["created_at"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &created); err != nil {
			writeError(w, http.StatusBadRequest, "created_at: want an RFC 3339 time such as \"2027-01-01T00:00:00Z\", got %s", raw)
			return
		}
	}
	delete(obj, "count")
	delete(obj, "created_at")
	_, hasID := obj["id"]
	if !hasID {
		obj["id"] = json.RawMessage(`"preview"`)
	}
	obj["executor"] = json.RawMessage(`{"type": "noop"}`)
	asTask, err := json.Marshal(obj)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encode the preview: %v", err)
		return
	}
	t, err := task.DecodeTask(asTask)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	if !hasID && (strings.Contains(t.Schedule, "H") || t.Jitter > 0) {
		writeError(w, http.StatusBadRequest, "id: required with H fields or a jitter: both depend on the task id")
		return
	}
	now := time.Now()
	if created.Before(now) { // a create takes one yet to come as now
		t.CreatedAt = created
	}
	p, err := preview(t, now, n)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// dryRun answers PUT /v1/tasks/{id}?dry_run=1 for the decoded task t: what
// a PUT would store (or the error it would answer) and the next
// defaultNextFires times, writing nothing.
func (s *Server) dryRun(w http.ResponseWriter, r *http.Request, t *task.Task, opts registry.PutOptions) {
	checked, err := s.reg.Check(r.Context(), t, opts)
	if err != nil {
		s.fail(w, r, t.ID, err)
		return
	}
	p, err := preview(checked, time.Now(), defaultNextFires)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, client.DryRun{DryRun: true, Task: checked, Preview: p})
}
