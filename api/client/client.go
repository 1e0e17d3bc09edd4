package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardcron/shardcron/task"
)

// Client is a client of a node's API. Its fields may be set directly; a
// Client is safe for concurrent use once they are no longer changed.
type Client struct {
	// BaseURL is the node's address, e.g. "http://127.0.0.1:8080"; a bare
	// "host:port" means http, and a trailing slash is ignored.
	BaseURL string
	// Token, when not empty, is sent as "Authorization: Bearer <Token>".
	Token string
	// HTTP sends the requests; nil means http.DefaultClient. Requests are
	// bounded by their ctx only, unless HTTP has a Timeout.
	HTTP *http.Client
	// Warn, when set, receives the warnings of successful answers (the
	// Shardcron-Warning header: a task only some nodes can run).
	Warn func(string)
}

// NewClient returns a client of the node at baseURL, sending token when it
// is not empty, over http.DefaultClient.
func NewClient(baseURL, token string) *Client {
	return &Client{BaseURL: baseURL, Token: token}
}

// Error is a non-2xx answer of the API: its status and the message of its
// {"error": "..."} body (or the body's text when it is not that JSON).
// Errors returned by Client methods wrap it; use errors.As.
type Error struct {
	Status  int
	Message string
	// Foreign is set when the answer holds no shardcron error: what
	// answered is not a shardcron node (a wrong address), or a proxy in
	// front of one. Message then sums the answer up.
	Foreign bool
}

// Error returns the message and the status, e.g.
// `task "a" not found (HTTP 404)`.
func (e *Error) Error() string {
	if e.Foreign {
		return fmt.Sprintf("HTTP %d, not a shardcron node's answer: %s", e.Status, e.Message)
	}
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	return fmt.Sprintf("%s (HTTP %d)", msg, e.Status)
}

// ListOptions filter and page ListTasks; zero fields mean no filter.
type ListOptions struct {
	Prefix string            // only ids with this prefix
	Labels map[string]string // only tasks with all these labels
	Limit  int               // at most this many tasks (1-10000; 0: the server's default, 1000)
	Cursor string            // from a previous ListTasks's next cursor
	// Status keeps only the tasks with this status ("failing", "paused",
	// "stale"), as their owners see them; each then carries its state.
	Status string
	// State asks for each task's state from its owner (next fire, last
	// success and failure...). With Status it always comes.
	State bool
}

// PutTask creates or replaces t. It validates t first (applying the
// defaults, on a copy), returning the *task.ValidationError without a
// request when t is invalid. With ifVersion not zero, the server writes
// only if the stored version is ifVersion, else the error is an *Error
// with Status 412. It returns the task as stored.
func (c *Client) PutTask(ctx context.Context, t *task.Task, ifVersion int64) (*task.Task, error) {
	return c.PutTaskWith(ctx, t, PutOptions{IfVersion: ifVersion})
}

// PutTaskWith is PutTask with options.
func (c *Client) PutTaskWith(ctx context.Context, t *task.Task, o PutOptions) (*task.Task, error) {
	body, err := taskBody(t)
	if err != nil {
		return nil, err
	}
	return c.PutTaskJSONWith(ctx, t.ID, body, o)
}

// taskBody is the JSON of t to send: validated, without the output-only
// fields.
func taskBody(t *task.Task) ([]byte, error) {
	cp := *t
	// Validate fills the defaults: a zero Duration would otherwise be sent
	// as "0s", which the server refuses for fields where zero means default.
	if err := cp.Validate(); err != nil {
		return nil, err
	}
	cp.Partition, cp.Version, cp.State, cp.Pause = nil, 0, nil, nil
	cp.CreatedAt, cp.UpdatedAt = time.Time{}, time.Time{}
	body, err := json.Marshal(&cp)
	if err != nil {
		return nil, fmt.Errorf("encode task %q: %w", t.ID, err)
	}
	return body, nil
}

// CheckTask is PutTask as a dry run (PUT ?dry_run=1): the server validates
// t as a put would and answers what it would store with its next fire
// times, writing nothing.
func (c *Client) CheckTask(ctx context.Context, t *task.Task, o PutOptions) (*DryRun, error) {
	body, err := taskBody(t)
	if err != nil {
		return nil, err
	}
	return c.CheckTaskJSON(ctx, t.ID, body, o)
}

