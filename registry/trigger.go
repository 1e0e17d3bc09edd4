package registry

import (
	"sync"
	"time"
)

// triggerTimes hands out the times of a process's manual triggers, a
// fire's idempotency key: a task's next one is at least 1 ms after its
// last, so that two triggers in one millisecond are two fires rather than
// one key written twice. The triggers of a bulk action's batch (up to
// MaxTxnOps tasks) share one time, after every time handed out before
// it, and a task's next trigger comes after the last such batch's, which
// may have triggered it.
//
// No time it hands out is a whole second: scheduled fires (cron, @every,
// @at) fall on whole seconds, and a trigger on one would take the key of
// the task's own fire of that second (and of the chains a fire of that
// second triggers): two fires that receivers, and a hand-over's list of
// retries, would take for one.
//
// It remembers each task's last time for a second or two: a time handed
// out before is at most now then, unless a task took more than a thousand
// triggers a second from this process.
type triggerTimes struct {
	mu        sync.Mutex       // guards the fields below
	cur, prev map[string]int64 // unix ms by task id: this generation and the one before
	since     int64            // when cur began, unix ms
	bulk      int64            // the last bulk action's time, unix ms
	last      int64            // the latest time handed out, unix ms
}

// triggerGeneration is how long a generation of triggerTimes lasts, in ms.
const triggerGeneration = 1000

// next returns the time of task id's next trigger at now, in unix ms.
func (tt *triggerTimes) next(id string, now time.Time) int64 {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	ms := max(now.UnixMilli(), tt.bulk+1)
	tt.rotate(ms)
	last, ok := tt.cur[id]
	if !ok {
		last, ok = tt.prev[id]
	}
	if ok {
		ms = max(ms, last+1)
	}
	ms = offSecond(ms)
	tt.cur[id] = ms
	tt.last = max(tt.last, ms)
	return ms
}

// nextBulk returns the time of a bulk action batch's triggers at now, in
// unix ms: after every trigger time this process handed out before.
func (tt *triggerTimes) nextBulk(now time.Time) int64 {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	tt.bulk = offSecond(max(now.UnixMilli(), tt.last+1))
	tt.last = tt.bulk
	return tt.bulk
}

// rotate starts a new generation when the current one is a generation old
// at ms.
func (tt *triggerTimes) rotate(ms int64) {
	if tt.cur == nil || ms-tt.since >= triggerGeneration {
		tt.prev, tt.cur, tt.since = tt.cur, map[string]int64{}, ms
	}
}

// offSecond returns ms, or the millisecond after it when ms is a whole
// second, a scheduled fire's time.
func offSecond(ms int64) int64 {
	if ms%1000 == 0 {
		return ms + 1
	}
	return ms
}
