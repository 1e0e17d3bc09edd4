package client

import (
	"time"

	"github.com/shardcron/shardcron/task"
)

// WarningHeader carries what a successful PUT /v1/tasks/{id} warns of: a
// task that only some live nodes can run.
const WarningHeader = "Shardcron-Warning"

// The JSON bodies of the API's answers, shared by the server (package api)
// and this client. docs/api.md describes them.

// ListResponse is the answer of GET /v1/tasks.
type ListResponse struct {
	Tasks []*task.Task `json:"tasks"`
	// NextCursor is the cursor of the next page (the last id of this one),
	// "" after the last.
	NextCursor string `json:"next_cursor"`
	// Partial lists the nodes that did not answer a list by status (with
	// why): their tasks may be missing. Absent when every node answered.
	Partial []string `json:"partial,omitempty"`
}

// BatchResult is the answer of POST /v1/tasks:batch.
type BatchResult struct {
	// Written counts the tasks now stored as given (rewritten, or already
	// identical and left alone).
	Written int `json:"written"`
	// Unchanged counts the tasks of Written that were identical to what is
	// stored and left alone: a batch sent again writes nothing. An item
	// whose id comes again later in the batch is not counted.
	Unchanged int `json:"unchanged"`
	// Errors lists the items that were not written, by their 0-based index
	// in the batch (for JSON Lines: among the non-blank lines), in index
	// order. Never null in answers.
	Errors []task.BatchError `json:"errors"`
	// Warnings are about tasks written that only some live nodes can run,
	// and tasks whose id comes again later in the batch (the later one is
	// stored; both count as written), in index order.
	Warnings []BatchWarning `json:"warnings,omitempty"`
}

// BatchWarning is a warning about the task at Index of a batch.
type BatchWarning struct {
	Index   int    `json:"index"`
	Warning string `json:"warning"`
}

// TriggerResponse is the answer of POST /v1/tasks/{id}/trigger.
type TriggerResponse struct {
	ScheduledAt string `json:"scheduled_at"` // RFC 3339, ms
}

// BackfillRequest is the body of POST /v1/tasks/{id}/backfill; the
// answer is the backfill's record, a task.Backfill.
type BackfillRequest struct {
	From        time.Time `json:"from"`
	To          time.Time `json:"to"`
	Concurrency *int      `json:"concurrency,omitempty"` // nil: the default; 0 is refused
}

// HistoryResponse is the answer of GET /v1/tasks/{id}/history.
type HistoryResponse struct {
	Executions []task.Execution `json:"executions"`
	// Partial lists the nodes that did not answer (with why): their
	// records are missing, often the newest ones, the owner's. Absent
	// when every node answered.
	Partial []string `json:"partial,omitempty"`
}

// Node is a member of the cluster as GET /v1/nodes reports it, and this
// node as GET /v1/nodes/self does.
type Node struct {
	// ID, APIAddr, StartedAt and Version are what the node published in its
	// membership record.
	ID        string    `json:"id"`
	APIAddr   string    `json:"api_addr"`
	StartedAt time.Time `json:"started_at"`
	Version   string    `json:"version"`
	// Partitions is how many partitions the ring assigns to the node, and
	// PartitionList which (ascending), as the answering node's ring has it.
	Partitions    int   `json:"partitions"`
	PartitionList []int `json:"partition_list"`
	// Owned are the partitions the node reports holding right now
	// (ascending): it lags PartitionList while partitions move. Null when
	// the node did not answer.
	Owned []int `json:"owned"`
	// Tasks is how many tasks the node holds, Fires how many fires it has
	// dispatched since it started, FireRate its fires per second over about
	// the last 10 s, QueueDepth the fires waiting for a worker.
	Tasks      int     `json:"tasks"`
	Fires      uint64  `json:"fires"`
	FireRate   float64 `json:"fire_rate"`
	QueueDepth int     `json:"queue_depth"`
	// Ready: the node owns every partition the ring gives it. Fenced: it
	// has stopped dispatching until it rejoins.
	Ready  bool `json:"ready"`
	Fenced bool `json:"fenced"`
	// Leaving: the node's membership record says it is handing its
	// partitions over to stop (SIGTERM). Its API stops answering first, so
	// a leaving node often has Error too.
	Leaving bool `json:"leaving,omitempty"`
	// Error says why the node's own figures (Owned to Fenced) are missing:
	// it did not answer. Empty otherwise.
	Error string `json:"error,omitempty"`
}

