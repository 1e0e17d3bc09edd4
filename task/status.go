package task

import "fmt"

// Status is a status filter of a list of tasks (GET /v1/tasks?status=),
// answered by each task's owner.
type Status string

// The status filters.
const (
	// StatusFailing: the task's last fire failed after its last attempt
	// (consecutive_failures > 0).
	StatusFailing Status = "failing"
	// StatusPaused: the task is paused.
	StatusPaused Status = "paused"
	// StatusStale: the task is not paused and no fire of it succeeded
	// within two of its schedule's intervals: the second scheduled time
	// after its last success has passed. Before a first success on its
	// owner, the clock starts when the owner took the task (or when it was
	// created, resumed or rescheduled), so a hand-over or a resume never
	// makes a task stale at once.
	StatusStale Status = "stale"
)

// ParseStatus reads a status filter; a bad one is a *ValidationError.
func ParseStatus(s string) (Status, error) {
	switch st := Status(s); st {
	case StatusFailing, StatusPaused, StatusStale:
		return st, nil
	}
	return "", &ValidationError{Field: "status", Reason: fmt.Sprintf("want failing, paused or stale, got %q", s)}
}

// StatusQuery selects, by status, the tasks one node owns.
type StatusQuery struct {
	Status Status
	Prefix string // only ids with this prefix
	After  string // only ids after this one ("": from the first)
	Limit  int    // at most this many, 1 to the registry's MaxListLimit+1
}

// Match is a task a StatusQuery selected, with its state.
type Match struct {
	ID    string `json:"id"`
	State *State `json:"state"`
}
