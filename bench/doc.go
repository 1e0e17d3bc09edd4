// Package bench is shardcron's benchmark harness: it runs one scenario
// (throughput, burst, memory, import, restart, rebalance, failover, and the
// baselines lock-per-fire, robfig and afterfunc) on in-process nodes that
// share one embedded etcd, and reports what it measured as a Result, a JSON
// line and an HTML report with SVG charts.
//
// # What a figure means
//
//   - A fire's lag is the time its executor started minus its scheduled
//     time, observed by the harness's own handler, HTTP receiver or
//     callback: end to end, wheel, queue and worker included. A window's
//     lag figures are those of the fires that ran in it (a burst's: of the
//     fires scheduled at its second), so a scheduler that falls behind
//     shows it as lag.
//   - A keyed fire scheduled in the window that has not run 2 s after the
//     window ends is missed.
//   - Duplicates and misses are counted by idempotency key (task id and
//     scheduled second) for the keyed tasks: every task with the handler
//     and http executors, and with the noop executor one probe task per
//     partition (a handler task standing among the noop ones), since noop
//     fires are invisible by design. Fire totals of all tasks come from the
//     engines' counters.
//   - CPU cores and RSS are those of the whole process, the embedded etcd
//     and the harness included: the figures are an upper bound of a node's.
//   - etcd requests are counted on the nodes' clients (engine.RequestCounter)
//     over the steady window only.
//
// # What it does not do
//
// It asserts nothing about speed: a run reports, it never fails because it
// was slow. Runs on a shared machine are noisy; BENCHMARKS.md quotes medians
// of several runs with the command that produced them.
package bench
