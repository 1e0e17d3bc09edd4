// Package engine is a shardcron node: the task model and its validation,
// the etcd task registry, partition ownership and hand-over, dispatch from
// the timing wheel, the worker pool, retries and executors.
//
// # What it guarantees
//
// A fire is a task id and a scheduled time; its idempotency key
// "<id>@<unix ms>" reaches every executor.
//
//   - Graceful hand-overs (a node joins, leaves with Close, or the ring
//     moves a partition) neither repeat nor miss a fire: the old owner stops
//     dispatching the partition and writes a released checkpoint with the
//     point up to which it dispatched the partition's fires, listing those
//     before it that did not run (still queued, or waiting behind a running
//     fire); the new owner runs those and resumes exactly after the point.
//   - After a crash or a cut-off, the next owner resumes after the dead
//     session's last watermark etcd acknowledged. Dispatch never runs more
//     than Config.Lead past that watermark, so at most Lead of fires are
//     repeated, and none is missed inside the catch-up window.
//   - A node dispatches nothing past its fencing deadline (membership): a
//     paused or cut-off node stops before its locks can pass on. Its queued
//     fires are dropped unrun, for the next owner to fire.
//   - Steady state costs etcd one watermark write per node every
//     WatermarkInterval plus keep-alives, whatever the fire rate; the
//     partition mutex is only taken when a partition changes hands.
//   - Task changes (put, pause, resume, delete) and triggers take effect on
//     the owner within a watch delivery, well under a second.
//   - A restarted node whose Badger cache is usable loads its partitions
//     from it, brought up to date by a watch from the cached revision, with
//     no range read of the partition.
//   - Bad input is refused with a *ValidationError before anything is
//     written: the etcd revision does not move.
//
// # What it does not guarantee
//
//   - Retries are attempts of a fire that already started: a retry waiting
//     in the wheel when its node crashes, or when its partition is handed
//     over, is not repeated by the next owner. A buffer_one fire waiting
//     behind a running one is lost with it in a crash (a graceful hand-over
//     passes it on).
//   - A new owner names its session in a partition's checkpoint only once
//     its watermark covers the partition's catch-up; a crash before that
//     makes the next owner resume from the partition's previous point, so
//     fires in between may repeat. Likewise an acquire that fails after
//     loading part of a partition puts the previous checkpoint back.
//   - A released checkpoint lists at most 2000 unrun fires; past that its
//     point stops before the rest, which the next owner repeats.
//   - A misfire decision (a fire released later than the misfire threshold,
//     after a pause) looks up to the present, past the bounded lead: a
//     crash right after it may repeat that one catch-up fire.
//   - Executors run a fire at least once in failure scenarios; receivers
//     deduplicate on the idempotency key and may refuse fences lower than
//     one they have seen (Shardcron-Fence).
//
// # Watermarks
//
// The watermark W of a session is a wheel time: every fire the wheel
// released at or before W (scheduled time plus jitter) has been taken by a
// worker, not merely queued. It is written every WatermarkInterval under
// /<prefix>/watermarks/<node-id>/<session>, one key per session (its lease),
// so that a node restarted with the same id cannot overwrite what a crashed
// session had done. Checkpoints name the session; keys that no unreleased
// checkpoint names are collected once their session is gone.
//
// # etcd layout
//
// DESIGN.md's layout, with these additions: watermark keys carry the
// session (above); a checkpoint may name the session ("session") and list
// unrun fires it hands over ("pending": [{"id", "at", "trigger"}]); and
// /<prefix>/triggers/<partition>/<unix ms>/<id> holds a trigger until the
// owner has taken it.
//
// # Concurrency
//
// One goroutine, the dispatch loop, owns the timing wheel and the task
// table; everything else talks to it through commands. An Engine's exported
// methods are safe for concurrent use.
package engine
