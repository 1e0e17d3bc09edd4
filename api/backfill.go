package api

import (
	"errors"
	"net/http"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// backfillTask: POST /v1/tasks/{id}/backfill, run every scheduled time of
// the task in [from, to]. The request is written to etcd, where the task's
// owner finds it as it finds triggers (and a new owner after a hand-over,
// with its progress); 202 with the record, 409 while another backfill of
// the task runs.
func (s *Server) backfillTask(w http.ResponseWriter, r *http.Request) {
	id := pathID(r)
	var req client.BackfillRequest
	if !readSmallJSON(w, r, &req) {
		return
	}
	concurrency := 0 // the default
	if c := req.Concurrency; c != nil {
		if *c == 0 {
			s.fail(w, r, id, task.Invalid("concurrency", "0 is not within 1-%d (leave it out for the default, %d)",
				task.MaxBackfillConcurrency, task.DefaultBackfillConcurrency))
			return
		}
		concurrency = *c
	}
	b, err := s.reg.Backfill(r.Context(), id, req.From, req.To, concurrency)
	var running *registry.BackfillRunningError
	switch {
	case errors.As(err, &running):
		writeError(w, http.StatusConflict, "task %q: another backfill of it is running (%s): wait until it is done (task get shows its progress) or cancel it (task backfill --cancel, POST backfill:cancel)",
			id, running.Progress())
		return
	case errors.Is(err, registry.ErrVersionMismatch):
		writeError(w, http.StatusConflict, "task %q or its backfill changed meanwhile: try again", id)
		return
	}
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	writeJSON(w, http.StatusAccepted, b)
}

// cancelBackfill: POST /v1/tasks/{id}/backfill:cancel, cancel the task's
// running backfill; 200 with its record, marked canceled, 404 no such
// task, 409 no backfill of it running. It takes no body, or {}, as a
// resume: another (a backfill's body sent here by mistake) is a 400 and
// cancels nothing.
func (s *Server) cancelBackfill(w http.ResponseWriter, r *http.Request) {
	id := pathID(r)
	if !readSmallJSON(w, r, &struct{}{}) {
		return
	}
	if _, err := s.reg.Get(r.Context(), id); err != nil {
		s.fail(w, r, id, err)
		return
	}
	b, err := s.reg.CancelBackfill(r.Context(), id)
	var none *registry.NoBackfillRunningError
	if errors.As(err, &none) {
		if none.Latest == nil {
			writeError(w, http.StatusConflict, "task %q has no backfill to cancel", id)
		} else {
			writeError(w, http.StatusConflict, "task %q: its latest backfill is %s, not running (%d of its %d fires done)",
				id, none.Latest.State, none.Latest.Done, none.Latest.Fires)
		}
		return
	}
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	writeJSON(w, http.StatusOK, b)
}
