package task

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/shardcron/shardcron/engine/schedule"
)

// ValidationError reports task input that cannot be accepted: the API answers
// it with 400 and its message. Field is the JSON path of the offending field
// ("schedule", "executor.url", "retry.backoff"), empty when the input as a
// whole is at fault (malformed JSON, too large).
type ValidationError struct {
	Field  string
	Reason string
}

// Error returns "field: reason", e.g. `schedule: "61 * * * * *": second 61
// out of range 0-59`, or the reason alone when Field is empty.
func (e *ValidationError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

// Invalid returns a *ValidationError on field with the formatted reason.
func Invalid(field, format string, args ...any) *ValidationError {
	return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// MaxHistoryLimit is the most executions of one class a task's
// HistoryLimit may keep: store.MaxHistoryLimit, which a test in package
// engine holds it equal to (this package does not link the store).
const MaxHistoryLimit = 100

// MaxIDLen is the longest task id, in bytes.
const MaxIDLen = 256

// Limits of the task model.
const (
	maxTimeout     = 24 * time.Hour
	maxBackoff     = 24 * time.Hour
	maxCatchup     = 24 * time.Hour
	maxJitter      = time.Hour
	maxAttempts    = 100
	MaxLabels      = 64
	maxLabelKeyLen = 63
	maxLabelValLen = 256
)

// Validate applies the defaults to the fields left zero and checks every
// rule of the task model, returning the first violation as a
// *ValidationError. It normalizes as it goes (empty maps become nil, the
// payload is compacted), so that a validated task encodes and decodes to an
// equal Task. Validate is idempotent. The output-only fields are ignored.
func (t *Task) Validate() error {
	t.applyDefaults()
	if err := CheckID(t.ID); err != nil {
		return err
	}
	if t.Schedule == "" {
		return Invalid("schedule", "required: a cron spec such as \"*/5 * * * *\" or a descriptor such as \"@hourly\"")
	}
	sched, err := schedule.Parse(t.Schedule, t.Timezone, t.ID)
	if err != nil {
		var se *schedule.Error
		if errors.As(err, &se) && se.Zone {
			return Invalid("timezone", "%s", se.Error())
		}
		return Invalid("schedule", "%s", err.Error())
	}
	if err := t.Executor.validate(); err != nil {
		return err
	}
	if err := checkDuration("timeout", t.Timeout, false, maxTimeout); err != nil {
		return err
	}
	if t.Retry.MaxAttempts < 1 || t.Retry.MaxAttempts > maxAttempts {
		return Invalid("retry.max_attempts", "%d is not within 1-%d", t.Retry.MaxAttempts, maxAttempts)
	}
	if err := checkDuration("retry.backoff", t.Retry.Backoff, false, maxBackoff); err != nil {
		return err
	}
	if err := checkDuration("retry.max_backoff", t.Retry.MaxBackoff, false, maxBackoff); err != nil {
		return err
	}
	if t.Retry.MaxBackoff < t.Retry.Backoff {
		return Invalid("retry.max_backoff", "%s is less than retry.backoff %s", t.Retry.MaxBackoff, t.Retry.Backoff)
	}
	switch t.Misfire {
	case MisfireFireOnce, MisfireSkip, MisfireFireAll:
	default:
		return Invalid("misfire", "unknown policy %q (want fire_once, skip or fire_all)", t.Misfire)
	}
	if err := checkDuration("catchup_window", t.CatchupWindow, false, maxCatchup); err != nil {
		return err
	}
	switch t.Concurrency {
	case ConcurrencyAllow, ConcurrencyForbid, ConcurrencyBufferOne, ConcurrencyReplace:
	default:
		return Invalid("concurrency", "unknown policy %q (want allow, forbid, buffer_one or replace)", t.Concurrency)
	}
	if err := checkDuration("jitter", t.Jitter, true, maxJitter); err != nil {
		return err
	}
	if t.Jitter > 0 {
		// A fire delayed past the next one would arm that one late, and the
		// schedule would slide into misfires.
		if gap := shortestGap(sched); time.Duration(t.Jitter) >= gap {
			return Invalid("jitter", "%s is not shorter than the schedule's shortest interval %s", t.Jitter, gap)
		}
	}
	if err := checkLabels(t.Labels); err != nil {
		return err
	}
	if err := t.HistoryLimit.check(); err != nil {
		return err
	}
	if err := t.checkChains(); err != nil {
		return err
	}
	if err := t.checkWindow(sched); err != nil {
		return err
	}
	return t.checkAlerts()
}

// MaxChainTargets is the most ids on_success and on_failure hold each.
const MaxChainTargets = 16

// checkChains refuses chain targets that are not task ids, repeated, the
// task itself, or too many. Empty lists become nil.
func (t *Task) checkChains() error {
	for _, f := range []struct {
		name string
		ids  *[]string
	}{{"on_success", &t.OnSuccess}, {"on_failure", &t.OnFailure}} {
		if len(*f.ids) == 0 {
			*f.ids = nil
			continue
		}
		if len(*f.ids) > MaxChainTargets {
			return Invalid(f.name, "%d targets, more than the limit of %d", len(*f.ids), MaxChainTargets)
		}
		for i, id := range *f.ids {
			field := fmt.Sprintf("%s[%d]", f.name, i)
			if err := CheckID(id); err != nil {
				return Invalid(field, "%s", err.(*ValidationError).Reason)
			}
			if id == t.ID {
				return Invalid(field, "%q is the task itself: a chain must not form a cycle", id)
			}
			for _, prev := range (*f.ids)[:i] {
				if prev == id {
					return Invalid(field, "%q is listed twice", id)
				}
			}
		}
	}
	return nil
}

// check refuses limits out of 0-MaxHistoryLimit.
func (l *HistoryLimit) check() error {
	if l == nil {
		return nil
	}
	for _, f := range []struct {
		name, flag string
		v          *int
	}{{"successes", "--history-success-limit", l.Successes}, {"failures", "--history-failure-limit", l.Failures}} {
		if f.v != nil && (*f.v < 0 || *f.v > MaxHistoryLimit) {
			return Invalid("history_limit."+f.name, "%d is not within 0-%d (leave it out for the node's %s)",
				*f.v, MaxHistoryLimit, f.flag)
		}
	}
	return nil
}

// shortestGap returns the shortest interval between consecutive fires of s
// over its next 64 fires from a fixed instant: a bound that holds for
// every schedule up to DST quirks, which jitter is small against.
func shortestGap(s schedule.Schedule) time.Duration {
	gap := time.Duration(1<<63 - 1)
	t := s.Next(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	for range 64 {
		n := s.Next(t)
		if n.IsZero() {
			break
		}
		gap = min(gap, n.Sub(t))
		t = n
	}
	return gap
}

// standardMethods are the methods of RFC 9110 and PATCH, which
// canonicalMethod writes in upper case.
var standardMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}

// canonicalMethod is DefaultHTTPMethod for "", and a standard method in
// upper case however it is written: methods are case-sensitive, so "post"
// would be sent as an extension method that servers refuse, which no one
// writing it means. Other tokens are kept as written.
func canonicalMethod(m string) string {
	if m == "" {
		return DefaultHTTPMethod
	}
	for _, std := range standardMethods {
		if strings.EqualFold(m, std) {
			return std
		}
	}
	return m
}

// applyDefaults fills the fields left zero and normalizes empty collections
// and the schedule's surrounding spaces (a newline a shell left on it).
func (t *Task) applyDefaults() {
	t.Schedule = strings.TrimSpace(t.Schedule)
	if t.Timezone == "" {
		t.Timezone = DefaultTimezone
	}
	if t.Timeout == 0 {
		t.Timeout = Duration(DefaultTimeout)
	}
	if t.Retry.MaxAttempts == 0 {
		t.Retry.MaxAttempts = DefaultMaxAttempts
	}
	if t.Retry.Backoff == 0 {
		t.Retry.Backoff = Duration(DefaultBackoff)
	}
	if t.Retry.MaxBackoff == 0 {
		t.Retry.MaxBackoff = max(Duration(DefaultMaxBackoff), t.Retry.Backoff)
	}
	if t.Misfire == "" {
		t.Misfire = DefaultMisfire
	}
	if t.CatchupWindow == 0 {
		t.CatchupWindow = Duration(DefaultCatchupWindow)
	}
	if t.Concurrency == "" {
		t.Concurrency = DefaultConcurrency
	}
	if t.Executor.Type == ExecutorHTTP {
		t.Executor.Method = canonicalMethod(t.Executor.Method)
	}
	if l := t.HistoryLimit; l != nil && l.Successes == nil && l.Failures == nil {
		t.HistoryLimit = nil
	}
	if len(t.Labels) == 0 {
		t.Labels = nil
	}
	// One form per instant, so that a task decodes to what it encoded.
	t.NotBefore, t.NotAfter = utcOrZero(t.NotBefore), utcOrZero(t.NotAfter)
	e := &t.Executor
	if len(e.Headers) == 0 {
		e.Headers = nil
	}
	if len(e.Env) == 0 {
		e.Env = nil
	}
	if len(e.Command) == 0 {
		e.Command = nil
	}
	if len(e.Payload) == 0 || string(e.Payload) == "null" {
		e.Payload = nil
	}
}

// CheckID refuses an id that is not 1-MaxIDLen bytes of UTF-8 without
// control characters, with a *ValidationError on "id".
func CheckID(id string) error {
	switch {
	case id == "":
		return Invalid("id", "required")
	case len(id) > MaxIDLen:
		return Invalid("id", "%d bytes, more than %d", len(id), MaxIDLen)
	case !utf8.ValidString(id):
		return Invalid("id", "%q is not valid UTF-8", id)
	}
	if r, ok := controlChar(id); ok {
		return Invalid("id", "%q contains the control character %U", id, r)
	}
	return nil
}

// CheckPrefix refuses, with a *ValidationError on "prefix", a prefix no
// id can start with (CheckID's rules: valid UTF-8, so whole characters,
// no control character, at most MaxIDLen bytes): a filter by it would
// match nothing. The empty prefix, every id, passes.
func CheckPrefix(prefix string) error {
	var ve *ValidationError
	if prefix != "" && errors.As(CheckID(prefix), &ve) {
		return Invalid("prefix", "want the start of a task id: %s", ve.Reason)
	}
	return nil
}

// controlChar returns the first control character in s (C0, DEL, C1).
func controlChar(s string) (rune, bool) {
	for _, r := range s {
		if unicode.IsControl(r) {
			return r, true
		}
	}
	return 0, false
}

// checkDuration checks 0 < d <= limit, or 0 <= d <= limit when zeroOK.
func checkDuration(field string, d Duration, zeroOK bool, limit time.Duration) error {
	switch {
	case d < 0 || d == 0 && !zeroOK:
		return Invalid(field, "%s is not more than 0", d)
	case time.Duration(d) > limit:
		return Invalid(field, "%s is more than %s", d, Duration(limit))
	}
	return nil
}

func checkLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return Invalid("labels", "%d labels, more than %d", len(labels), MaxLabels)
	}
	for k, v := range labels {
		if err := CheckLabelKey(k); err != nil {
			return err
		}
		if len(v) > maxLabelValLen {
			return Invalid("labels", "value of %q: %d bytes, more than %d", k, len(v), maxLabelValLen)
		}
		if !utf8.ValidString(v) {
			return Invalid("labels", "value of %q is not valid UTF-8", k)
		}
		if r, ok := controlChar(v); ok {
			return Invalid("labels", "value of %q contains the control character %U", k, r)
		}
	}
	return nil
}

// CheckLabelKey checks k as a label's key (a *ValidationError of field
// "labels"): what a selector of tasks by label may name.
func CheckLabelKey(k string) error {
	if k == "" || len(k) > maxLabelKeyLen || strings.IndexFunc(k, notLabelKeyChar) >= 0 {
		return Invalid("labels", "key %q: want 1-%d bytes of A-Z a-z 0-9 . _ / -", k, maxLabelKeyLen)
	}
	return nil
}

func notLabelKeyChar(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
		r == '.' || r == '_' || r == '/' || r == '-')
}
