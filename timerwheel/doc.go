// Package timerwheel is a hierarchical timing wheel (Varghese & Lauck) that
// holds millions of timers with no heap allocation per timer.
//
// Timers are named by a caller-chosen uint32 id below MaxID. Their state
// lives in pages of fixed 16-byte entries indexed by id and linked into
// intrusive lists, so a timer costs 16 bytes (plus the page it shares with
// 4095 others), the garbage collector has nothing to scan, and scheduling,
// cancelling and expiring a timer never allocate once its page exists.
//
// Guarantees:
//   - Expiry is never early: Advance(now) delivers a timer only when
//     at <= now. It is late by at most one tick after the first Advance whose
//     now passes at.
//   - Every timer is delivered exactly once per Schedule, unless cancelled or
//     rescheduled first.
//   - Deliveries are in non-decreasing tick order across calls; timers due in
//     the same tick come in the order they were scheduled (or cascaded).
//   - The wheel spans the whole int64 time range: there is no horizon and no
//     overflow list, so a yearly (or centennial) timer is as exact as any
//     other.
//   - Advance with a limit stops mid-slot and resumes there on the next call,
//     so a tick that expires millions of timers can be handed out in bounded
//     batches.
//
// Cron fires pile millions of timers onto one exact second. Such a slot
// moves from one level to the next in O(1): each slot above level 0 keeps
// bounds of the ticks it holds, and when they all fall into a single slot of
// the lower level the whole list is spliced instead of walked.
//
// A Wheel is not safe for concurrent use: it belongs to one goroutine (in
// shardcron, the engine's dispatch loop), which calls every method. It starts
// no goroutines and reads no clock: time is passed in, in nanoseconds on any
// monotonic scale the caller chooses (shardcron uses Unix nanoseconds).
package timerwheel
