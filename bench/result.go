package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strconv"
)

// Result is what one scenario measured. Its JSON holds the fields that
// apply to the scenario (Fields), in the order of the documented list.
type Result struct {
	Scenario         string
	Tasks            int
	Nodes            int
	DurationS        float64 // the measured window
	Fires            uint64  // fires executed in the window
	FiresPerSec      float64
	LagP50Ms         float64
	LagP99Ms         float64
	LagMaxMs         float64
	CPUCores         float64 // process CPU time / wall time over the window
	RSSBytes         uint64
	BytesPerTask     float64 // engine (or baseline) heap per task
	EtcdBytesPerTask float64
	GCPauseMs        float64 // a full GC of the loaded heap, wall time
	EtcdRequests     uint64  // sent by the nodes in the window
	Duplicates       uint64  // keyed fires executed more than once
	Missed           uint64  // keyed fires expected in the window, not run by 2 s after it
	Misfires         uint64  // fires the engines dispatched past the misfire threshold
	HandoffP50Ms     float64 // per moved partition, lag of its first fire on the new owner
	HandoffP99Ms     float64
	HandoffMaxMs     float64
	TasksPerSec      float64
	ReadyMs          float64

	// Extra figures, in the JSON after the documented ones.
	KeyedTasks      int     // tasks whose fires were keyed (duplicates, missed)
	ExpectedFires   uint64  // fires the schedule gives the window, all tasks (trigger: the triggers written)
	MovedPartitions int     // rebalance, failover
	HandoffGapMaxMs float64 // per moved partition, last fire on the old owner to first on the new
	FirstFireMs     float64 // restart: from start to the first fire
	StopMs          float64 // restart: the graceful stop before it (the cache's settle included)
	LoadMs          float64 // memory: loading the tasks into the engine

	// Query: latencies of GET /v1/tasks over queryRounds rounds, and the
	// export of every task.
	PrefixP50Ms       float64 // the first page of 100 prefix matches
	PrefixP99Ms       float64
	LabelP50Ms        float64 // 100 tasks with a label
	LabelP99Ms        float64
	PageP50Ms         float64 // a page of 1000 without a filter, from the middle
	PageP99Ms         float64
	ExportTasksPerSec float64

	// Trigger: the bulk trigger of every task (POST /v1/tasks:trigger),
	// timed from the start of its call.
	TriggerMs             float64 // until the call's answer
	TriggersPerSec        float64 // trigger keys written a second of the call
	LastFireMs            float64 // until the last fire ran (DurationS, in ms)
	TriggerKeysAtLastFire uint64  // trigger keys in etcd just after the last fire
	TriggerKeysLeft       uint64  // trigger keys in etcd once the owners stopped deleting them
	TriggerKeysGoneMs     float64 // until etcd held no trigger key; 0 while some are left

	// Rebalance's later events, each over its own window, from the event
	// to the end: the node that joined leaves gracefully (SIGTERM, or
	// Close in-process), then starts again from its data directory and
	// joins once more, as a rolling restart restarts a node.
	Leave, Rejoin Event

	// Shown in the JSON only when set.
	Runs         int     // runs the figures are the medians of, when more than 1
	Procs        bool    // the nodes ran as processes: CPU and RSS are theirs
	HarnessCores float64 // with Procs: the bench's own process (etcd, receiver, recorder)
	Note         string

	// Charts; not in the JSON.
	LagSeries []SeriesPoint `json:"-"`
	LagDist   []Bucket      `json:"-"`
}

// Event is what one of rebalance's later events did: the figures the
// join's fields of the same names give the join.
type Event struct {
	ReadyMs         float64 // from the event until the live nodes are ready with every task
	Misfires        uint64
	Missed          uint64
	Duplicates      uint64
	LagP99Ms        float64
	HandoffP50Ms    float64
	HandoffP99Ms    float64
	HandoffMaxMs    float64
	HandoffGapMaxMs float64
	MovedPartitions int
}

// event is r, the result of an event's window, as an Event.
func (r *Result) event() Event {
	return Event{ReadyMs: r.ReadyMs, Misfires: r.Misfires, Missed: r.Missed, Duplicates: r.Duplicates, LagP99Ms: r.LagP99Ms,
		HandoffP50Ms: r.HandoffP50Ms, HandoffP99Ms: r.HandoffP99Ms, HandoffMaxMs: r.HandoffMaxMs,
		HandoffGapMaxMs: r.HandoffGapMaxMs, MovedPartitions: r.MovedPartitions}
}

// SeriesPoint is one second of a run.
type SeriesPoint struct {
	T      float64 // seconds since the run's start
	Fires  uint64
	P50Ms  float64
	P99Ms  float64
	MaxMs  float64
	HasLag bool
}

// Bucket is one bar of a lag distribution: Count fires with lag in
// (previous bucket's UpperMs, UpperMs].
type Bucket struct {
	UpperMs float64
	Count   uint64
}

// field is one JSON field of a Result.
type field struct {
	name string
	get  func(r *Result) any
}

