package engine

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/task"
)

// A profile is everything about a task that a fire needs except its id
// and schedule: the executor and the policies. Tasks with equal profiles
// share one, so a million tasks calling the same endpoint hold one executor
// between them and their records stay pointer-free.
//
// A profile is immutable once built; a worker may hold one after the last
// task using it is gone.
type profile struct {
	key         string // the intern key: the profile's fields as JSON
	refs        int    // records using it; owned by the dispatch loop
	exec        executor.Executor
	noop        bool // exec is executor.Noop: workers take such fires in chunks
	timeout     time.Duration
	maxAttempts int
	backoff     time.Duration
	maxBackoff  time.Duration
	misfire     task.MisfirePolicy
	catchup     time.Duration
	concurrency task.ConcurrencyPolicy
	jitter      time.Duration
	keep        [2]int // history limits of successes and failures; -1: the store's default

	// Alerts and capture (issue 9).
	notify     *notifyTarget // nil: no alerts
	pauseAfter uint32        // pause_on_failure; 0: never
	capture    int           // capture.max_bytes; 0: no capture
	captureAll bool          // capture.on always, not only failures

	// Chains (issue 12; chain.go).
	onSuccess []string // tasks to trigger when a fire succeeds
	onFailure []string // tasks to trigger when a fire fails after its last attempt

	// The window and deletion (window.go).
	win         *window   // nil: the task's fires are not bounded
	deleteAfter bool      // delete_after_fire
	updatedAt   time.Time // of the definition, with deleteAfter: an edit since keeps the task
	defLen      int       // key[:defLen] is the task as written (appendProfileKey), without its window's bounds and times (sameDefinition)
}

// sameDefinition reports whether p and q are profiles of one definition
// but for when it was written: a write that only pauses a
// delete_after_fire task changes its updated_at, and so its profile. The
// window's bounds and the schedule, beside the profile, are the caller's to
// compare; the labels, which a node does not read, are not compared at
// all.
func (p *profile) sameDefinition(q *profile) bool { return p.key[:p.defLen] == q.key[:q.defLen] }

// sameTask reports whether two definitions of a task, each its schedule
// and its profile, are one but for when they were written and whether
// the task is paused: a write between them that changed neither only
// paused or resumed it, not an edit (delete_after_fire).
func sameTask(s schedule.Handle, p *profile, t schedule.Handle, q *profile) bool {
	return s == t && p.win.same(q.win) && p.sameDefinition(q)
}

// keepFor returns the history limit of a record of status st, for
// store.RecordKeep.
func (p *profile) keepFor(st uint8) int {
	if st == statusOK {
		return p.keep[0]
	}
	return p.keep[1]
}

// historyKeep turns a task's history limits into profile.keep.
func historyKeep(l *task.HistoryLimit) [2]int {
	keep := [2]int{-1, -1}
	if l != nil {
		for i, v := range []*int{l.Successes, l.Failures} {
			if v != nil {
				keep[i] = *v
			}
		}
	}
	return keep
}

// appendProfileKey appends the intern key of a task's profile to b: its
// executor and policies, length-prefixed so that no two profiles share a
// key. Built by hand into a reused buffer: loading a partition computes
// one per task.
func appendProfileKey(b []byte, t *task.Task) []byte {
	str := func(s string) {
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	strMap := func(m map[string]string) {
		b = strconv.AppendInt(b, int64(len(m)), 10)
		var small [8]string // most maps have a few keys: sorted with no allocation
		keys := small[:0]
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			str(k)
			str(m[k])
		}
	}
	x := &t.Executor
	str(string(x.Type))
	str(x.URL)
	str(x.Method)
	strMap(x.Headers)
	str(x.Body)
	b = strconv.AppendInt(b, int64(len(x.Command)), 10)
	for _, a := range x.Command {
		str(a)
	}
	strMap(x.Env)
	str(x.Name)
	str(string(x.Payload))
	for _, d := range []task.Duration{t.Timeout, t.Retry.Backoff, t.Retry.MaxBackoff, t.CatchupWindow, t.Jitter} {
		b = strconv.AppendInt(append(b, ','), int64(d), 10)
	}
	b = strconv.AppendInt(append(b, ','), int64(t.Retry.MaxAttempts), 10)
	str(string(t.Misfire))
	str(string(t.Concurrency))
	for _, k := range historyKeep(t.HistoryLimit) {
		b = strconv.AppendInt(append(b, ','), int64(k), 10)
	}
	// Alerts and capture (issue 9): a task without them adds a few bytes.
	if n := t.Notify; n != nil {
		b = append(b, 'n')
		b = strconv.AppendInt(b, int64(n.EventMask()), 10)
		str(n.URL)
		strMap(n.Headers)
	}
	b = strconv.AppendInt(append(b, ','), int64(t.PauseOnFailure), 10)
	if c := t.Capture; c != nil {
		b = strconv.AppendInt(append(b, 'c'), int64(c.MaxBytes), 10)
		str(string(c.On))
	}
	// Chains (issue 12).
	for _, ids := range [][]string{t.OnSuccess, t.OnFailure} {
		b = strconv.AppendInt(append(b, ';'), int64(len(ids)), 10)
		for _, id := range ids {
			str(id)
		}
	}
	// The window as written; def adds what it computes from it (appendWindowKey).
	for _, at := range []time.Time{t.NotBefore, t.NotAfter} {
		b = strconv.AppendInt(append(b, ','), at.UnixNano(), 10)
	}
	b = strconv.AppendInt(append(b, ','), int64(t.MaxFires), 10)
	b = strconv.AppendBool(append(b, ','), t.DeleteAfterFire)
	return b
}

