package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// rfc3339Milli is the format of times the API writes itself (trigger's
// scheduled_at): RFC 3339 in UTC with milliseconds.
const rfc3339Milli = "2006-01-02T15:04:05.000Z07:00"

// putTask: PUT /v1/tasks/{id}, create or replace, with If-Match.
func (s *Server) putTask(w http.ResponseWriter, r *http.Request) {
	id := pathID(r)
	// Before withPathID, whose JSON would replace an invalid byte and
	// explain the id as differing from the body's.
	if err := task.CheckID(id); err != nil {
		s.fail(w, r, id, err)
		return
	}
	ifVersion, err := parseIfMatch(r.Header.Get("If-Match"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	dry, err := parseFlag(r, "dry_run")
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	body, ok := readBodyOr(w, r, task.MaxTaskSize, "task JSON is more than %d bytes (64 KiB), the limit of a task", task.MaxTaskSize)
	if !ok {
		return
	}
	body, err = withPathID(body, id)
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	t, err := task.DecodeTask(body)
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	if t.ID != id { // withPathID made them equal; defensive against a decoder that disagrees
		writeError(w, http.StatusBadRequest, "id: %q in the body differs from %q in the path", t.ID, id)
		return
	}
	warning, err := s.runnable(r.Context(), t, nil)
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	allowMissing, err := parseFlag(r, "allow_missing_targets")
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if warning != "" {
		w.Header().Set(client.WarningHeader, warning)
	}
	if dry {
		s.dryRun(w, r, t, registry.PutOptions{IfVersion: ifVersion, AllowMissingTargets: allowMissing})
		return
	}
	stored, err := s.reg.Put(r.Context(), t, registry.PutOptions{IfVersion: ifVersion, AllowMissingTargets: allowMissing})
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	// Only a local state: the owner has likely not seen this write yet,
	// and asking another node would slow every write down.
	stored.State = s.localState(r.Context(), id)
	writeTask(w, http.StatusOK, stored)
}

// runnable refuses (*task.ValidationError) a task that no live node can
// run, and returns a warning when only some can. rs caches the nodes'
// capabilities across the tasks of a batch; nil reads them.
func (s *Server) runnable(ctx context.Context, t *task.Task, rs **registry.Runners) (string, error) {
	if !registry.NeedsRunner(t) {
		return "", nil
	}
	if rs == nil || *rs == nil {
		got, err := s.reg.Runners(ctx)
		if err != nil {
			return "", err
		}
		if rs == nil {
			return got.Check(t)
		}
		*rs = &got
	}
	return (*rs).Check(t)
}

// parseIfMatch reads If-Match: a version, plain (123) or quoted ("123").
// Empty means no condition.
func parseIfMatch(h string) (int64, error) {
	v := strings.TrimSpace(h)
	if v == "" {
		return 0, nil
	}
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("If-Match: want a task version such as 123 or \"123\" (the \"version\" or ETag of a GET), got %q", h)
	}
	return n, nil
}

// withPathID makes the body's id the path's: it is added when the body
// leaves it out (or null), and refused when it differs. A body that gives
// a name twice is refused (task.CheckNames) before it is read, since
// encoding it again would keep one of the two and hide the other from
// DecodeTask. A body that is not a JSON object with a string id is
// returned as is, for DecodeTask to explain what is wrong with it.
func withPathID(body []byte, id string) ([]byte, error) {
	if !utf8.Valid(body) {
		return body, nil // json.Unmarshal would replace the bad bytes and hide them
	}
	if err := task.CheckNames(body); err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil || obj == nil {
		return body, nil
	}
	if raw, ok := obj["id"]; ok && string(raw) != "null" {
		var bodyID string
		if json.Unmarshal(raw, &bodyID) != nil {
			return body, nil
		}
		if bodyID != id {
			return nil, &task.ValidationError{Field: "id", Reason: fmt.Sprintf(
				"%q in the body differs from %q in the path (leave id out of the body or make them equal; ids with \"/\" are path-escaped in the URL)",
				bodyID, id)}
		}
		return body, nil
	}
	raw, err := json.Marshal(id)
	if err != nil {
		return nil, err
	}
	obj["id"] = raw
	// Without HTML escaping, which would grow "<" to "\u003c" and could
	// push a task near the size limit over it.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(obj); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// getTask: GET /v1/tasks/{id}, with the state from its owner.
func (s *Server) getTask(w http.ResponseWriter, r *http.Request) {
	id := pathID(r)
	t, err := s.reg.Get(r.Context(), id)
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	t.State = s.taskState(r.Context(), id)
	s.addRecords(r.Context(), t)
	writeTask(w, http.StatusOK, t)
}

// pauseInState shows the task's pause record in the state its owner gave,
// as a task's answer does (addRecords); a state missing stays missing.
func pauseInState(t *task.Task) {
	if t.State != nil {
		t.State.Pause = t.Pause
	}
}

// addRecords shows in the task's state what etcd records of it besides
// its definition: its pause record and its latest backfill (issue 12).
func (s *Server) addRecords(ctx context.Context, t *task.Task) {
	bf, err := s.reg.GetBackfill(ctx, t.ID)
	if err != nil {
		s.log.Warn("api: reading a task's backfill failed", "task", t.ID, "err", err)
	}
	if bf == nil && t.Pause == nil {
		return
	}
	if t.State == nil {
		t.State = &task.State{} // the owner did not answer: the records still show
	}
	t.State.Pause, t.State.Backfill = t.Pause, bf
}

// parseFlag reads a boolean query parameter: absent is false.
func parseFlag(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	switch v {
	case "1", "true":
		return true, nil
	case "0", "false":
		return false, nil
	}
	return false, fmt.Errorf("%s: %q is not a boolean (1, true, 0, false)", name, v)
}

// localState is the task's state when this node owns it, else nil.
func (s *Server) localState(ctx context.Context, id string) *task.State {
	if !s.e.Owns(s.reg.Partition(id)) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, stateTimeout)
	defer cancel()
	st, ok := s.e.TaskState(ctx, id)
	if !ok {
		return nil
	}
	return st
}

// taskState is the task's state from the node that owns it: this one, or
// the ring's owner asked over HTTP. nil when no node owns the partition
// (it is moving); only the owner and why when the owner does not answer
// with one (State.OwnerError): a GET never fails for it.
func (s *Server) taskState(ctx context.Context, id string) *task.State {
	p := s.reg.Partition(id)
	if s.e.Owns(p) {
		return s.localState(ctx, id)
	}
	a := s.e.Assignment()
	if a == nil {
		return nil
	}
	owner := a.Owner(p)
	if owner == "" || owner == s.e.NodeID() {
		return nil // this node is about to own it, not yet
	}
	c := s.peerClient(ctx, owner)
	if c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, peerTimeout)
	defer cancel()
	st, err := c.TaskState(ctx, id)
	if err != nil {
		var ae *client.Error
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			return nil // the owner has not loaded it yet
		}
		s.warnPeer(owner, "api: the owner of a task did not give its state", "task", id, "err", err)
		return &task.State{Owner: owner, OwnerError: err.Error()}
	}
	return st
}