// fields are the JSON fields, documented ones first, in order.
var fields = slices.Concat([]field{
	{"scenario", func(r *Result) any { return r.Scenario }},
	{"tasks", func(r *Result) any { return r.Tasks }},
	{"nodes", func(r *Result) any { return r.Nodes }},
	{"duration_s", func(r *Result) any { return round(r.DurationS, 3) }},
	{"fires", func(r *Result) any { return r.Fires }},
	{"fires_per_sec", func(r *Result) any { return round(r.FiresPerSec, 1) }},
	{"lag_p50_ms", func(r *Result) any { return round(r.LagP50Ms, 3) }},
	{"lag_p99_ms", func(r *Result) any { return round(r.LagP99Ms, 3) }},
	{"lag_max_ms", func(r *Result) any { return round(r.LagMaxMs, 3) }},
	{"cpu_cores", func(r *Result) any { return round(r.CPUCores, 3) }},
	{"rss_bytes", func(r *Result) any { return r.RSSBytes }},
	{"bytes_per_task", func(r *Result) any { return round(r.BytesPerTask, 1) }},
	{"etcd_bytes_per_task", func(r *Result) any { return round(r.EtcdBytesPerTask, 1) }},
	{"gc_pause_ms", func(r *Result) any { return round(r.GCPauseMs, 3) }},
	{"etcd_requests", func(r *Result) any { return r.EtcdRequests }},
	{"duplicates", func(r *Result) any { return r.Duplicates }},
	{"missed", func(r *Result) any { return r.Missed }},
	{"misfires", func(r *Result) any { return r.Misfires }},
	{"handoff_p50_ms", func(r *Result) any { return round(r.HandoffP50Ms, 3) }},
	{"handoff_p99_ms", func(r *Result) any { return round(r.HandoffP99Ms, 3) }},
	{"handoff_max_ms", func(r *Result) any { return round(r.HandoffMaxMs, 3) }},
	{"tasks_per_sec", func(r *Result) any { return round(r.TasksPerSec, 1) }},
	{"ready_ms", func(r *Result) any { return round(r.ReadyMs, 1) }},
	{"keyed_tasks", func(r *Result) any { return r.KeyedTasks }},
	{"expected_fires", func(r *Result) any { return r.ExpectedFires }},
	{"moved_partitions", func(r *Result) any { return r.MovedPartitions }},
	{"handoff_gap_max_ms", func(r *Result) any { return round(r.HandoffGapMaxMs, 3) }},
	{"first_fire_ms", func(r *Result) any { return round(r.FirstFireMs, 1) }},
	{"stop_ms", func(r *Result) any { return round(r.StopMs, 1) }},
	{"load_ms", func(r *Result) any { return round(r.LoadMs, 1) }},
	{"prefix100_p50_ms", func(r *Result) any { return round(r.PrefixP50Ms, 3) }},
	{"prefix100_p99_ms", func(r *Result) any { return round(r.PrefixP99Ms, 3) }},
	{"label100_p50_ms", func(r *Result) any { return round(r.LabelP50Ms, 3) }},
	{"label100_p99_ms", func(r *Result) any { return round(r.LabelP99Ms, 3) }},
	{"page1000_p50_ms", func(r *Result) any { return round(r.PageP50Ms, 3) }},
	{"page1000_p99_ms", func(r *Result) any { return round(r.PageP99Ms, 3) }},
	{"export_tasks_per_sec", func(r *Result) any { return round(r.ExportTasksPerSec, 1) }},
	{"trigger_ms", func(r *Result) any { return round(r.TriggerMs, 1) }},
	{"triggers_per_sec", func(r *Result) any { return round(r.TriggersPerSec, 1) }},
	{"last_fire_ms", func(r *Result) any { return round(r.LastFireMs, 1) }},
	{"trigger_keys_at_last_fire", func(r *Result) any { return r.TriggerKeysAtLastFire }},
	{"trigger_keys_left", func(r *Result) any { return r.TriggerKeysLeft }},
	{"trigger_keys_gone_ms", func(r *Result) any { return round(r.TriggerKeysGoneMs, 1) }},
}, eventFields("leave", func(r *Result) *Event { return &r.Leave }),
	eventFields("rejoin", func(r *Result) *Event { return &r.Rejoin }), []field{
		{"runs", func(r *Result) any { return r.Runs }},
		{"procs", func(r *Result) any { return r.Procs }},
		{"harness_cpu_cores", func(r *Result) any { return round(r.HarnessCores, 3) }},
		{"note", func(r *Result) any { return r.Note }},
	})