// executors builds the executors of profiles: it holds what they share.
type executors struct {
	shared    executor.Shared
	durations *durations // observes every execution but noop ones; nil: none
	notifyURL string     // Config.NotifyURL
}

// newProfile builds the profile of a validated task.
func (x *executors) newProfile(key string, t *task.Task) (*profile, error) {
	p := &profile{
		key:         key,
		timeout:     time.Duration(t.Timeout),
		maxAttempts: t.Retry.MaxAttempts,
		backoff:     time.Duration(t.Retry.Backoff),
		maxBackoff:  time.Duration(t.Retry.MaxBackoff),
		misfire:     t.Misfire,
		catchup:     time.Duration(t.CatchupWindow),
		concurrency: t.Concurrency,
		jitter:      time.Duration(t.Jitter),
		keep:        historyKeep(t.HistoryLimit),
		pauseAfter:  uint32(max(t.PauseOnFailure, 0)),
		onSuccess:   t.OnSuccess,
		onFailure:   t.OnFailure,
		deleteAfter: t.DeleteAfterFire,
	}
	if t.DeleteAfterFire {
		p.updatedAt = t.UpdatedAt
	}
	if c := t.Capture; c != nil {
		p.capture, p.captureAll = c.MaxBytes, c.On == task.CaptureAlways
	}
	var err error
	if p.notify, err = newNotifyTarget(t.Notify, x.notifyURL); err != nil {
		return nil, err
	}
	// A copy: Build calls through the kinds table, which escape analysis
	// cannot see through, and t must not escape: loading decodes every
	// task into one on the stack.
	ex := t.Executor
	p.exec, err = ex.Build(&x.shared)
	if errors.Is(err, executor.ErrNotAllowed) {
		// The node's allow-list, not the task, is at fault: every fire
		// fails with the reason, which history and state show.
		p.exec, err = refuse{err}, nil
	}
	if err != nil {
		return nil, err
	}
	p.noop = p.exec == executor.Noop
	if !p.noop && x.durations != nil {
		p.exec = timed{p.exec, x.durations}
	}
	return p, nil
}

// refuse is the executor of a task this node cannot run: every fire fails
// with its error, which history and state then show.
type refuse struct{ err error }

func (r refuse) Execute(context.Context, *executor.Fire) error { return r.err }

// profileTable interns profiles by key. It belongs to the dispatch loop.
type profileTable struct {
	list  []*profile
	byKey map[string]uint32
	free  []uint32
}

func newProfileTable() *profileTable {
	return &profileTable{byKey: make(map[string]uint32)}
}

// ref returns the index of the profile with p's key, adding p if there is
// none, and counts one more user.
func (t *profileTable) ref(p *profile) uint32 {
	i, ok := t.byKey[p.key]
	if !ok {
		if n := len(t.free); n > 0 {
			i = t.free[n-1]
			t.free = t.free[:n-1]
			t.list[i] = p
		} else {
			i = uint32(len(t.list))
			t.list = append(t.list, p)
		}
		t.byKey[p.key] = i
	}
	t.list[i].refs++
	return i
}

// unref counts one user less, dropping the profile with the last one.
func (t *profileTable) unref(i uint32) {
	p := t.list[i]
	if p.refs--; p.refs == 0 {
		delete(t.byKey, p.key)
		t.list[i] = nil
		t.free = append(t.free, i)
	}
}
