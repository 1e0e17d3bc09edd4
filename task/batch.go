package task

// BatchError is the error of one item of a batch of tasks (the registry's
// PutBatch, POST /v1/tasks:batch): why the item at Index was not written.
type BatchError struct {
	Index int    `json:"index"`
	Error string `json:"error"`
}

// BulkAction is what a bulk action (the registry's Bulk, POST
// /v1/tasks:<action>) does to every task a Selector chooses.
type BulkAction string

// Bulk actions.
const (
	BulkPause   BulkAction = "pause"   // set paused; paused tasks are left alone
	BulkResume  BulkAction = "resume"  // clear paused; running tasks are left alone
	BulkDelete  BulkAction = "delete"  // delete the task
	BulkTrigger BulkAction = "trigger" // fire once now, outside the schedule (paused tasks too)
)

// ParseBulkAction returns the action named s, or a *ValidationError.
func ParseBulkAction(s string) (BulkAction, error) {
	switch a := BulkAction(s); a {
	case BulkPause, BulkResume, BulkDelete, BulkTrigger:
		return a, nil
	}
	return "", Invalid("action", "%q is not one of pause, resume, delete, trigger", s)
}

// Selector chooses the tasks of a bulk action: those whose id starts with
// Prefix and that carry every label of Labels. An empty selector chooses
// nothing unless All is set, so that a forgotten filter never pauses or
// deletes a whole cluster.
type Selector struct {
	Prefix string            `json:"prefix,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// All must be set to choose every task (with no prefix and no label).
	All bool `json:"all,omitempty"`
	// DryRun counts what the action would do and writes nothing.
	DryRun bool `json:"dry_run,omitempty"`
	// Note is a pause's note (a pause only; at most MaxPauseNote bytes):
	// each task the pause changes carries it in its pause record, with who
	// paused it and when.
	Note string `json:"note,omitempty"`
}

// Validate reports a selector that chooses nothing by mistake.
func (s Selector) Validate() error {
	if s.Prefix == "" && len(s.Labels) == 0 && !s.All {
		return Invalid("selector", `give a prefix, at least one label, or "all": true to act on every task`)
	}
	if s.All && (s.Prefix != "" || len(s.Labels) > 0) {
		return Invalid("selector", `"all" chooses every task: leave out prefix and labels, or leave out "all"`)
	}
	if len(s.Prefix) > MaxIDLen {
		return Invalid("prefix", "%d bytes, more than the %d of the longest task id", len(s.Prefix), MaxIDLen)
	}
	for k := range s.Labels {
		if k == "" {
			return Invalid("labels", "a label key is empty")
		}
	}
	return nil
}

// BulkResult counts what a bulk action did (or, with DryRun, would do).
type BulkResult struct {
	Action BulkAction `json:"action"`
	DryRun bool       `json:"dry_run"`
	// Matched is how many tasks the selector chose.
	Matched int `json:"matched"`
	// Changed is how many of them the action changed: paused, resumed,
	// deleted or triggered. Unchanged were already as asked (a pause of a
	// paused task). Skipped changed or went away between the read and the
	// write and no longer match: another writer got there first.
	Changed   int `json:"changed"`
	Unchanged int `json:"unchanged"`
	Skipped   int `json:"skipped"`
	// Sample holds the ids of up to BulkSampleSize matched tasks, in the
	// order read (by id for a prefix or labels), so that a dry run shows
	// what it would touch.
	Sample []string `json:"sample"`
}

// BulkSampleSize bounds BulkResult.Sample.
const BulkSampleSize = 10