// eventFields are the JSON fields of one of rebalance's later events, each
// named after the join's field of its figure.
func eventFields(event string, ev func(r *Result) *Event) []field {
	return []field{
		{event + "_ready_ms", func(r *Result) any { return round(ev(r).ReadyMs, 1) }},
		{event + "_misfires", func(r *Result) any { return ev(r).Misfires }},
		{event + "_missed", func(r *Result) any { return ev(r).Missed }},
		{event + "_duplicates", func(r *Result) any { return ev(r).Duplicates }},
		{event + "_lag_p99_ms", func(r *Result) any { return round(ev(r).LagP99Ms, 3) }},
		{event + "_handoff_p50_ms", func(r *Result) any { return round(ev(r).HandoffP50Ms, 3) }},
		{event + "_handoff_p99_ms", func(r *Result) any { return round(ev(r).HandoffP99Ms, 3) }},
		{event + "_handoff_max_ms", func(r *Result) any { return round(ev(r).HandoffMaxMs, 3) }},
		{event + "_handoff_gap_max_ms", func(r *Result) any { return round(ev(r).HandoffGapMaxMs, 3) }},
		{event + "_moved_partitions", func(r *Result) any { return ev(r).MovedPartitions }},
	}
}

// eventNames are the names of eventFields(event, …).
func eventNames(event string) []string {
	var out []string
	for _, f := range eventFields(event, nil) {
		out = append(out, f.name)
	}
	return out
}

// optional are the fields in the JSON only when set, whatever the
// scenario.
var optional = map[string]func(r *Result) bool{
	"runs":              func(r *Result) bool { return r.Runs > 1 },
	"procs":             func(r *Result) bool { return r.Procs },
	"harness_cpu_cores": func(r *Result) bool { return r.Procs && r.HarnessCores > 0 },
	"note":              func(r *Result) bool { return r.Note != "" },
}

// firing are the fields of every scenario that fires tasks for a window.
var firing = []string{"scenario", "tasks", "nodes", "duration_s", "fires", "fires_per_sec",
	"lag_p50_ms", "lag_p99_ms", "lag_max_ms", "cpu_cores", "rss_bytes", "etcd_requests",
	"duplicates", "missed", "misfires", "keyed_tasks", "expected_fires"}

// Fields lists the JSON fields of each scenario's Result.
var Fields = map[string][]string{
	Throughput:  firing,
	Burst:       firing,
	LockPerFire: firing,
	Rebalance: slices.Concat(firing, []string{"handoff_p50_ms", "handoff_p99_ms", "handoff_max_ms", "ready_ms", "moved_partitions", "handoff_gap_max_ms"},
		eventNames("leave"), eventNames("rejoin")),
	Failover:  append(slices.Clone(firing), "handoff_p50_ms", "handoff_p99_ms", "handoff_max_ms", "ready_ms", "moved_partitions", "handoff_gap_max_ms"),
	Robfig:    {"scenario", "tasks", "duration_s", "fires", "fires_per_sec", "lag_p50_ms", "lag_p99_ms", "lag_max_ms", "cpu_cores", "rss_bytes", "bytes_per_task", "duplicates", "missed", "expected_fires"},
	AfterFunc: {"scenario", "tasks", "duration_s", "fires", "fires_per_sec", "lag_p50_ms", "lag_p99_ms", "lag_max_ms", "cpu_cores", "rss_bytes", "bytes_per_task", "duplicates", "missed", "expected_fires"},
	Memory:    {"scenario", "tasks", "nodes", "bytes_per_task", "etcd_bytes_per_task", "gc_pause_ms", "rss_bytes", "load_ms"},
	Import:    {"scenario", "tasks", "duration_s", "tasks_per_sec", "cpu_cores", "rss_bytes", "etcd_requests"},
	Restart:   {"scenario", "tasks", "nodes", "ready_ms", "first_fire_ms", "stop_ms", "rss_bytes"},
	Query: {"scenario", "tasks", "nodes", "duration_s", "rss_bytes", "prefix100_p50_ms", "prefix100_p99_ms",
		"label100_p50_ms", "label100_p99_ms", "page1000_p50_ms", "page1000_p99_ms", "export_tasks_per_sec"},
	Trigger: {"scenario", "tasks", "nodes", "fires", "fires_per_sec", "cpu_cores", "rss_bytes", "etcd_requests",
		"duplicates", "missed", "misfires", "keyed_tasks", "expected_fires", "trigger_ms", "triggers_per_sec",
		"last_fire_ms", "trigger_keys_at_last_fire", "trigger_keys_left", "trigger_keys_gone_ms"},
}

// MarshalJSON writes the fields of Fields[r.Scenario] (every field for an
// unknown scenario), plus the optional ones that are set.
func (r *Result) MarshalJSON() ([]byte, error) {
	want := Fields[r.Scenario]
	var b bytes.Buffer
	b.WriteByte('{')
	n := 0
	for _, f := range fields {
		if set, ok := optional[f.name]; ok && !set(r) || !ok && want != nil && !slices.Contains(want, f.name) {
			continue
		}
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		b.WriteString(strconv.Quote(f.name))
		b.WriteByte(':')
		v, err := json.Marshal(f.get(r))
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// round keeps d decimals; NaN and infinities become 0 (JSON has neither).
func round(v float64, d int) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	p := math.Pow(10, float64(d))
	return math.Round(v*p) / p
}
