// Package bench is shardcron's benchmark harness: it runs scenarios
// (throughput, burst, memory, import, restart, query, trigger, rebalance,
// failover, and the baselines lock-per-fire, robfig and afterfunc) on
// nodes that share one embedded etcd, and reports what they measured as
// Results, ratios against the baselines, a JSON line and an HTML report
// with SVG charts.
//
// Nodes run in the bench's process, or (Config.Procs, for every scenario
// in ProcScenarios: all but the baselines) as 'shardcron server'
// processes (memory's one node: 'shardcron bench memory --etcd', which
// reads its own heap), so that their heaps and garbage collections are
// their own as in production. etcd, the
// receiver of the keyed fires and the recorder stay in the bench's process.
// A process's counters, CPU time and RSS come from its /metrics, its ring
// from /v1/partitions, its fires from the receiver (its keyed tasks use the
// http executor).
//
// # What a figure means
//
//   - A fire's lag is the time its executor started minus its scheduled
//     time, observed by the harness's own handler, HTTP receiver or
//     callback: end to end, wheel, queue and worker included. A window's
//     lag figures are those of the fires that ran in it (a burst's: of the
//     fires scheduled at its second), so a scheduler that falls behind
//     shows it as lag. A burst, and a throughput with node processes, are
//     the exceptions: their lag figures are the nodes' own fire-lag
//     histograms over the burst or the window (every fire, from its due
//     time to a worker taking it; quantiles interpolated in buckets that
//     grow by a quarter, the maximum a bucket's upper bound). Through a
//     process a probe's lag would time its HTTP request to the receiver as
//     much as the node, and a burst probes too few partitions for a p99
//     (below).
//   - A keyed fire scheduled in the window that has not run 2 s after the
//     window ends is missed.
//   - Duplicates and misses are counted by idempotency key (task id and
//     scheduled second) for the keyed tasks: every task with the handler
//     and http executors, and with the noop executor one probe task per
//     partition (a handler task standing among the noop ones), since noop
//     fires are invisible by design. A burst, and a throughput run
//     through node processes, probe 64 partitions only: each probe fire
//     costs the node far more than a noop fire (an HTTP request through a
//     process, a handler call in-process), and 1 024 of them within one
//     second weighed on the fires around them (keyed_tasks says how many
//     were probed). Fire totals of all tasks come from the engines'
//     counters.
//   - In-process, CPU cores and RSS are those of the whole process, the
//     embedded etcd and the harness included: an upper bound of a node's.
//     So are memory's bytes a task and full GC, which are not even bounds:
//     etcd's heap shrinks while the engine loads when etcd drops its raft
//     log at a snapshot, and a full GC marks etcd's heap too.
//     With node processes they are the nodes' sums (a node that is gone
//     counts its CPU until it went, and no RSS).
//   - A hand-over's lag is, per partition that moved, the lag of its probe's
//     first fire on its new owner after the event. Rebalance measures three
//     events: the join, the joined node's graceful leave, and its start
//     from its data directory (its cache: a rolling restart's), each over
//     its own window (each ends where the next one's begins).
//   - With several runs, each figure is the median of the runs' (the lower
//     middle one for an even count); the note lists duplicates, misses and
//     misfires run by run where the runs disagree.
//   - A query's latency is that of GET /v1/tasks to the first node, the
//     answer read and decoded, as a client sees it: p50 and p99 over 100
//     rounds. The export is GET /v1/tasks:export of every task.
//   - A trigger's figures are timed from the start of its bulk call (POST
//     /v1/tasks:trigger of every task, to the first node): the call until
//     its answer; the last fire, seen on the nodes' fire counters, polled
//     every 20 ms in-process and 100 ms through processes (so up to that
//     late); the trigger keys, counted every 100 ms from the last fire
//     until none is left or none was deleted for 10 s. Its duplicates and
//     misses are the keyed tasks': a trigger's fire is scheduled at the
//     trigger's time, so a keyed task with no fire scheduled in the
//     seconds of the call is missed. Fires past the triggers are counted
//     in fires and said in the note.
//   - etcd requests are counted on the nodes' clients (engine.RequestCounter)
//     over the steady window only.
//
// # What it does not do
//
// It asserts nothing about speed: a run reports, it never fails because it
// was slow. Runs on a shared machine are noisy; BENCHMARKS.md quotes medians
// of several runs with the command that produced them.
package bench
