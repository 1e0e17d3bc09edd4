package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Fire is one execution attempt of a task, as executors and in-process
// handlers receive it. The engine passes it by pointer; executors do not
// modify or retain it after Execute returns.
type Fire struct {
	// TaskID is the task's id.
	TaskID string
	// ScheduledAt is the scheduled time of the fire, in UTC with millisecond
	// precision; with TaskID it identifies the fire.
	ScheduledAt time.Time
	// Attempt is 1 for the first attempt and counts retries after it.
	Attempt int
	// Node is the id of the node that fired.
	Node string
	// Fence is the fencing token: the etcd revision of the partition lock
	// held while firing. A receiver that remembers the highest fence it saw
	// per task can refuse fires from a node that lost its partition.
	Fence int64
	// Payload is the handler executor's payload, nil for other executors:
	// the task's, or a trigger's override for this one fire. Handlers share
	// it across fires and must not modify it.
	Payload json.RawMessage
	// Output, when not nil, receives the start of what the attempt printed
	// (the task's capture): an exec command's stdout and stderr, an http
	// answer's body. A handler may write to it. Nil for tasks without
	// capture: then nothing is kept.
	Output *Output
	// Body, when not nil, replaces the http executor's request body for
	// this one fire (a trigger's override); "" sends none.
	Body *string
}

// IdempotencyKey returns "<task-id>@<scheduled_at unix ms>": the same for
// every attempt and every node that runs this fire, different for any other
// fire.
func (f *Fire) IdempotencyKey() string {
	var buf [20]byte
	return f.TaskID + "@" + string(strconv.AppendInt(buf[:0], f.ScheduledAt.UnixMilli(), 10))
}

// scheduledAtLayout is RFC 3339 with exactly three fractional digits, for a
// time already in UTC: "2026-03-29T01:00:00.000Z".
const scheduledAtLayout = "2006-01-02T15:04:05.000Z"

// fireValues are the per-fire strings that HTTP headers and exec variables
// carry, built with a single allocation.
type fireValues struct {
	key, scheduledAt, attempt, fence string
}

func (f *Fire) values() fireValues {
	// One buffer for all four strings, sliced afterwards: a fire's headers
	// then cost one allocation for these values instead of four.
	b := make([]byte, 0, len(f.TaskID)+1+20+len(scheduledAtLayout)+20+20)
	b = append(b, f.TaskID...)
	b = append(b, '@')
	b = strconv.AppendInt(b, f.ScheduledAt.UnixMilli(), 10)
	k := len(b)
	b = f.ScheduledAt.UTC().AppendFormat(b, scheduledAtLayout)
	s := len(b)
	b = strconv.AppendInt(b, int64(f.Attempt), 10)
	a := len(b)
	b = strconv.AppendInt(b, f.Fence, 10)
	all := string(b)
	return fireValues{key: all[:k], scheduledAt: all[k:s], attempt: all[s:a], fence: all[a:]}
}

// Executor runs fires.
type Executor interface {
	// Execute runs the fire once and returns nil when it succeeded. It is
	// safe for concurrent use and returns promptly when ctx ends, with an
	// error wrapping ctx.Err() (see the package documentation).
	Execute(ctx context.Context, f *Fire) error
}

// Errors callers test for with errors.Is. Timeouts and cancels are not
// among them: they wrap context.DeadlineExceeded and context.Canceled.
var (
	// ErrInvalidSpec is wrapped by the errors of NewHTTP and NewExec for a
	// spec they refuse.
	ErrInvalidSpec = errors.New("executor: invalid spec")
	// ErrNotRegistered is wrapped by the error of a handler executor whose
	// handler is not registered on this node.
	ErrNotRegistered = errors.New("executor: handler not registered")
	// ErrUnsupported is wrapped by the error of NewExec on systems where exec
	// is not implemented.
	ErrUnsupported = errors.New("executor: not supported on this system")
	// ErrNotStarted is wrapped, beside ctx.Err(), by the error of an
	// Execute whose ctx had ended before it started any work: no request
	// was sent, no process started, no handler called. The attempt did
	// nothing, and its caller may run it again as the same attempt.
	ErrNotStarted = errors.New("executor: not started")
)

// invalidSpec returns an error wrapping ErrInvalidSpec.
func invalidSpec(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, args...))
}

// interrupted returns the error of an attempt that ctx ended before it
// finished. It wraps ctx.Err(), so errors.Is tells a timeout from a cancel,
// and the cancel cause when the canceller gave a distinct one (e.g. the
// engine's "replaced"), so that is testable too. detail, when not empty,
// follows the cause.
func interrupted(ctx context.Context, kind, detail string) error {
	err := ctx.Err()
	if detail != "" {
		detail = ": " + detail
	}
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%s: %w (%w)%s", kind, err, cause, detail)
	}
	return fmt.Errorf("%s: %w%s", kind, err, detail)
}

// notStarted is interrupted's error for an Execute that ctx ended before
// it started any work: it wraps ErrNotStarted too, its text unchanged.
func notStarted(ctx context.Context, kind, detail string) error {
	return notStartedError{interrupted(ctx, kind, detail)}
}

type notStartedError struct{ error }

func (e notStartedError) Unwrap() []error { return []error{e.error, ErrNotStarted} }
