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
//     moves a partition) neither repeat nor miss a fire, however the
//     second's burst is cut into batches (handover.go): the old owner
//     dispatches every fire of the partition due up to its mark, waits until
//     workers took them, and writes a released checkpoint with the mark and
//     the fires before it that did not run (waiting behind a running fire,
//     early triggers); the new owner runs those and resumes exactly after
//     the mark (TestLoop_ReleaseBetweenBatchesOfOneTickHandsEachFireOverOnce,
//     TestEngine_JoinsAndLeavesNeitherRepeatNorMiss, and the chaos suite in
//     internal/clustertest).
//   - Make-before-break (prepare.go): the new owner reads and decodes a
//     partition while the old owner still fires it, so a hand-over stands
//     still for a lock hand-off and one request, not for the partition's
//     size (TestEngine_JoinPreparesBeforeTheOldOwnerLetsGo).
//   - A release etcd refuses is retried with the node watermark held at its
//     mark; past the lease TTL the node ends its session so that its locks
//     pass on: no lock outlives its cause
//     (TestEngine_FailedReleaseDoesNotStrandPartitions).
//   - After a crash or a cut-off, the next owner resumes after the dead
//     session's last watermark etcd acknowledged. Dispatch never runs more
//     than Config.Lead past that watermark, so at most Lead of fires are
//     repeated, and none is missed inside the catch-up window. A node that
//     fenced itself and takes its partitions back, nobody having fired them
//     since, repeats nothing
//     (TestEngine_FencedNodeTakingItsPartitionsBackRepeatsNothing).
//   - A node dispatches nothing past its fencing deadline (membership): a
//     paused or cut-off node stops before its locks can pass on. Its queued
//     fires are dropped unrun, for the next owner to fire. Every watermark
//     write is conditioned on the session's lease holding the node key, so
//     a node whose lease ended unseen (a frozen VM) stops at its next write
//     (TestEngine_NodeKeyGoneEndsTheSession).
//   - Steady state costs etcd one watermark write per node every
//     WatermarkInterval plus keep-alives, whatever the fire rate; the
//     partition mutex is only taken when a partition changes hands.
//   - Task changes (put, pause, resume, delete) and triggers take effect on
//     the owner within a watch delivery, well under a second.
//   - A restarted node whose Badger cache is usable loads its partitions
//     from it, brought up to date by one request for what changed since
//     the cached revision, with no range read of the partition.
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
//   - Concurrency policies (forbid, buffer_one, replace) hold on one owner:
//     the next owner does not know that a fire is still running on the old
//     one, so after a hand-over a fire may start while the previous one
//     still runs there.
//   - A new owner names its session in a partition's checkpoint only once
//     its watermark covers the partition's catch-up; a crash before that
//     makes the next owner resume from the partition's previous point, so
//     fires in between may repeat. Likewise an acquire that fails after
//     loading part of a partition puts the previous checkpoint back.
//   - A released checkpoint lists at most 2000 unrun fires; past that its
//     point stops before the rest, which the next owner repeats. Queued
//     fires are listed only when workers did not take them within 2 s.
//   - A misfire decision (a fire released later than the misfire threshold,
//     after a pause) looks up to the present, past the bounded lead: a
//     crash right after it may repeat that one catch-up fire.
//   - A fired trigger whose key could not be deleted before its node
//     crashed fires again on the next owner.
//   - Executors run a fire at least once in failure scenarios; receivers
//     deduplicate on the idempotency key and may refuse fences lower than
//     one they have seen (Shardcron-Fence).
//
// # Where to change what
//
//   - The hand-over protocol: handover.go (release, take-over, checkpoints,
//     held watermarks, stuck releases), prepare.go (make-before-break) and
//     the acquire in ownership.go, which also keeps a session's service.
//   - A misfire or concurrency policy: policy.go (pure functions, with
//     table tests); the loop applies them in dispatch.go.
//   - The dispatch loop and its commands: loop.go; the fire path:
//     dispatch.go; the worker pool and the watermark's accounting: pool.go;
//     watermarks in etcd: watermark.go; triggers: trigger.go; the
//     protocol's timings: timings.go.
//   - An executor: engine/executor (its fields' rules), then profile.go and
//     validate.go here.

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
// docs/design.md's layout, with these additions: watermark keys carry the
// session (above); a checkpoint may name the session ("session") and list
// unrun fires it hands over ("pending": [{"id", "at", "trigger"}]) and,
// released, the health of its tasks that failed ("health": [{"id",
// "fails", "failed_at", "error", "ok_at"}], health.go);
// /<prefix>/triggers/<partition>/<unix ms>/<id> holds a trigger until the
// owner has taken it; and /<prefix>/prepared/<node-id>, under the node's
// lease, lists the partitions it prepared and waits to lock.
//
// # Concurrency
//
// One goroutine, the dispatch loop, owns the timing wheel and the task
// table; everything else talks to it through commands. An Engine's exported
// methods are safe for concurrent use.
package engine
