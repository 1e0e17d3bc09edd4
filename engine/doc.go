// Package engine is a shardcron node's runtime: partition ownership and
// hand-over, dispatch from the timing wheel, the worker pool, retries, and
// the executors built for the tasks it owns. The task model and its
// validation are package task; the task definitions in etcd (CRUD, lists,
// triggers, and the partition reads and watch a node loads from) are
// package registry, through which the engine reads its partitions.
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
//     the fires before it that did not run (waiting behind a running
//     fire); the new owner runs those and resumes exactly after the mark
//     (TestLoop_ReleaseBetweenBatchesOfOneTickHandsEachFireOverOnce,
//     TestEngine_JoinsAndLeavesNeitherRepeatNorMiss, and the chaos suite in
//     internal/clustertest). A trigger's key stays in etcd until its fire
//     starts (or ends unrun: skipped, its task deleted), so a trigger the
//     old owner did not start is fired by the next owner from its key,
//     with its override, and the release waits for the deletes of those it
//     started, keys put again while their fire ran included (trigger.go,
//     TestEngine_ReleaseWaitsForTheDeletesOfStartedTriggers,
//     TestEngine_TriggerKeyPutAgainWhileItsFireRunsIsNotLeftAtARelease).
//     A one-shot whose time is not after the mark fires on the new owner
//     when the old one never had it at that time: the released
//     checkpoint carries the revision up to which the old owner armed the
//     partition's changes, and etcd's history tells what it had, whatever
//     the writers' clocks stamped (load.go, decideApplied;
//     TestEngine_OneShotHandOverGoesByWhatThePreviousOwnerApplied). After
//     a crash, the dead session's watermark carries that revision as it
//     stood when its dispatch reached the watermark (watermark.go,
//     appliedLog; TestEngine_OneShotAfterACrashGoesByWhatTheCrashedOwnerApplied).
//   - A backfill (backfill.go) continues on the next owner after the
//     progress etcd last acknowledged: a graceful hand-over repeats none of
//     its fires, a crash at most 2 × its concurrency, and none is missed
//     (TestEngine_BackfillSurvivesAHandOver). A chain (chain.go) triggers
//     each target once per ended fire, with the key "<target>@<the fire's
//     scheduled ms>", across graceful hand-overs
//     (TestEngine_ChainsNeitherRepeatNorMissAcrossAHandOver).
//   - Make-before-break (prepare.go): the new owner reads and decodes a
//     partition while the old owner still fires it, and watches it from
//     there, so a hand-over stands still for a lock hand-off, one request
//     and the watch's word that it caught up (catchup.go), not for the
//     partition's size (TestEngine_JoinPreparesBeforeTheOldOwnerLetsGo).
//     A crash gives no such notice, but a dead node stops writing its
//     watermark well before its lease ends: its successors prepare its
//     partitions then (standby.go,
//     TestEngine_StandbyPreparesADeadNodesPartitionsBeforeItsLeaseEnds).
//   - A release etcd refuses is retried with the node watermark held at its
//     mark; past the lease TTL the node ends its session so that its locks
//     pass on: no lock outlives its cause
//     (TestEngine_FailedReleaseDoesNotStrandPartitions). The fires it had
//     dropped from the queue to hand over are not missed: the watermark
//     carries a resume point before them for that partition alone, whose
//     successor repeats its fires since
//     (TestEngine_StuckReleasePastTheTTLRunsTheFiresItDroppedFromTheQueue).
//   - A lock attempt that failed leaves no key ahead of the partition's
//     next owner: a put etcd applies after the attempt deleted its key is
//     deleted by the session that made it (stray.go,
//     TestEngine_LockKeyPutAfterItsAttemptFailedIsDeleted).
//   - After a crash or a cut-off, the next owner resumes after the dead
//     session's last watermark etcd acknowledged. Dispatch never runs more
//     than Config.Lead past that watermark, so at most Lead of fires are
//     repeated, and none is missed inside the catch-up window. The one
//     exception is etcd's NOSPACE alarm: it refuses the watermark, and
//     every lock and checkpoint write too, so no partition changes hands
//     while it lasts, and the node fires on rather than stop. A crash
//     during the alarm makes the next owner resume from the last
//     watermark recorded before it, so the fires since then that each
//     task's misfire policy runs late are repeated
//     (TestEngine_FiresOnThroughNoSpace). A node that
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
//   - A join logs in to etcd a bounded number of times, not once per
//     partition: the acquires' catch-up watches share
//     registry.CatchUpStreams gRPC streams, and with password
//     authentication each stream opened costs etcd a login
//     (TestEngine_JoinLogsInOncePerStreamNotPerPartition).
//   - Task changes (put, pause, resume, delete) and triggers take effect on
//     the owner within a watch delivery, well under a second.
//   - A restarted node whose Badger cache is usable loads its partitions
//     from it, brought up to date by a watch from the cached revision
//     (catchup.go), with no read of the partition.
//   - Bad input is refused with a *task.ValidationError before anything is
//     written (package registry): the etcd revision does not move.
//
// # What it does not guarantee
//
// Each case names the test that shows it happening; a test that fails
// because the engine does better takes its case off this list.
//
//   - Retries are attempts of a fire that already started. A graceful
//     hand-over passes them on: in the released checkpoint, or, for an
//     attempt still running when the release is sealed, through etcd
//     (leavers), as for one that Close's drain timeout or Hurry cancels
//     (TestEngine_RetryOfAnAttemptTheStopCancelsIsHandedOn). After a
//     crash or a fence the next owner runs the retries waiting in the
//     wheel that the node watermark's last write etcd took carried
//     (waitingretries.go, TestEngine_WaitingRetryAtAHandOver/crash): one
//     that came due and started after that write runs again there (at
//     least once, as a fire past the watermark), and one that began
//     waiting after it, or within a WatermarkInterval before it (a list
//     is published no more often), is lost, as are those past 1 000
//     (128 KiB of JSON)
//     a node, those queued behind busy workers and not started once a
//     write no longer listed them, those of a release sealed and never
//     committed, and those a successor took when it crashes in turn
//     before naming its session. Nor is the retry of an attempt that
//     fails after its node fenced run
//     (TestLoop_RetryOfAnAttemptEndingDuringTheReleaseIsHandedOver, "fails
//     after a fence's seal").
//   - A buffer_one fire waiting behind a running one, which the watermark
//     passes, goes to the next owner with the waiting retries
//     (TestEngine_BufferedFireSurvivesACrash). Once its running fire
//     ends, one that a write listed starts only when etcd acknowledged a
//     later write that no longer lists it, a write or two later: a node
//     cut off from etcd never starts it, and its successor runs it once
//     (TestEngine_CutOffNodeLeavesAListedWaitingFireToItsSuccessor). It is
//     lost when it began waiting within a WatermarkInterval before the
//     last write, or after it, and is due by the watermark; when the node
//     crashes after that acknowledgement and before a worker starts it;
//     and when that write reached etcd but its answer did not reach the
//     node before it fenced.
//   - Concurrency policies (forbid, buffer_one, replace) hold on one owner,
//     and across a graceful release: a run that outlives its wait
//     (Config.ReleaseRunWait) has a marker in etcd that the next owner counts as a
//     run in flight (elsewhere.go,
//     TestEngine_ConcurrencyPoliciesHoldForARunPastItsRelease), a run
//     that holds only a backfill's fires too, as they count for the
//     task's own fires on one owner
//     (TestEngine_BackfillFireRunningElsewhereSkipsAForbidFireAsOnItsOwner);
//     so does a backfill's concurrency, whatever the policy, for its fires
//     running past the release
//     (TestEngine_BackfillConcurrencyAcrossAGracefulHandOver), and for
//     those handed over unrun, until each ends on the next owner
//     (TestEngine_BackfillConcurrencyHoldsForItsFiresHandedOverUnrun). A node
//     that fences cancels those runs instead, as a crash would end them
//     (TestEngine_FenceCancelsTheRunsOfTasksKeptApart); a release whose
//     markers etcd refuses keeps its partition until etcd takes them
//     (TestEngine_ReleaseWaitsUntilEtcdTakesItsMarkers), and a node whose
//     release stays stuck so past the lease TTL ends its session and
//     cancels them as a fence does. A handler or
//     executor that ignores its context's cancel runs on beside the next
//     owner's fires, and so does a run started while its task allowed
//     overlaps, then edited to keep them apart: the policy a run started
//     under decides.
//   - A new owner names its session in a partition's checkpoint only once
//     its watermark covers the partition's catch-up; a crash before that
//     makes the next owner resume from the partition's previous point, and
//     what the new owner fired since repeats
//     (TestEngine_CrashBeforeTheSessionIsNamedRepeatsFires): a
//     WatermarkInterval or so of fires, or a backlog's worth when its
//     workers are behind its schedule, since the watermark is what they
//     took.
//   - An acquire that fails after loading its partition (etcd did not
//     answer one of its last reads, or the session ended) takes the tasks
//     out as a release does, dispatching the fires due up to the loop's
//     time, then puts the previous checkpoint back: the next acquire fires
//     them again (TestEngine_AcquireUndoneAfterLoadingRepeatsFires). One
//     that the ring or a leave cancels then is not undone: it ends, and the
//     partition is released with its exact mark
//     (TestEngine_AcquireTheRingCancelsAfterLoadingRepeatsNothing), a leave
//     cut short by Hurry included, which waits for such acquires
//     (TestEngine_AcquireAHurriedCloseEndsAfterLoadingRepeatsNothing): for
//     the dispatch loop, however slow
//     (TestEngine_AcquireAHurriedCloseWaitsForALoopSlowerThanEtcdTimeout),
//     and, from their cancel, 5 s at most for each of their last etcd
//     reads.
//   - A released checkpoint lists at most 2000 unrun fires; past that its
//     point stops before the first fire left out, and the next owner fires
//     every task from there as well as the listed fires, so listed fires at
//     or after that point run twice
//     (TestLoop_ReleaseListsAtMost2000UnrunFires). So do the fires a
//     checkpoint over 512 KiB of JSON sheds, after its health, its
//     end_waits and its after list
//     (TestLoop_ReleaseOfLongEscapedIDsFitsInARequest). A backfill's
//     fire, which no mark brings back, takes a scheduled fire's place
//     instead; only a list of such fires alone loses some, logged as
//     an error (TestHandOver_ListKeepsBackfillsPastTheCap). Triggers are
//     not listed: their keys hand them over, overrides included
//     (TestEngine_TriggersHandedOverUnrunRunOnceWithTheirOverrides).
//   - A release waits up to 2 s for workers to take the partition's queued
//     fires before it lists them as unrun; meanwhile neither node fires the
//     partition, so behind busy workers a hand-over stands still that long
//     and its fires run late (once)
//     (TestEngine_ReleaseBehindBusyWorkersWaitsBeforeHandingQueuedFiresOver).
//   - A misfire decision (a fire released later than the misfire threshold,
//     after a stall) looks up to the present, past the bounded lead: a
//     crash right after it repeats that one catch-up fire on the next
//     owner, not the missed fires it stands for
//     (TestEngine_MisfireCatchUpPastTheLeadRepeatsAfterACrash). A graceful
//     hand-over lists the task in its checkpoint's "after", and the next
//     owner resumes it after that fire
//     (TestEngine_MisfireCatchUpIsNotRepeatedAfterAGracefulRelease).
//   - Fires run on time only while etcd records a watermark within
//     Config.Lead: an etcd that takes T > Lead to answer lets dispatch run
//     at Lead/T of real time, the fires late, those past the misfire
//     threshold folded by their policy; the log says so
//     (TestEngine_EtcdSlowerThanTheLeadStillFires).
//   - A trigger whose fire started on a node that crashed or was cut off
//     before its key's delete reached etcd fires again on the next owner
//     (TestEngine_TriggerWhoseDeleteFailedFiresAgainAfterACrash); one
//     queued there and not started fires once, on the next owner
//     (TestEngine_TriggerQueuedAtTheFenceIsFiredByTheNextOwner), and so
//     does one of a task kept apart that a worker took there and the fence
//     cut before it started, on another node or on this one taking its
//     partitions back (TestEngine_TriggerTakenAndNotStartedAtAFenceFires),
//     or that an acquire undone after its load cut so
//     (TestEngine_TriggerTakenAndNotStartedAtAnUndoneAcquireFires), its
//     key put again while the worker held the job too
//     (TestEngine_TriggerPutAgainWhileTakenAndCutAtAFenceFires). One
//     held through a release's seal, or cut before it (the session ended
//     during the release, whose hand-over the fenced drop keeps), is not
//     listed as fired in the hand-over
//     (TestLoop_SealListsNoTriggerWhoseJobHasNotStartedAsFired): cut by
//     a fence, it fires on the next owner
//     (TestEngine_TriggerHeldThroughAReleaseAndCutAtAFenceFires), but a
//     forbid task's owner that reads the key while the held job's marker
//     stands skips it by its policy, and nobody fires it; started after
//     all, it may fire there again. One put again while held and cut by
//     an undone acquire loses that put at the undo's seal.
//   - Task health (the failure streak, the last success and failure) is
//     the owner's, in memory. A graceful hand-over passes it on; a crash
//     loses it: the next owner starts afresh, so a task still failing sends
//     one more failure alert and its pause_on_failure counts from 0 again
//     (TestEngine_FailureStreakAfterACrashOrAFence). A fenced node that takes
//     its partitions back, nobody having owned them since, keeps it from
//     the hand-over its session kept
//     (TestEngine_FailureStreakAfterACrashOrAFence/fenced). Alerts are sent at
//     most once per change of state, with retries, and are lost when the
//     alert queue is full (counted) or the node stops with some still
//     queued.
//   - A backfill repeats at most 2 × its concurrency of fires after a
//     crash (TestEngine_BackfillSurvivesAHandOver/crash). Across a
//     graceful hand-over its concurrency holds for the old owner's fires
//     still running (marked: TestEngine_BackfillConcurrencyAcrossAGracefulHandOver)
//     and those handed over unrun
//     (TestEngine_BackfillConcurrencyHoldsForItsFiresHandedOverUnrun;
//     TestEngine_BackfillUndoneAcquireLeavesItsFiresUncounted), past a
//     replace fire of the task, which marks their marker replaced rather
//     than deleting it (TestEngine_BackfillConcurrencyHoldsPastAReplaceFire),
//     and for a retry handed on through etcd, counted from its arrival,
//     its run's marker kept until etcd has it
//     (TestEngine_BackfillConcurrencyHoldsForARetryHandedOnThroughEtcd);
//     but the next owner reads the two through two watches, and one
//     delivered out of order, or an attempt that failed between the
//     release's seal and its marking, lets the runner start one fire
//     beside the retry.
//   - Chain triggers wait in memory between the end of the fire and their
//     etcd write, so a crash in between, or a cut from etcd past Close's
//     wait, loses them
//     (TestEngine_CloseCutOffFromEtcdDoesNotWaitForeverForAChainWrite).
//   - Executors run a fire at least once in failure scenarios: after a
//     crash, the fires dispatched past the last acknowledged watermark (at
//     most Config.Lead of them) run again with the same idempotency key and
//     a higher fence. Receivers deduplicate on the key and may refuse
//     fences lower than one they have seen (Shardcron-Fence)
//     (TestEngine_CrashRepeatsFiresPastTheAcknowledgedWatermark).
//
// # Where to change what
//
//   - The hand-over protocol: handover.go (release, take-over, checkpoints,
//     held watermarks, stuck releases), prepare.go (make-before-break),
//     standby.go (the same ahead of a crash's lease expiry), the acquire
//     in ownership.go, which also keeps a session's service, and
//     catchup.go (a prepared partition brought up to its acquisition).
//   - A misfire or concurrency policy: policy.go (pure functions, with
//     table tests); the loop applies them in dispatch.go.
//   - The dispatch loop and its commands: loop.go; the fire path:
//     dispatch.go; the worker pool and the watermark's accounting: pool.go;
//     watermarks in etcd: watermark.go; triggers: trigger.go; the
//     protocol's timings: timings.go.
//   - An executor: engine/executor (the executor, its constructor and its
//     fields' rules, as a Check method returning *executor.FieldError),
//     its fields on task.Executor and one entry in task/kind.go's kinds
//     (fields, check, build), then the fields in appendProfileKey (profile.go):
//     TestProfileKey_CoversFireFields fails until they are there.
//   - Windows, limits and one-shot tasks (not_before, not_after,
//     max_fires, @at, delete_after_fire): window.go wraps a task's
//     schedule in its window (task.Window), which every node derives from
//     the definition alone, so a hand-over needs nothing more
//     (TestEngine_WindowsAndOneShotsAcrossAHandOver) but for one-shots
//     whose time passed, which fire on the new owner when the old one
//     never had them at that time (load.go, decideApplied), and for
//     paused delete_after_fire tasks whose last fire ended on the old
//     owner, which the release lists (end_waits; load.go, heldEndWaits),
//     as its watermark writes do for a crash or a fence (endwaits.go).
//   - How the Badger cache keeps tasks (as etcd's JSON, or as a shape
//     shared by the tasks with the same firing fields) and how a load
//     decodes them: shape.go and the decoder in load.go. A fired field
//     that a shape would lose fails TestShape_LoadsAsTheTaskJSON.
//   - The task model, its defaults and validation: package task. How tasks
//     are stored, listed and read by partition: package registry. Talking
//     to a node from Go without linking the runtime: package api/client.

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
// session (above), and the value is {"at", "partitions": {"<p>": resume
// point}, "applied": {"<p>": revision}, "applied_base": revision,
// "end_waits": {"<p>": {"applied", "ids"}}}, with partitions only while a
// release that dropped fires from the queue is uncommitted (holds),
// applied, of the partitions changed since the value at applied_base,
// while the session arms any (appliedRevs), and end_waits while it holds
// paused delete_after_fire tasks whose last fire ended, unless the value
// at applied_base has them (endwaits.go); the time alone when it has
// none; a checkpoint may name the session ("session") and list unrun
// fires it hands over ("pending": [{"id", "at", "backfill"}]) and,
// released, the health of its tasks that failed ("health": [{"id",
// "fails", "failed_at", "error", "ok_at"}], health.go) and the paused
// delete_after_fire tasks whose last fire ended there ("end_waits": [id],
// window.go);
// /<prefix>/triggers/<partition>/<unix ms>/<id> holds a trigger until its
// fire starts on the owner, or ends there unrun; and
// /<prefix>/prepared/<node-id>, under the node's lease, lists the
// partitions it prepared and waits to lock. This package
// names the runtime's keys (keys.go: locks, checkpoints, watermarks,
// prepared); package registry names the task, trigger and index keys.
//
// # Concurrency
//
// One goroutine, the dispatch loop, owns the timing wheel and the task
// table; everything else talks to it through commands. An Engine's exported
// methods are safe for concurrent use.
package engine
