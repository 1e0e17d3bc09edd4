package task

import "time"

// Execution statuses (docs/api.md's execution record).
const (
	ExecutionOK       = "ok"
	ExecutionFailed   = "failed"
	ExecutionTimeout  = "timeout"
	ExecutionSkipped  = "skipped"
	ExecutionMisfired = "misfired"
	ExecutionCanceled = "canceled"
)

// Execution is one execution record: one attempt of one fire of a task, or
// a fire that was skipped, misfired or canceled. Its JSON form is docs/api.md's
// execution record. Times returned by the store's History are in UTC with nanosecond
// precision and no monotonic clock reading.
type Execution struct {
	TaskID      string    `json:"task_id"`
	ScheduledAt time.Time `json:"scheduled_at"`
	StartedAt   time.Time `json:"started_at"`
	FinishedAt  time.Time `json:"finished_at"`
	Attempt     int       `json:"attempt"` // 1-based
	Node        string    `json:"node"`
	Status      string    `json:"status"` // one of the Execution status constants
	Error       string    `json:"error,omitempty"`
	// Output is the start of what the attempt printed, for a task with
	// capture (issue 9): at most its max_bytes, valid UTF-8.
	Output string `json:"output,omitempty"`
}
