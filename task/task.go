package task

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// MaxTaskSize is the largest task JSON DecodeTask accepts, in bytes.
const MaxTaskSize = 64 << 10

// Defaults that DecodeTask and Validate apply to fields left out (or zero).
const (
	DefaultTimezone      = "UTC"
	DefaultTimeout       = time.Minute
	DefaultMaxAttempts   = 1
	DefaultBackoff       = time.Second
	DefaultMaxBackoff    = time.Minute // or the backoff, when that is longer
	DefaultCatchupWindow = time.Minute
	DefaultMisfire       = MisfireFireOnce
	DefaultConcurrency   = ConcurrencyAllow
	DefaultHTTPMethod    = "POST"
)

// Task is a recurring task as docs/api.md's "Task JSON" defines it: the JSON field
// names and formats of this struct are the external contract.
//
// Build one with DecodeTask, or in Go and call Validate; both apply the
// defaults and the rules documented on each field. A Task is a plain value:
// the engine keeps its own compact form of it.
type Task struct {
	// ID names the task: 1-256 bytes of UTF-8 without control characters.
	ID string `json:"id"`
	// Schedule is a cron spec with 5 or 6 fields, a descriptor or "@every d";
	// see package schedule. H fields hash ID.
	Schedule string `json:"schedule"`
	// Timezone is the IANA zone the schedule's wall-clock times are in.
	// Default "UTC".
	Timezone string `json:"timezone"`
	// Executor says what a fire runs.
	Executor Executor `json:"executor"`
	// Timeout bounds one attempt: more than 0, at most 24h. Default 1m.
	Timeout Duration `json:"timeout"`
	// Retry says how failed attempts are retried.
	Retry Retry `json:"retry"`
	// Misfire is what happens to fires missed by more than the misfire
	// threshold. Default fire_once.
	Misfire MisfirePolicy `json:"misfire"`
	// CatchupWindow: missed fires older than this are never run. More than
	// 0, at most 24h; default 1m. (Zero would mean "never catch up", which
	// is misfire "skip".)
	CatchupWindow Duration `json:"catchup_window"`
	// Concurrency is what a fire does while the previous fire of the task
	// still runs. Default allow.
	Concurrency ConcurrencyPolicy `json:"concurrency"`
	// Jitter delays each fire by a deterministic amount in [0, Jitter),
	// derived from (ID, scheduled time). 0 to 1h; default 0.
	Jitter Duration `json:"jitter"`
	// Paused tasks keep their definition but do not fire.
	Paused bool `json:"paused"`
	// Labels: at most 64; keys 1-63 bytes of [A-Za-z0-9._/-], values at most
	// 256 bytes of UTF-8.
	Labels map[string]string `json:"labels,omitempty"`
	// HistoryLimit overrides how many of the task's most recent executions
	// each node keeps. Default: the node's --history-success-limit and
	// --history-failure-limit.
	HistoryLimit *HistoryLimit `json:"history_limit,omitempty"`

	// Alerts and output capture (issue 9; alerts.go).

	// Notify, when set, sends alerts on changes of the task's state.
	// Default: none, or failure and recovery alerts to the node's
	// --notify-url when it has one.
	Notify *Notify `json:"notify,omitempty"`
	// PauseOnFailure pauses the task after this many fires in a row failed,
	// and again after as many more if it is resumed while still failing
	// (0 to 1000; default 0, never).
	PauseOnFailure int `json:"pause_on_failure,omitempty"`
	// Capture, when set, keeps the output of attempts with their execution
	// records. Default: none.
	Capture *Capture `json:"capture,omitempty"`

	// Chaining (issue 12): when a fire of this task ends after its last
	// attempt, its owner triggers each task of OnSuccess (the fire
	// succeeded) or OnFailure (it failed or timed out) once, with the
	// idempotency key "<target>@<this fire's scheduled ms>". At most
	// MaxChainTargets ids each, no duplicates; the registry refuses a
	// chain that closes a cycle, and targets that do not exist unless
	// asked to allow them.
	OnSuccess []string `json:"on_success,omitempty"`
	OnFailure []string `json:"on_failure,omitempty"`
	// Windows, limits and one-shot tasks (window.go; docs/api.md "Windows,
	// limits and one-shot tasks"). The owner schedules no fire outside
	// the task's Window.

	// NotBefore: no fire is scheduled before it. Optional.
	NotBefore time.Time `json:"not_before,omitzero"`
	// NotAfter: no fire is scheduled after it. Optional; after NotBefore.
	NotAfter time.Time `json:"not_after,omitzero"`
	// MaxFires limits the task to the first MaxFires scheduled times of its
	// schedule at or after NotBefore, or CreatedAt without it: 1 to
	// MaxFiresLimit, 0 (left out) for no limit.
	MaxFires int `json:"max_fires,omitempty"`
	// DeleteAfterFire: once the task's last fire ended, its owner deletes
	// it (unless it changed since). Only for a task that ends: an @at
	// schedule, NotAfter or MaxFires.
	DeleteAfterFire bool `json:"delete_after_fire,omitempty"`

	// Output-only fields, set in API responses. DecodeTask accepts and
	// ignores them, so that a client can PUT back what it got.

	// Partition is the task's partition, xxhash64(id) % partitions.
	Partition *int `json:"partition,omitempty"`
	// Version is the etcd mod revision of the stored definition.
	Version int64 `json:"version,omitempty"`
	// CreatedAt and UpdatedAt are when the definition was first and last
	// written.
	CreatedAt time.Time `json:"created_at,omitzero"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	// State is the owning node's view of the task.
	State *State `json:"state,omitempty"`
	// Pause says who paused the task, when, and why: set by the pause
	// request and kept while the task stays paused (a PUT that keeps it
	// paused keeps it); nil for a task not paused that way. DecodeTask
	// reads it for a paused task, as an export writes it, for an import
	// to keep (registry).
	Pause *Pause `json:"pause,omitempty"`
}

// Pause is a pause request's record: who paused the task (the token's
// name, "token" when tokens are not named, "anonymous" without auth),
// when, and an optional note of at most MaxPauseNote bytes.
type Pause struct {
	Note string    `json:"note,omitempty"`
	By   string    `json:"by"`
	At   time.Time `json:"at"`
}

// MaxPauseNote is the longest pause note, in bytes.
const MaxPauseNote = 1024

// MaxPauseBy is the longest name of who paused a task that a task's JSON
// may give (Pause.By), in bytes: the registry keeps room in a task's size
// for a pause record with the longest note, and who and when.
const MaxPauseBy = 64

// CheckPauseNote refuses a pause note longer than MaxPauseNote or holding
// control characters other than tab and newline.
func CheckPauseNote(note string) error { return checkPauseText("note", note, MaxPauseNote) }

// checkPauseText refuses a pause record's field longer than max bytes or
// holding control characters other than tab and newline.
func checkPauseText(field, s string, max int) error {
	if len(s) > max {
		return Invalid(field, "%d bytes, more than the limit of %d", len(s), max)
	}
	if !utf8.ValidString(s) {
		return Invalid(field, "not valid UTF-8")
	}
	for _, r := range s {
		if r < 0x20 && r != '\t' && r != '\n' || r == 0x7f {
			return Invalid(field, "control character %U", r)
		}
	}
	return nil
}

// Executor says what a fire runs. Type selects the kind; each kind takes
// only its own fields, and DecodeTask and Validate refuse the others.
type Executor struct {
	// Type is http, exec, handler or noop.
	Type ExecutorType `json:"type"`

	// URL (http) is an absolute http or https URL.
	URL string `json:"url,omitempty"`
	// Method (http) is an HTTP method token. Default POST.
	Method string `json:"method,omitempty"`
	// Headers (http) are added to the request. Names must be valid header
	// names; Idempotency-Key and Shardcron-* are set by the executor, and
	// the framing and connection headers by Go's HTTP client
	// (clientHeaders), so both are refused here. Host is sent as the
	// request's host. Values must not contain control characters but tab.
	Headers map[string]string `json:"headers,omitempty"`
	// Body (http) is the request body.
	Body string `json:"body,omitempty"`

	// Command (exec) is the argv to run, argv[0] first; at least argv[0].
	// Arguments must not contain NUL bytes.
	Command []string `json:"command,omitempty"`
	// Env (exec) is added to the command's environment. Names must be
	// non-empty and contain neither '=' nor NUL; values no NUL.
	Env map[string]string `json:"env,omitempty"`

	// Name (handler) names an in-process Go handler: 1-256 bytes, no
	// control characters.
	Name string `json:"name,omitempty"`
	// Payload (handler) is any JSON value, passed to the handler.
	Payload json.RawMessage `json:"payload,omitempty"`
}

// ExecutorType selects an executor.
type ExecutorType string

// The executor types.
const (
	ExecutorHTTP    ExecutorType = "http"
	ExecutorExec    ExecutorType = "exec"
	ExecutorHandler ExecutorType = "handler"
	ExecutorNoop    ExecutorType = "noop"
)

// Retry says how failed attempts are retried: exponential backoff from
// Backoff, doubled per attempt and capped at MaxBackoff; each wait is a
// random time between half and all of that (jitter).
type Retry struct {
	// MaxAttempts counts the first attempt: 1 (default) means no retry; at
	// most 100.
	MaxAttempts int `json:"max_attempts"`
	// Backoff is the delay before the first retry: more than 0, at most 24h.
	// Default 1s.
	Backoff Duration `json:"backoff"`
	// MaxBackoff caps the delay: at least Backoff, at most 24h. Default 1m,
	// or Backoff when that is longer.
	MaxBackoff Duration `json:"max_backoff"`
}

// HistoryLimit is how many of a task's most recent executions each node
// keeps in its history, as Kubernetes' successfulJobsHistoryLimit and
// failedJobsHistoryLimit: 0 to 100 each, 0 keeping none. A field left out
// takes the node's default.
type HistoryLimit struct {
	// Successes counts executions with status "ok".
	Successes *int `json:"successes,omitempty"`
	// Failures counts every other status: failed, timeout, skipped,
	// misfired, canceled.
	Failures *int `json:"failures,omitempty"`
}

// MisfirePolicy is what happens to fires missed by more than the misfire
// threshold (see docs/design.md).
type MisfirePolicy string

// The misfire policies.
const (
	// MisfireFireOnce fires once now, with the latest missed scheduled time.
	MisfireFireOnce MisfirePolicy = "fire_once"
	// MisfireSkip records the missed fires and runs none of them.
	MisfireSkip MisfirePolicy = "skip"
	// MisfireFireAll fires every missed time, oldest first.
	MisfireFireAll MisfirePolicy = "fire_all"
)

// ConcurrencyPolicy is what a fire does while the previous fire of the same
// task still runs.
type ConcurrencyPolicy string

// The concurrency policies.
const (
	// ConcurrencyAllow runs it alongside.
	ConcurrencyAllow ConcurrencyPolicy = "allow"
	// ConcurrencyForbid skips it, recorded as skipped.
	ConcurrencyForbid ConcurrencyPolicy = "forbid"
	// ConcurrencyBufferOne runs it when the previous one ends; at most one
	// waits.
	ConcurrencyBufferOne ConcurrencyPolicy = "buffer_one"
	// ConcurrencyReplace cancels the running one.
	ConcurrencyReplace ConcurrencyPolicy = "replace"
)

// State is the owning node's view of a task, in API responses. Counters
// count since the owner took the task's partition.
type State struct {
	Owner      string    `json:"owner"`
	NextFireAt time.Time `json:"next_fire_at,omitzero"`
	LastFireAt time.Time `json:"last_fire_at,omitzero"`
	LastStatus string    `json:"last_status,omitempty"`
	Fires      uint64    `json:"fires"`
	Failures   uint64    `json:"failures"`
	Misfires   uint64    `json:"misfires"`
	Skipped    uint64    `json:"skipped"`
	// LastSuccessAt is the scheduled time of the last fire that succeeded
	// (to the second), LastFailureAt that of the last fire whose last
	// attempt failed or timed out, LastError its error, and
	// ConsecutiveFailures how many fires in a row ended so; a success
	// resets it. Kept by the owner; a graceful hand-over passes them on for
	// tasks that failed (handedHealth), a crash loses them.
	LastSuccessAt       time.Time `json:"last_success_at,omitzero"`
	LastFailureAt       time.Time `json:"last_failure_at,omitzero"`
	ConsecutiveFailures uint64    `json:"consecutive_failures"`
	LastError           string    `json:"last_error,omitempty"`
	// Stale: no fire succeeded within two of the schedule's intervals
	// (see StatusStale).
	Stale bool `json:"stale,omitempty"`
	// Pause is the task's pause record (Task.Pause), shown with its state.
	Pause *Pause `json:"pause,omitempty"`
	// Backfill is the task's latest backfill and its progress, as etcd
	// records it.
	Backfill *Backfill `json:"backfill,omitempty"`

	// Ended says why the task fires no more: EndedNotAfter, EndedMaxFires
	// or EndedAt (window.go); empty while it has fires to come.
	Ended string `json:"ended,omitempty"`

	// OwnerError says why Owner, a live member the ring gives the task
	// to, gave no state when asked (it did not answer, or refused): the
	// fields it keeps (next fire, counters, health) are then absent or
	// zero, and only Owner, Pause and Backfill hold.
	OwnerError string `json:"owner_error,omitempty"`
}

// Duration is a time.Duration written in JSON as a Go duration string
// ("30s", "1m30s").
type Duration time.Duration

// String returns the duration in Go's format, e.g. "1m30s".
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return strconv.AppendQuote(nil, time.Duration(d).String()), nil
}

// UnmarshalJSON reads a duration string; JSON null leaves d unchanged.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	v, reason := parseDuration(b)
	if reason != "" {
		return fmt.Errorf("task: %s", reason)
	}
	*d = Duration(v)
	return nil
}

// parseDuration parses a JSON duration string, or says why it cannot.
func parseDuration(b []byte) (time.Duration, string) {
	var s string
	// A plain quoted string, as stored tasks hold, needs no JSON decoder:
	// loading a partition decodes millions of these.
	if len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' && !bytes.ContainsAny(b[1:len(b)-1], "\\\"") {
		s = string(b[1 : len(b)-1])
	} else if err := unmarshal(b, &s); err != nil {
		return 0, fmt.Sprintf("want a duration string such as \"30s\", got %s", jsonKind(b))
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Sprintf("%q is not a duration such as \"30s\" or \"1m30s\"", s)
	}
	return v, ""
}

// DecodeTask decodes and validates a task from its JSON (docs/api.md "Task
// JSON"), applying the defaults to the fields left out. It refuses, with a
// *ValidationError naming the field: input over MaxTaskSize, malformed JSON
// or trailing data, invalid UTF-8, unknown fields (names match exactly, not
// ignoring case), values of the wrong JSON type, explicit zeros where zero
// is not allowed ("timeout": "0s"), and everything Validate refuses. JSON
// null is the same as leaving a field out. The output-only fields
// (partition, version, updated_at, state) are accepted and ignored;
// created_at is read, for a create to keep (registry), and so is the pause
// record of a paused task (decodePause).
func DecodeTask(data []byte) (*Task, error) {
	if len(data) > MaxTaskSize {
		return nil, Invalid("", "task is %d bytes of JSON, more than the limit of %d (64 KiB)", len(data), MaxTaskSize)
	}
	if !utf8.Valid(data) {
		return nil, Invalid("", "task JSON is not valid UTF-8")
	}
	if err := CheckNames(data); err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	if err := unmarshal(data, &obj); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, Invalid("", "malformed JSON at byte %d: %s", se.Offset, se.Error())
		}
		return nil, Invalid("", "task must be a JSON object, got %s", jsonKind(data))
	}
	if obj == nil {
		return nil, Invalid("", "task must be a JSON object, got null")
	}
	d := &objDecoder{obj: obj}
	d.known(slices.Concat(taskFields, windowFields), outputOnlyFields)
	var t Task
	d.str("id", &t.ID)
	d.str("schedule", &t.Schedule)
	d.str("timezone", &t.Timezone)
	if e := d.object("executor"); e != nil {
		decodeExecutor(e, &t.Executor)
		d.adopt(e)
	} else if d.err == nil {
		d.fail("executor", "required: an object such as {\"type\": \"http\", \"url\": \"https://hooks.example.com/invoice\"}")
	}
	d.duration("timeout", &t.Timeout, false)
	if r := d.object("retry"); r != nil {
		r.known(retryFields, nil)
		r.attempts("max_attempts", &t.Retry.MaxAttempts)
		r.duration("backoff", &t.Retry.Backoff, false)
		r.duration("max_backoff", &t.Retry.MaxBackoff, false)
		d.adopt(r)
	}
	var misfire, concurrency string
	d.str("misfire", &misfire)
	t.Misfire = MisfirePolicy(misfire)
	d.duration("catchup_window", &t.CatchupWindow, false)
	d.str("concurrency", &concurrency)
	t.Concurrency = ConcurrencyPolicy(concurrency)
	d.duration("jitter", &t.Jitter, true)
	d.boolean("paused", &t.Paused)
	decodePause(d, &t)
	d.strMap("labels", &t.Labels)
	if l := d.object("history_limit"); l != nil {
		l.known(historyLimitFields, nil)
		t.HistoryLimit = &HistoryLimit{}
		l.count("successes", &t.HistoryLimit.Successes)
		l.count("failures", &t.HistoryLimit.Failures)
		d.adopt(l)
	}
	decodeAlerts(d, &t)
	d.strSlice("on_success", &t.OnSuccess)
	d.strSlice("on_failure", &t.OnFailure)
	d.bound("not_before", &t.NotBefore)
	d.bound("not_after", &t.NotAfter)
	d.maxFires("max_fires", &t.MaxFires)
	d.boolean("delete_after_fire", &t.DeleteAfterFire)
	// Kept by a create (an export read back: max_fires counts from it).
	d.instant("created_at", &t.CreatedAt)
	if d.err != nil {
		return nil, d.err
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &t, nil
}

var (
	taskFields = []string{"id", "schedule", "timezone", "executor", "timeout", "retry", "misfire",
		"catchup_window", "concurrency", "jitter", "paused", "labels", "history_limit",
		"notify", "pause_on_failure", "capture",
		"on_success", "on_failure", "pause"}
	outputOnlyFields   = []string{"partition", "version", "updated_at", "state"}
	pauseFields        = []string{"note", "by", "at"}
	windowFields       = []string{"not_before", "not_after", "max_fires", "delete_after_fire", "created_at"}
	retryFields        = []string{"max_attempts", "backoff", "max_backoff"}
	historyLimitFields = []string{"successes", "failures"}
)

// decodePause reads the pause record of a paused task, as an export
// writes it, so that an import keeps who paused the task, when and why:
// its note as a pause's, who 1 to MaxPauseBy bytes of the same rules, its
// time an RFC 3339 one (the registry dates it now when left out). A task
// not paused has none: a record given with it is ignored, as a resume
// drops it.
func decodePause(d *objDecoder, t *Task) {
	if !t.Paused || d.err != nil {
		return
	}
	pd := d.object("pause")
	if pd == nil {
		return
	}
	pd.known(pauseFields, nil)
	var p Pause
	pd.str("note", &p.Note)
	pd.str("by", &p.By)
	pd.instant("at", &p.At)
	if pd.err == nil {
		err := CheckPauseNote(p.Note)
		if err == nil && p.By == "" {
			err = Invalid("by", "required: who paused the task, as an export writes it")
		}
		if err == nil {
			err = checkPauseText("by", p.By, MaxPauseBy)
		}
		var ve *ValidationError
		if errors.As(err, &ve) {
			pd.fail(ve.Field, "%s", ve.Reason)
		}
	}
	d.adopt(pd)
	t.Pause = &p
}

// objDecoder decodes the fields of one JSON object, keeping the first error.
// Decoding field by field, rather than with encoding/json's struct decoder,
// gives errors the field's path and matches names exactly.
type objDecoder struct {
	obj    map[string]json.RawMessage
	prefix string // path of this object, with a trailing dot
	err    *ValidationError
}

func (d *objDecoder) fail(name, format string, args ...any) {
	if d.err == nil {
		d.err = Invalid(d.prefix+name, format, args...)
	}
}

// adopt takes the error of a nested object's decoder.
func (d *objDecoder) adopt(sub *objDecoder) {
	if d.err == nil {
		d.err = sub.err
	}
}

// known refuses the first (in sorted order) field not in fields or ignored,
// suggesting the field the user probably meant.
func (d *objDecoder) known(fields, ignored []string) {
	var unknown []string
	for k := range d.obj {
		if !slices.Contains(fields, k) && !slices.Contains(ignored, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return
	}
	slices.Sort(unknown)
	k := unknown[0]
	if s := suggest(k, fields); s != "" {
		d.fail(k, "unknown field (did you mean %q?)", s)
		return
	}
	d.fail(k, "unknown field (want one of %s)", strings.Join(fields, ", "))
}

// suggest returns the field of fields closest to k, if close enough to be a
// typo.
func suggest(k string, fields []string) string {
	best, bestDist := "", 3 // a distance under this is a typo
	if len(k) >= 6 {
		bestDist = 4
	}
	for _, f := range fields {
		if strings.EqualFold(f, k) {
			return f
		}
		if dist := editDistance(strings.ToLower(k), f); dist < bestDist {
			best, bestDist = f, dist
		}
	}
	return best
}

// editDistance is the Levenshtein distance, for short field names.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// raw returns the field's JSON when present and not null.
func (d *objDecoder) raw(name string) (json.RawMessage, bool) {
	if d.err != nil {
		return nil, false
	}
	r, ok := d.obj[name]
	if !ok || string(r) == "null" {
		return nil, false
	}
	return r, true
}

// value decodes the field into dst, or fails with "want <want>".
func (d *objDecoder) value(name string, dst any, want string) {
	if r, ok := d.raw(name); ok {
		if err := unmarshal(r, dst); err != nil {
			d.fail(name, "want %s, got %s", want, jsonKind(r))
		}
	}
}

func (d *objDecoder) str(name string, dst *string)   { d.value(name, dst, "a string") }
func (d *objDecoder) boolean(name string, dst *bool) { d.value(name, dst, "true or false") }

// strMap decodes an object of strings, naming the first (in key order)
// value that is not a string.
func (d *objDecoder) strMap(name string, dst *map[string]string) {
	var m map[string]json.RawMessage
	d.value(name, &m, "an object of strings")
	if d.err != nil || m == nil {
		return
	}
	out := make(map[string]string, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v, ok := stringOf(m[k])
		if !ok {
			d.fail(name+"."+k, "want a string, got %s", jsonKind(m[k]))
			return
		}
		out[k] = v
	}
	*dst = out
}

// strSlice decodes an array of strings, naming the first element that is
// not a string.
func (d *objDecoder) strSlice(name string, dst *[]string) {
	var a []json.RawMessage
	d.value(name, &a, "an array of strings")
	if d.err != nil || a == nil {
		return
	}
	out := make([]string, len(a))
	for i, r := range a {
		v, ok := stringOf(r)
		if !ok {
			d.fail(fmt.Sprintf("%s[%d]", name, i), "want a string, got %s", jsonKind(r))
			return
		}
		out[i] = v
	}
	*dst = out
}

// stringOf decodes an element of an object or array of strings. null is
// no string there: leaving a field out is what null means for a field,
// but an element cannot be left out, and taken as "" it would run an exec
// command with an empty argument or send an empty header.
func stringOf(r json.RawMessage) (string, bool) {
	var v string
	if string(r) == "null" || unmarshal(r, &v) != nil {
		return "", false
	}
	return v, true
}

// attempts decodes retry.max_attempts; an explicit 0 is refused, since it
// would silently become the default.
func (d *objDecoder) attempts(name string, dst *int) {
	d.value(name, dst, "a whole number")
	if _, ok := d.raw(name); ok && d.err == nil && *dst == 0 {
		d.fail(name, "0 is not within 1-%d (leave it out for the default %d)", maxAttempts, DefaultMaxAttempts)
	}
}

// count decodes a whole number into a field that is nil when left out.
func (d *objDecoder) count(name string, dst **int) {
	if _, ok := d.raw(name); !ok {
		return
	}
	var v int
	d.value(name, &v, "a whole number")
	if d.err == nil {
		*dst = &v
	}
}

// duration decodes a duration string. Unless zeroOK, an explicit zero is
// refused: zero means "the default" in a Task, so accepting "0s" would
// silently turn it into something else.
func (d *objDecoder) duration(name string, dst *Duration, zeroOK bool) {
	r, ok := d.raw(name)
	if !ok {
		return
	}
	v, reason := parseDuration(r)
	if reason != "" {
		d.fail(name, "%s", reason)
		return
	}
	if v == 0 && !zeroOK {
		d.fail(name, "0s is not more than 0 (leave it out for the default)")
		return
	}
	*dst = Duration(v)
}

// object returns a decoder for a nested object, nil when the field is
// absent or null (or an error occurred).
func (d *objDecoder) object(name string) *objDecoder {
	r, ok := d.raw(name)
	if !ok {
		return nil
	}
	var obj map[string]json.RawMessage
	if err := unmarshal(r, &obj); err != nil {
		d.fail(name, "want an object, got %s", jsonKind(r))
		return nil
	}
	return &objDecoder{obj: obj, prefix: d.prefix + name + "."}
}

// CheckNames refuses JSON in which an object gives a name twice, naming
// its path ("executor.type: given twice"). Decoding keeps the last value
// of such a name, as encoding/json does, which makes {"schedule":
// "@hourly", "schedule": "@daily"} one of the two at random for its
// writer. Malformed JSON passes: decoding it reports it.
func CheckNames(data []byte) error {
	// Invalid UTF-8 (a lone surrogate escape) is decoding's to judge too:
	// refused here, it would stop the scan before a later name.
	err := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowInvalidUTF8(true)).SkipValue()
	var se *jsontext.SyntacticError
	if !errors.As(err, &se) || !errors.Is(se.Err, jsontext.ErrDuplicateName) {
		return nil
	}
	return Invalid(FieldPath(se.JSONPointer), "given twice: which one was meant?")
}

// FieldPath names the JSON member at p as a field path: "executor.type".
func FieldPath(p jsontext.Pointer) string {
	return strings.Join(slices.Collect(p.Tokens()), ".")
}

// PeekID returns the top-level "id" of a task's JSON, or "" when it has no
// string id there (or is not an object), without decoding the rest: for
// what must know an item's id though the item is refused.
func PeekID(data []byte) string {
	dec := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowInvalidUTF8(true))
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return ""
	}
	for dec.PeekKind() == '"' {
		name, err := dec.ReadToken()
		if err != nil {
			return ""
		}
		if name.String() != "id" {
			if dec.SkipValue() != nil {
				return ""
			}
			continue
		}
		if v, err := dec.ReadToken(); err == nil && v.Kind() == '"' {
			return v.String()
		}
		return ""
	}
	return ""
}

// KindName names a JSON kind as people do, for messages.
func KindName(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 'f', 't':
		return "a boolean"
	case '"':
		return "a string"
	case '0':
		return "a number"
	case '{':
		return "an object"
	case '[':
		return "an array"
	}
	return k.String()
}

// jsonKind names the JSON type of a value, for messages: a short number
// is shown as it is.
func jsonKind(b []byte) string {
	s := strings.TrimSpace(string(b))
	switch {
	case s == "":
		return "nothing"
	case strings.IndexByte("{[\"tfn", s[0]) >= 0: // the bytes a kind shares with its value
		return KindName(jsontext.Kind(s[0]))
	case len(s) <= 32:
		return s
	}
	return "a number"
}