// taskStateHandler: GET /v1/tasks/{id}/state (extension), the state of a
// task this node owns; 404 when it does not own it or has not loaded it.
func (s *Server) taskStateHandler(w http.ResponseWriter, r *http.Request) {
	id := pathID(r)
	p := s.reg.Partition(id)
	if !s.e.Owns(p) {
		writeError(w, http.StatusNotFound, "node %s does not own task %q (partition %d)", s.e.NodeID(), id, p)
		return
	}
	st := s.localState(r.Context(), id)
	if st == nil {
		writeError(w, http.StatusNotFound, "node %s owns partition %d but holds no task %q", s.e.NodeID(), p, id)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// deleteTask: DELETE /v1/tasks/{id}, with If-Match.
func (s *Server) deleteTask(w http.ResponseWriter, r *http.Request) {
	id := pathID(r)
	ifVersion, err := parseIfMatch(r.Header.Get("If-Match"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if ifVersion > 0 {
		err = s.reg.DeleteIfVersion(r.Context(), id, ifVersion)
		if errors.Is(err, registry.ErrNotFound) {
			err = registry.ErrVersionMismatch // as a PUT with If-Match of a missing task
		}
	} else {
		err = s.reg.Delete(r.Context(), id)
	}
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// listTasks: GET /v1/tasks?prefix=&label=k=v&limit=&cursor=&state=&status=,
// answered from the registry's index in id order (with status, by the
// owners: listByStatus). The page is streamed as it is read, never built
// whole: a page of 10 000 tasks costs the memory of a few hundred. Without
// state, each task is its stored JSON with partition and version added
// (Registry.ListJSON), not decoded and encoded again. With
// state=1 each task carries its state from its owner, asked for a chunk
// of the page at once. An error after the first task has been sent cuts
// the answer off, so that a client sees it fail instead of taking it for
// a page.
func (s *Server) listTasks(w http.ResponseWriter, r *http.Request) {
	opts, err := parseListQuery(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	// Read before the status filter, whose tasks always carry their
	// state: a bad flag is refused with a status as without one.
	withState, err := parseFlag(r, "state")
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	q := r.URL.Query()
	if q.Has("status") {
		st, err := task.ParseStatus(q.Get("status"))
		if err != nil {
			s.fail(w, r, "", err)
			return
		}
		s.listByStatus(w, r, opts, st)
		return
	}
	jw := newJSONStream(w)
	var chunk []*task.Task // tasks waiting for their states
	flush := func() error {
		s.fillStates(r.Context(), chunk)
		for _, t := range chunk {
			if jw.n == 0 {
				jw.begin(`{"tasks":[`)
			}
			if err := jw.item(t); err != nil {
				return err
			}
		}
		clear(chunk)
		chunk = chunk[:0]
		return nil
	}
	var next string
	if withState {
		next, err = s.reg.ListFunc(r.Context(), opts, func(t *task.Task) error {
			if chunk = append(chunk, t); len(chunk) == statesChunk {
				return flush()
			}
			return nil
		})
	} else {
		// Each task as stored, with its partition and version: the
		// bytes encoding the decoded task would give, without decoding it.
		next, err = s.reg.ListJSON(r.Context(), opts, func(t []byte) error {
			if jw.n == 0 {
				jw.begin(`{"tasks":[`)
			}
			return jw.raw(t)
		})
	}
	if err == nil && len(chunk) > 0 {
		err = flush()
	}
	if err != nil {
		if jw.n == 0 {
			s.fail(w, r, "", err)
			return
		}
		s.log.Warn("api: list failed after its first tasks were sent; cutting the answer off", "err", err)
		jw.abort()
	}
	if jw.n == 0 {
		jw.begin(`{"tasks":[`)
	}
	cur, _ := json.Marshal(next)
	jw.end(`],"next_cursor":` + string(cur) + "}\n")
}

// exportTasks: GET /v1/tasks:export?prefix=&label=k=v, every matching task
// as JSON Lines (the task as stored: what POST /v1/tasks:batch and
// 'shardcron import' read back unchanged), all read at one etcd revision,
// streamed: in id order with a prefix or labels, by partition and then id
// for the whole fleet (one read per task instead of two, see Registry.Export).
func (s *Server) exportTasks(w http.ResponseWriter, r *http.Request) {
	opts, err := parseListQuery(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	jw := newJSONStream(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	n, _, err := s.reg.Export(r.Context(), task.Selector{Prefix: opts.Prefix, Labels: opts.Labels}, func(task []byte) error {
		if jw.n == 0 {
			jw.begin("")
			// The answer begins now, not a chunk later: a client bounds
			// its wait for the headers (shardcron task export's --timeout).
			_ = http.NewResponseController(w).Flush()
		}
		return jw.line(task)
	})
	if err != nil {
		if jw.n == 0 {
			s.fail(w, r, "", err)
			return
		}
		s.log.Warn("api: export failed after its first tasks were sent; cutting the answer off", "exported", n, "err", err)
		jw.abort()
	}
	if jw.n == 0 {
		jw.begin("")
	}
	jw.end("")
}

func parseListQuery(r *http.Request) (registry.ListOptions, error) {
	q := r.URL.Query()
	opts := registry.ListOptions{Prefix: q.Get("prefix"), Cursor: q.Get("cursor")}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return opts, fmt.Errorf("label: want key=value (e.g. label=team=billing), got %q", l)
		}
		if opts.Labels == nil {
			opts.Labels = map[string]string{}
		}
		if old, dup := opts.Labels[k]; dup && old != v {
			return opts, fmt.Errorf("label: %q is given twice, with %q and %q: no task has both", k, old, v)
		}
		opts.Labels[k] = v
	}
	n, err := parseLimit(q.Get("limit"), DefaultListLimit, MaxListLimit)
	if err != nil {
		return opts, err
	}
	opts.Limit = n
	return opts, checkFilter(opts.Prefix, opts.Labels, "label")
}

// checkFilter refuses (*task.ValidationError) a prefix or a label key that
// no task can match, by the task model's own rules, instead of answering
// that nothing matches: the prefix as the start of an id
// (task.CheckPrefix), each label key as a task's (task.CheckLabelKey). labelField names the labels
// in the error, "label" in a query. Label values are not checked: tasks
// stored before values lost their control characters keep them, and must
// stay findable.
func checkFilter(prefix string, labels map[string]string, labelField string) error {
	if err := task.CheckPrefix(prefix); err != nil {
		return err
	}
	var ve *task.ValidationError // what CheckLabelKey returns
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if errors.As(task.CheckLabelKey(k), &ve) {
			return task.Invalid(labelField, "no task can carry it: %s", ve.Reason)
		}
	}
	return nil
}

// parseLimit reads a limit parameter: def when empty, else 1 to max.
func parseLimit(v string, def, max int) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > max {
		return 0, fmt.Errorf("limit: want a whole number from 1 to %d, got %q", max, v)
	}
	return n, nil
}

// pauseTask and resumeTask: POST /v1/tasks/{id}/pause, with an optional
// body {"note": "..."}, and /resume, which takes none (or {}). A body of
// another shape is refused with 400 and the task left as it was.
func (s *Server) pauseTask(w http.ResponseWriter, r *http.Request)  { s.setPaused(w, r, true) }
func (s *Server) resumeTask(w http.ResponseWriter, r *http.Request) { s.setPaused(w, r, false) }

func (s *Server) setPaused(w http.ResponseWriter, r *http.Request, paused bool) {
	id := pathID(r)
	var t *task.Task
	var err error
	if paused {
		var req pauseRequest
		if !readSmallJSON(w, r, &req) {
			return
		}
		t, err = s.reg.Pause(r.Context(), id, task.Pause{Note: req.Note, By: s.caller(r)})
	} else {
		// No body, or {}: garbage must not pass for a resume.
		if !readSmallJSON(w, r, &struct{}{}) {
			return
		}
		t, err = s.reg.SetPaused(r.Context(), id, false)
	}
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	t.State = s.localState(r.Context(), id)
	s.addRecords(r.Context(), t)
	writeTask(w, http.StatusOK, t)
}

// pauseRequest is the optional body of POST /v1/tasks/{id}/pause.
type pauseRequest struct {
	Note string `json:"note"`
}

// caller names who sent a request, for a pause record: tokens are not
// named, so "token" when the node requires one (only the full token may
// write), else "anonymous".
func (s *Server) caller(*http.Request) string {
	if s.cfg.AuthToken != "" {
		return "token"
	}
	return "anonymous"
}

// maxSmallBody bounds the JSON bodies of pause, trigger and backfill.
const maxSmallBody = 2*task.MaxOverrideSize + 1024

// readSmallJSON decodes an optional JSON object body into dst (an empty
// body leaves it zero), refusing unknown fields; it answers 400 itself,
// with the fields the request takes, and returns false on a bad body.
func readSmallJSON(w http.ResponseWriter, r *http.Request, dst any) bool {
	body, ok := readBodyOr(w, r, maxSmallBody, "the request body is more than %d bytes", maxSmallBody)
	if !ok {
		return false
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return true
	}
	if err := decodeObject(body, dst); err != nil {
		writeError(w, http.StatusBadRequest, "the request body is not the JSON object expected: %v (this request takes %s)", err, bodyFields(dst))
		return false
	}
	return true
}

// triggerTask: POST /v1/tasks/{id}/trigger, fire once now, with an
// optional body {"body": "..."} (http tasks) or {"payload": ...} (handler
// tasks) replacing the task's for that one fire.
func (s *Server) triggerTask(w http.ResponseWriter, r *http.Request) {
	id := pathID(r)
	var o task.Override
	if !readSmallJSON(w, r, &o) {
		return
	}
	at, err := s.reg.TriggerWith(r.Context(), id, &o)
	if errors.Is(err, registry.ErrVersionMismatch) {
		writeError(w, http.StatusConflict, "task %q changed while its override was checked: try again", id)
		return
	}
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	writeJSON(w, http.StatusAccepted, client.TriggerResponse{ScheduledAt: at.UTC().Format(rfc3339Milli)})
}

// healthz: the process answers.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyResponse is the answer of GET /readyz.
type readyResponse struct {
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"` // the reason again, as every error answer has it
}

// readyz: ready once the node owns its partitions and is not fenced.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	var reason string
	switch {
	case s.e.Fenced():
		reason = "fenced: the node's session is past its fencing deadline or gone; it dispatches nothing until it rejoins"
	case !s.e.Ready():
		reason = "acquiring partitions: the node does not own every partition the ring gives it yet"
	}
	if reason != "" {
		writeJSON(w, http.StatusServiceUnavailable, readyResponse{Status: "not ready", Reason: reason, Error: "not ready: " + reason})
		return
	}
	writeJSON(w, http.StatusOK, readyResponse{Status: "ready"})
}
