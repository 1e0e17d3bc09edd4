package engine

import (
	"context"
	"time"

	"github.com/shardcron/shardcron/registry"
)

// The engine's internal timings, in one place. Config holds the ones an
// operator tunes (lease, tick, lead, watermark interval, drain); these are
// the protocol's own.
const (
	// handOverWait bounds how long a release waits for workers to take the
	// partition's queued fires before it hands them over unrun.
	handOverWait = 2 * time.Second
	// prepareWait bounds how long a node keeps firing a partition it lost,
	// waiting for the new owner to prepare it (make-before-break).
	prepareWait = 30 * time.Second
	// prepareWindow is how many partitions prepared here and not yet
	// acquired a node publishes at once, at least, those published longer
	// than prepareHold ago aside (serving.admit): the partitions one
	// release transaction hands over (releaseChunks).
	prepareWindow = registry.MaxTxnOps / 2
	// prepareHold is how long a partition published as prepared holds its
	// place in the window while its acquire waits for the lock.
	prepareHold = time.Second
	// preparedFlush is how often a node publishes the partitions it
	// prepared, at most: one write covers every partition prepared in
	// between.
	preparedFlush = 50 * time.Millisecond
	// triggerWait is how long a trigger waits for its task to be loaded,
	// and how long a fired trigger is remembered.
	triggerWait = 10 * time.Second
	// revisionFresh is how long a read of etcd's revision serves the
	// partitions prepared from the cache after it (revisions.notAhead).
	revisionFresh = time.Second
	// progressEvery is how often an acquire waiting for its catch-up
	// watch asks etcd for the watch's progress (catchup.go).
	progressEvery = 25 * time.Millisecond
	// catchUpWait bounds that wait; past it, the acquire reads the
	// partition's changes instead.
	catchUpWait = 10 * time.Second
	// etcdTimeout bounds one etcd request made outside a caller's context
	// (unlocks, restores, watermark deletes, release transactions).
	etcdTimeout = 5 * time.Second
	// historyLimitsWait bounds a history answer's read of its task's
	// limits (Engine.History).
	historyLimitsWait = time.Second
	// retryMin and retryMax bound the backoff of everything that retries
	// etcd until it answers: rejoins, watches, trigger deletes, naming a
	// session in a checkpoint.
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
)

// backoff is a wait that doubles after each failure, from retryMin to
// retryMax, and starts over after a success (reset).
type backoff struct{ d time.Duration }

// wait sleeps the current wait, or until ctx ends (false), and doubles it.
func (b *backoff) wait(ctx context.Context) bool {
	if b.d == 0 {
		b.d = retryMin
	}
	d := b.d
	b.d = min(2*b.d, retryMax)
	return sleepCtx(ctx, d)
}

// next is the wait the next call to wait sleeps.
func (b *backoff) next() time.Duration { return max(b.d, retryMin) }

func (b *backoff) reset() { b.d = 0 }

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