// Partition is one partition as GET /v1/partitions reports it.
type Partition struct {
	Partition int `json:"partition"`
	// Owner is the node the ring assigns the partition to; "" before the
	// node has seen the member list.
	Owner string `json:"owner"`
	// State is "owned" when Owner reports holding the partition, else
	// "moving" (being released by its previous owner or acquired by the
	// new one, or Owner did not answer).
	State string `json:"state"`
}

// Partition states.
const (
	PartitionOwned  = "owned"
	PartitionMoving = "moving"
)

// NodesResponse is the answer of GET /v1/nodes.
type NodesResponse struct {
	Nodes []Node `json:"nodes"`
}

// PartitionsResponse is the answer of GET /v1/partitions.
type PartitionsResponse struct {
	Partitions []Partition `json:"partitions"`
}

// StatusAnswer is a node's answer to GET /v1/tasks:status: the first
// tasks it owns with a status, in id order, and whether more follow.
type StatusAnswer struct {
	Tasks []task.Match `json:"tasks"`
	More  bool         `json:"more"`
	// Held are the partitions whose tasks the node held, every one armed
	// under one load, from its scan's start to its end: all of their tasks
	// were looked at. A partition still loading, or released or taken
	// again during the scan, is not among them.
	Held []int `json:"held"`
}

// StatesRequest is the body of POST /v1/tasks:states (node to node).
type StatesRequest struct {
	IDs []string `json:"ids"`
}

// StatesAnswer is the answer of POST /v1/tasks:states: the states of the
// ids asked, in their order, null for tasks the node does not hold.
type StatesAnswer struct {
	States []*task.State `json:"states"`
}

// FailuresResponse is the answer of GET /v1/failures.
type FailuresResponse struct {
	Failures []task.Execution `json:"failures"`
	// Partial lists the nodes that did not answer (with why); absent when
	// every node did.
	Partial []string `json:"partial,omitempty"`
}

// Point is one interval of a node's series: what happened between the
// previous sample and T.
type Point struct {
	T         int64   `json:"t"`          // end of the interval, Unix ms
	FireRate  float64 `json:"fire_rate"`  // fires per second
	P99LagMS  float64 `json:"p99_lag_ms"` // p99 of shardcron_fire_lag_seconds over the interval, ms (0 without fires)
	Failures  uint64  `json:"failures"`   // executions failed or timed out
	Misfires  uint64  `json:"misfires"`   // fires dispatched later than the misfire threshold
	QueueFill float64 `json:"queue_fill"` // queue depth / capacity at T
}

// NodeSeries is one node's series, oldest point first.
type NodeSeries struct {
	ID     string  `json:"id"`
	Points []Point `json:"points"`
	Error  string  `json:"error,omitempty"` // why the node's points are missing
}

// SeriesResponse is the answer of GET /v1/series.
type SeriesResponse struct {
	IntervalMS int64        `json:"interval_ms"`
	Nodes      []NodeSeries `json:"nodes"`
}

// Preview is the next fire times of a schedule (docs/api.md "Schedule
// preview").
type Preview struct {
	// Timezone is the zone the times are written in: the task's.
	Timezone string `json:"timezone"`
	// Next are the scheduled times, RFC 3339 in Timezone; the fires'
	// idempotency keys are "<id>@<unix ms>" of these.
	Next []string `json:"next"`
	// Due are, with a jitter, the times each fire is released (its
	// scheduled time plus its jitter), RFC 3339 with milliseconds.
	Due []string `json:"due,omitempty"`
	// Ended says why there are fewer than asked for: the window's end
	// (task.EndedNotAfter, EndedMaxFires or EndedAt).
	Ended string `json:"ended,omitempty"`
}

// DryRun is the answer of PUT /v1/tasks/{id}?dry_run=1: the task as it
// would be stored, and its next fire times. Nothing is written.
type DryRun struct {
	DryRun  bool       `json:"dry_run"`
	Task    *task.Task `json:"task"`
	Preview *Preview   `json:"preview"`
}
