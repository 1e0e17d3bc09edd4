// Package clustertest is the fixture for multi-process cluster and chaos
// tests of shardcron, in the manner of etcd's tests/framework and
// tests/robustness: real `shardcron server` processes on an embedded etcd
// (internal/etcdtest), each reaching etcd through its own cuttable TCP
// proxy; an HTTP sink that records every fire it receives; faults (SIGTERM,
// SIGKILL, SIGSTOP/SIGCONT, cut-off from etcd, etcd restart, leader change,
// the NOSPACE alarm); and a verifier that counts the recorded fires per
// idempotency key over every scheduled second of a window.
//
// The verifier checks docs/design.md's invariants 1 to 3: every task fires
// exactly once in every second of the window, except that a crash-like fault
// (SIGKILL, SIGSTOP past the lease, cut-off from etcd, a release whose
// checkpoint write failed) may repeat the faulted node's fires of at most
// the bounded lead before its last fire, once each. A
// failed check reports the seed, the steps with their times, the first
// offending keys with the nodes that fired them, and the tail of each
// node's log.
//
// It guarantees nothing about timing: windows are checked after the fires
// they cover were due, waiting while their late fires still arrive, so a
// slow machine makes a run longer, not red. A machine so slow that a node
// falls behind by more than --misfire-threshold makes that node's misfire
// policy fold fires away; such folds pass, with a step that says so, only
// when they are as late as a misfire and no more than the node counted in
// shardcron_misfires_total, or, for a process stopped cleanly, in its
// last log line, which has those of its drain too (Folds). It is meant
// for tests only; everything it starts is stopped when the test ends.
package clustertest