// CheckTaskJSON is PutTaskJSON as a dry run (see CheckTask).
func (c *Client) CheckTaskJSON(ctx context.Context, id string, body []byte, o PutOptions) (*DryRun, error) {
	h := http.Header{"Content-Type": {"application/json"}}
	if o.IfVersion != 0 {
		h.Set("If-Match", strconv.Quote(strconv.FormatInt(o.IfVersion, 10)))
	}
	q := url.Values{"dry_run": {"1"}}
	if o.AllowMissingTargets {
		q.Set("allow_missing_targets", "1")
	}
	var d DryRun
	if err := c.do(ctx, http.MethodPut, taskPath(id), q, body, h, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// PreviewRequest asks POST /v1/schedules:preview for the next fire times
// of a schedule; the fields are the task's of the same names.
type PreviewRequest struct {
	Schedule  string        `json:"schedule"`
	Timezone  string        `json:"timezone,omitempty"`
	ID        string        `json:"id,omitempty"`
	Jitter    task.Duration `json:"jitter,omitempty"`
	NotBefore time.Time     `json:"not_before,omitzero"`
	NotAfter  time.Time     `json:"not_after,omitzero"`
	MaxFires  int           `json:"max_fires,omitempty"`
	// Count is how many times (1-100; 0: the server's default 5).
	Count int `json:"count,omitempty"`
	// CreatedAt is what max_fires counts from without NotBefore; zero:
	// now.
	CreatedAt time.Time `json:"created_at,omitzero"`
}

// Preview returns the next fire times of a schedule as its owner would
// compute them.
func (c *Client) Preview(ctx context.Context, req PreviewRequest) (*Preview, error) {
	body, err := json.Marshal(&req)
	if err != nil {
		return nil, fmt.Errorf("encode preview: %w", err)
	}
	var p Preview
	if err := c.do(ctx, http.MethodPost, "/v1/schedules:preview", nil, body, http.Header{"Content-Type": {"application/json"}}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// PutTaskJSON creates or replaces the task id with the task JSON body
// (docs/api.md "Task JSON"; its "id" may be left out), sent as is. ifVersion as
// in PutTask.
func (c *Client) PutTaskJSON(ctx context.Context, id string, body []byte, ifVersion int64) (*task.Task, error) {
	return c.PutTaskJSONWith(ctx, id, body, PutOptions{IfVersion: ifVersion})
}

// PutOptions qualify a put: IfVersion as in PutTask, AllowMissingTargets
// lets on_success and on_failure name tasks that do not exist (yet).
type PutOptions struct {
	IfVersion           int64
	AllowMissingTargets bool
}

// PutTaskJSONWith is PutTaskJSON with options.
func (c *Client) PutTaskJSONWith(ctx context.Context, id string, body []byte, o PutOptions) (*task.Task, error) {
	h := http.Header{"Content-Type": {"application/json"}}
	if o.IfVersion != 0 {
		h.Set("If-Match", strconv.Quote(strconv.FormatInt(o.IfVersion, 10)))
	}
	var q url.Values
	if o.AllowMissingTargets {
		q = url.Values{"allow_missing_targets": {"1"}}
	}
	var t task.Task
	if err := c.do(ctx, http.MethodPut, taskPath(id), q, body, h, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// GetTask returns the task with its state from its owner (State is nil
// when the owner did not give it). A missing task is an *Error with Status
// 404.
func (c *Client) GetTask(ctx context.Context, id string) (*task.Task, error) {
	var t task.Task
	if err := c.do(ctx, http.MethodGet, taskPath(id), nil, nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteTask deletes the task; a missing one is an *Error with Status 404.
func (c *Client) DeleteTask(ctx context.Context, id string) error {
	return c.DeleteTaskIf(ctx, id, 0)
}

// DeleteTaskIf is DeleteTask sending ifVersion, unless 0, as If-Match: the
// task is deleted only if its version is ifVersion, otherwise (another
// version, or no task) it is an *Error with Status 412 and nothing changes.
func (c *Client) DeleteTaskIf(ctx context.Context, id string, ifVersion int64) error {
	var h http.Header
	if ifVersion != 0 {
		h = http.Header{"If-Match": {strconv.Quote(strconv.FormatInt(ifVersion, 10))}}
	}
	return c.do(ctx, http.MethodDelete, taskPath(id), nil, nil, h, nil)
}

// ListTasks returns one page of tasks in id order and the cursor of the
// next page (the page's last id), "" after the last. A page holds
// opts.Limit tasks (at most registry.MaxListLimit), fewer only at the end.
func (c *Client) ListTasks(ctx context.Context, opts ListOptions) (tasks []*task.Task, next string, err error) {
	p, err := c.ListPage(ctx, opts)
	if err != nil {
		return nil, "", err
	}
	return p.Tasks, p.NextCursor, nil
}

// ListPage is one page of ListTasks with the whole answer: Partial lists
// the nodes that did not answer a list by status.
type ListPage struct {
	Tasks      []*task.Task
	NextCursor string
	Partial    []string
}

// ListPage is ListTasks giving the whole answer.
func (c *Client) ListPage(ctx context.Context, opts ListOptions) (*ListPage, error) {
	q := url.Values{}
	if opts.Prefix != "" {
		q.Set("prefix", opts.Prefix)
	}
	for _, k := range slices.Sorted(maps.Keys(opts.Labels)) {
		q.Add("label", k+"="+opts.Labels[k])
	}
	if opts.Limit != 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Cursor != "" {
		q.Set("cursor", opts.Cursor)
	}
	if opts.Status != "" {
		q.Set("status", opts.Status)
	}
	if opts.State {
		q.Set("state", "1")
	}
	var body bytes.Buffer
	if err := c.do(ctx, http.MethodGet, "/v1/tasks", q, nil, nil, &body); err != nil {
		return nil, err
	}
	p, err := decodeListPage(body.Bytes())
	if err != nil {
		return nil, fmt.Errorf("GET /v1/tasks: decoding the answer: %w", err)
	}
	return p, nil
}

// decodeListPage reads the answer of GET /v1/tasks with task.DecodeStored
// (json v2), about twice as fast as encoding/json on a page of tasks.
func decodeListPage(body []byte) (*ListPage, error) {
	var resp ListResponse
	if err := task.DecodeStored(body, &resp); err != nil {
		return nil, err
	}
	return &ListPage{Tasks: resp.Tasks, NextCursor: resp.NextCursor, Partial: resp.Partial}, nil
}

// Export writes to w every task that opts.Prefix and opts.Labels select,
// as JSON Lines (in id order with a filter; by partition, then id, for the
// whole fleet), read by the server from one etcd revision
// (opts.Limit and opts.Cursor must be zero). Each line is a task as
// stored, which PutBatch and 'shardcron import' read back unchanged. An
// answer cut off by the server is an error.
func (c *Client) Export(ctx context.Context, opts ListOptions, w io.Writer) error {
	q := url.Values{}
	if opts.Prefix != "" {
		q.Set("prefix", opts.Prefix)
	}
	for _, k := range slices.Sorted(maps.Keys(opts.Labels)) {
		q.Add("label", k+"="+opts.Labels[k])
	}
	return c.do(ctx, http.MethodGet, "/v1/tasks:export", q, nil, nil, w)
}

// PutBatch creates or replaces many tasks: body is a JSON array of tasks
// or JSON Lines (one task per line), at most MaxBatchItems. Items that are
// invalid are listed in the result's Errors and the others written.
func (c *Client) PutBatch(ctx context.Context, body []byte) (*BatchResult, error) {
	ct := "application/x-ndjson"
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '[' {
		ct = "application/json"
	}
	var res BatchResult
	if err := c.do(ctx, http.MethodPost, "/v1/tasks:batch", nil, body, http.Header{"Content-Type": {ct}}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Pause sets the task's paused flag and returns the task as stored.
func (c *Client) Pause(ctx context.Context, id string) (*task.Task, error) {
	return c.postTask(ctx, id, "pause", nil)
}

// PauseWithNote pauses the task with a note, which the task's state shows
// with who paused it and when.
func (c *Client) PauseWithNote(ctx context.Context, id, note string) (*task.Task, error) {
	return c.postTask(ctx, id, "pause", map[string]string{"note": note})
}

// Resume clears the task's paused flag and returns the task as stored.
func (c *Client) Resume(ctx context.Context, id string) (*task.Task, error) {
	return c.postTask(ctx, id, "resume", nil)
}

func (c *Client) postTask(ctx context.Context, id, verb string, req any) (*task.Task, error) {
	var body []byte
	var h http.Header
	if req != nil {
		var err error
		if body, h, err = jsonBody(req); err != nil {
			return nil, err
		}
	}
	var t task.Task
	if err := c.do(ctx, http.MethodPost, taskPath(id)+"/"+verb, nil, body, h, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Trigger asks the task's owner to fire it once now and returns the
// scheduled time of that fire (its idempotency key's time). The fire
// happens asynchronously, shortly after.
func (c *Client) Trigger(ctx context.Context, id string) (time.Time, error) {
	return c.TriggerWith(ctx, id, nil)
}

// TriggerWith is Trigger with an override of the fire's HTTP body or
// handler payload (nil: none).
func (c *Client) TriggerWith(ctx context.Context, id string, o *task.Override) (time.Time, error) {
	var body []byte
	var h http.Header
	if !o.Empty() {
		var err error
		if body, h, err = jsonBody(o); err != nil {
			return time.Time{}, err
		}
	}
	var resp TriggerResponse
	if err := c.do(ctx, http.MethodPost, taskPath(id)+"/trigger", nil, body, h, &resp); err != nil {
		return time.Time{}, err
	}
	at, err := time.Parse(time.RFC3339, resp.ScheduledAt)
	if err != nil {
		return time.Time{}, fmt.Errorf("trigger %q: the server answered scheduled_at %q: %w", id, resp.ScheduledAt, err)
	}
	return at, nil
}

// History returns up to limit execution records of the task from every
// node, newest first (limit 0: the server's default, 100; at most 1000).
// The records of a node that did not answer are missing: HistoryAnswer
// says which.
func (c *Client) History(ctx context.Context, id string, limit int) ([]task.Execution, error) {
	resp, err := c.historyAnswer(ctx, id, limit, false)
	if err != nil {
		return nil, err
	}
	return resp.Executions, nil
}

// HistoryAnswer is History giving the whole answer: Partial lists the
// nodes that did not answer, whose records are missing.
func (c *Client) HistoryAnswer(ctx context.Context, id string, limit int) (*HistoryResponse, error) {
	return c.historyAnswer(ctx, id, limit, false)
}

// LocalHistory returns the node's own records of the task only (?local=1):
// what History gathers from every node.
func (c *Client) LocalHistory(ctx context.Context, id string, limit int) ([]task.Execution, error) {
	resp, err := c.historyAnswer(ctx, id, limit, true)
	if err != nil {
		return nil, err
	}
	return resp.Executions, nil
}

func (c *Client) historyAnswer(ctx context.Context, id string, limit int, local bool) (*HistoryResponse, error) {
	q := url.Values{}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if local {
		q.Set("local", "1")
	}
	var resp HistoryResponse
	if err := c.do(ctx, http.MethodGet, taskPath(id)+"/history", q, nil, nil, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// TaskState returns the state of a task the node owns (an *Error with
// status 404 otherwise): GET /v1/tasks/{id}/state, which GET /v1/tasks/{id}
// asks of the owner.
func (c *Client) TaskState(ctx context.Context, id string) (*task.State, error) {
	var st task.State
	if err := c.do(ctx, http.MethodGet, taskPath(id)+"/state", nil, nil, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// self asks the node for its own report (/v1/nodes/self).
func (c *Client) Self(ctx context.Context) (*Node, error) {
	var n Node
	if err := c.do(ctx, http.MethodGet, "/v1/nodes/self", nil, nil, nil, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// Nodes returns the cluster's members with their partitions and counters.
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	var resp NodesResponse
	if err := c.do(ctx, http.MethodGet, "/v1/nodes", nil, nil, nil, &resp); err != nil {
		return nil, err
	}
	return resp.Nodes, nil
}

// Partitions returns the owner and state of every partition.
func (c *Client) Partitions(ctx context.Context) ([]Partition, error) {
	var resp PartitionsResponse
	if err := c.do(ctx, http.MethodGet, "/v1/partitions", nil, nil, nil, &resp); err != nil {
		return nil, err
	}
	return resp.Partitions, nil
}

// Ready returns nil when the node is ready (owns its partitions and is not
// fenced), else an error; an *Error with Status 503 carries the reason.
func (c *Client) Ready(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/readyz", nil, nil, nil, nil)
}

// taskPath is the path of a task: its id path-escaped as one segment.
func taskPath(id string) string { return "/v1/tasks/" + EscapeID(id) }

// EscapeID path-escapes a task id into one path segment: "/" becomes %2F,
// and the ids "." and ".." are escaped too, since they would otherwise be
// resolved away as path elements.
func EscapeID(id string) string {
	e := url.PathEscape(id)
	if e == "." || e == ".." {
		e = strings.ReplaceAll(e, ".", "%2E")
	}
	return e
}

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 64 << 10

// do sends a request and decodes a 2xx answer into out (when not nil);
// other answers become an *Error.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body []byte, h http.Header, out any) error {
	base := c.BaseURL
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u := strings.TrimRight(base, "/") + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Accept", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err // *url.Error names the method and URL
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		if msg, ok := errorMessage(b); ok {
			return &Error{Status: resp.StatusCode, Message: msg}
		}
		return &Error{Status: resp.StatusCode, Message: sumUp(b), Foreign: true}
	}
	if w := resp.Header.Get(WarningHeader); w != "" && c.Warn != nil {
		c.Warn(w)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body) // lets the connection be reused
		return nil
	}
	if w, ok := out.(io.Writer); ok { // a streamed answer, copied as it comes
		if _, err := io.Copy(w, resp.Body); err != nil {
			return fmt.Errorf("%s %s: reading the answer: %w", method, u, err)
		}
		return nil
	}
	answer := bufio.NewReader(resp.Body)
	if !startsJSON(answer) {
		b, _ := io.ReadAll(io.LimitReader(answer, maxErrorBody))
		return &Error{Status: resp.StatusCode, Message: sumUp(b), Foreign: true}
	}
	if err := json.NewDecoder(answer).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", method, u, err)
	}
	return nil
}

// startsJSON reports whether r, past leading white space, starts a JSON
// object or array, as every answer of the API does.
func startsJSON(r *bufio.Reader) bool {
	for {
		c, err := r.ReadByte()
		if err != nil {
			return false
		}
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			_ = r.UnreadByte()
			return c == '{' || c == '['
		}
	}
}

// errorMessage extracts the message of a shardcron error answer; ok is
// false when b is not one.
func errorMessage(b []byte) (msg string, ok bool) {
	var e struct {
		Error  string `json:"error"`
		Reason string `json:"reason"`
	}
	if json.Unmarshal(b, &e) != nil {
		return "", false
	}
	if e.Error != "" {
		return e.Error, true
	}
	return e.Reason, e.Reason != ""
}

// sumUp says in a line what an answer that is not shardcron's holds: an
// HTML page's title, or its first line, quoted and cut short.
func sumUp(b []byte) string {
	s := strings.TrimSpace(string(b))
	if _, rest, ok := strings.Cut(s, "<title>"); ok {
		if title, _, ok := strings.Cut(rest, "</title>"); ok {
			return fmt.Sprintf("an HTML page, %q", strings.TrimSpace(title))
		}
	}
	if s == "" {
		return "no body"
	}
	line, _, _ := strings.Cut(s, "\n")
	if len(line) > 120 {
		line = strings.ToValidUTF8(line[:120], "") + "…"
	}
	return strconv.Quote(line)
}

// LocalStatus returns the first tasks the node owns with a status, in id
// order (GET /v1/tasks:status, node to node): what ListTasks with a Status
// gathers from every node.
func (c *Client) LocalStatus(ctx context.Context, q task.StatusQuery) (*StatusAnswer, error) {
	v := url.Values{"status": {string(q.Status)}, "limit": {strconv.Itoa(q.Limit)}}
	if q.Prefix != "" {
		v.Set("prefix", q.Prefix)
	}
	if q.After != "" {
		v.Set("after", q.After)
	}
	var a StatusAnswer
	if err := c.do(ctx, http.MethodGet, "/v1/tasks:status", v, nil, nil, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// LocalStates returns the states of the tasks the node holds among ids,
// in the order of ids, nil for the others (POST /v1/tasks:states, node to
// node).
func (c *Client) LocalStates(ctx context.Context, ids []string) ([]*task.State, error) {
	body, err := json.Marshal(StatesRequest{IDs: ids})
	if err != nil {
		return nil, err
	}
	var a StatesAnswer
	if err := c.do(ctx, http.MethodPost, "/v1/tasks:states", nil, body, nil, &a); err != nil {
		return nil, err
	}
	return a.States, nil
}

// Failures returns the cluster's latest failed or timed-out attempts,
// newest first, at most limit (0: the server's default, at most
// MaxFailuresLimit), and the nodes that did not answer.
func (c *Client) Failures(ctx context.Context, limit int) ([]task.Execution, []string, error) {
	q := url.Values{}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var resp FailuresResponse
	if err := c.do(ctx, http.MethodGet, "/v1/failures", q, nil, nil, &resp); err != nil {
		return nil, nil, err
	}
	return resp.Failures, resp.Partial, nil
}

// LocalFailures returns the node's own latest failures only (?local=1):
// what Failures gathers from every node.
func (c *Client) LocalFailures(ctx context.Context, limit int) ([]task.Execution, error) {
	q := url.Values{"local": {"1"}, "limit": {strconv.Itoa(limit)}}
	var resp FailuresResponse
	if err := c.do(ctx, http.MethodGet, "/v1/failures", q, nil, nil, &resp); err != nil {
		return nil, err
	}
	return resp.Failures, nil
}

// Bulk applies action to every task sel chooses (POST /v1/tasks:<action>)
// and returns the counts; with sel.DryRun it only counts.
func (c *Client) Bulk(ctx context.Context, action task.BulkAction, sel task.Selector) (*task.BulkResult, error) {
	body, err := json.Marshal(sel)
	if err != nil {
		return nil, fmt.Errorf("encode selector: %w", err)
	}
	var res task.BulkResult
	h := http.Header{"Content-Type": {"application/json"}}
	if err := c.do(ctx, http.MethodPost, "/v1/tasks:"+string(action), nil, body, h, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// LocalSeries returns the node's own recent counters (GET
// /v1/series?scope=self), oldest first.
func (c *Client) LocalSeries(ctx context.Context) ([]Point, error) {
	var resp SeriesResponse
	if err := c.do(ctx, http.MethodGet, "/v1/series", url.Values{"scope": {"self"}}, nil, nil, &resp); err != nil {
		return nil, err
	}
	if len(resp.Nodes) != 1 {
		return nil, fmt.Errorf("GET /v1/series?scope=self: %d series, want 1", len(resp.Nodes))
	}
	return resp.Nodes[0].Points, nil
}

// jsonBody encodes a request body and its Content-Type.
func jsonBody(v any) ([]byte, http.Header, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, nil, fmt.Errorf("encode the request: %w", err)
	}
	return b, http.Header{"Content-Type": {"application/json"}}, nil
}

// Backfill asks the task's owner to run every scheduled time of the task in
// [from, to], at most concurrency at a time (0: the default, 1), and
// returns the backfill's record. Its progress shows in the task's state
// (GetTask).
func (c *Client) Backfill(ctx context.Context, id string, from, to time.Time, concurrency int) (*task.Backfill, error) {
	req := BackfillRequest{From: from, To: to}
	if concurrency != 0 {
		req.Concurrency = &concurrency
	}
	body, h, err := jsonBody(req)
	if err != nil {
		return nil, err
	}
	var b task.Backfill
	if err := c.do(ctx, http.MethodPost, taskPath(id)+"/backfill", nil, body, h, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// CancelBackfill cancels the task's running backfill and returns its
// record, marked canceled, with the progress its owner last recorded. A
// task with no backfill running is a 409 (*Error).
func (c *Client) CancelBackfill(ctx context.Context, id string) (*task.Backfill, error) {
	var b task.Backfill
	if err := c.do(ctx, http.MethodPost, taskPath(id)+"/backfill:cancel", nil, nil, nil, &b); err != nil {
		return nil, err
	}
	return &b, nil
}
