package registry

import (
	"sync"
	"time"
)

// triggerTimes hands out the times of a process's manual triggers: a
// task's next one is at least 1 ms after its last, so that two triggers
// in one millisecond are two fires rather than one key written twice.
// It remembers each task's last time for a second or two: a time handed
// out before is at most now then, unless a task took more than a thousand
// triggers a second from this process.
type triggerTimes struct {
	mu        sync.Mutex
	cur, prev map[string]int64 // unix ms by task id: this generation and the one before
	since     int64            // when cur began, unix ms
}

// bulkTriggers is the name triggerTimes gives the bulk actions' triggers:
// no task id holds a control character.
const bulkTriggers = "\x00bulk"

// triggerGeneration is how long a generation of triggerTimes lasts, in ms.
const triggerGeneration = 1000

// next returns the time of task id's next trigger at now, in unix ms.
func (tt *triggerTimes) next(id string, now time.Time) int64 {
	ms := now.UnixMilli()
	tt.mu.Lock()
	defer tt.mu.Unlock()
	if tt.cur == nil || ms-tt.since >= triggerGeneration {
		tt.prev, tt.cur, tt.since = tt.cur, map[string]int64{}, ms
	}
	last, ok := tt.cur[id]
	if !ok {
		last, ok = tt.prev[id]
	}
	if ok && ms <= last {
		ms = last + 1
	}
	tt.cur[id] = ms
	return ms
}
