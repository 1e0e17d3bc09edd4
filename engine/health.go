package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// Task health: what the owner keeps of each task's outcomes (the last
// success, the last failure and its error, the failures in a row), the
// status filters of a list (failing, paused, stale), and the node's recent
// failures. A healthy task costs 8 bytes of its record (okAt and
// failStreak); a task that has failed since its owner took it costs an
// entry of loop.health as well.

// maxErrorLen bounds the last error kept per task: a failing fleet must
// not hold megabytes of response bodies.
const maxErrorLen = 512

// taskHealth is what a record has no room for: kept only for tasks that
// failed since their owner took them.
type taskHealth struct {
	failAt int64  // scheduled time of the last fire that failed after its last attempt, unix ns
	err    string // its error, at most maxErrorLen bytes
	// okAt is the last success, unix s, when the record's okAt no longer
	// holds it because the staleness clock restarted; 0 for none.
	okAt uint32
}

// unixSecs is t (unix ns) in unix seconds, as a record holds it.
func unixSecs(t int64) uint32 { return uint32(max(t, 0) / int64(time.Second)) }

// restartClock starts the staleness clock of record i at now (unix ns),
// keeping its last success aside. Called only from the dispatch loop, when
// a task is taken, resumed or rescheduled.
func (l *loop) restartClock(i uint32, r *record, now int64) {
	if r.flags&flagOK != 0 {
		h := l.health[i]
		h.okAt = r.okAt
		l.health[i] = h
	}
	r.flags &^= flagOK
	r.okAt = unixSecs(now)
}

// outcome records how a fire of record i ended after its last attempt:
// status ok, failed or timeout (others change nothing), with the error of
// a failure. It returns the change of state the fire made, for alerts:
// failure when it broke a run of successes (or was the first to end),
// recovery when it ended a run of failures, "" otherwise, so that a task
// failing on every fire alerts once. Called only from the dispatch loop.
//
// A task's state follows its fires in schedule order, not in the order
// they end: a fire that ends after a later one (concurrency allow) moves
// the last success or failure it is newer than, and a failure after the
// last success counts in the run of failures, but neither sends an
// alert, which the later fire decided. (A success that ends after a later
// failure leaves the run as it is: the failures before it are not told
// apart from those after.) The order is kept to the second, as the last
// success is: fires of one second count in the order they end.
func (l *loop) outcome(i uint32, r *record, sched int64, status uint8, why string) task.NotifyEvent {
	okAt := l.lastSuccess(i, r)
	h, hasHealth := l.health[i]
	overtaken := unixSecs(sched) < max(okAt, unixSecs(h.failAt))
	switch status {
	case statusOK:
		if overtaken && unixSecs(sched) <= okAt {
			return ""
		}
		r.okAt, r.flags = unixSecs(sched), r.flags|flagOK
		if hasHealth && h.okAt != 0 {
			h.okAt = 0
			l.health[i] = h
		}
		if overtaken || r.failStreak == 0 {
			return ""
		}
		r.failStreak = 0
		return task.NotifyRecovery
	case statusFailed, statusTimeout:
		if sched >= h.failAt {
			h.failAt, h.err = sched, truncateError(why)
			l.health[i] = h
		}
		if sched < int64(okAt)*int64(time.Second) {
			return "" // before the last success: not of the run of failures since
		}
		if r.failStreak < ^uint32(0) {
			r.failStreak++
		}
		if r.failStreak == 1 && !overtaken {
			return task.NotifyFailure
		}
	}
	return ""
}

// lastSuccess is record i's last success, unix s; 0 for none.
func (l *loop) lastSuccess(i uint32, r *record) uint32 {
	if r.flags&flagOK != 0 {
		return r.okAt
	}
	return l.health[i].okAt
}

// lateness records whether a fire of record r was released late (a
// misfire) and reports whether that is a change of state: the first late
// fire after timely ones, for misfire alerts. Called only from the
// dispatch loop, on the fire path: a timely fire costs one flag test.
func lateness(r *record, late bool) (changed bool) {
	if late == (r.flags&flagLate != 0) {
		return false
	}
	r.flags ^= flagLate
	return late
}

// truncateError cuts an error to maxErrorLen bytes, on a rune boundary,
// the "…" that says so included: the documented bound is the whole field's.
func truncateError(s string) string {
	if len(s) <= maxErrorLen {
		return strings.Clone(s)
	}
	cut := maxErrorLen - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// stale reports whether record r is stale at now (unix ns): see
// task.StatusStale. Called only from the dispatch loop.
func (l *loop) stale(r *record, now int64) bool {
	if r.flags&flagPaused != 0 || r.okAt == 0 {
		return false
	}
	ref := int64(r.okAt) * int64(time.Second)
	// No fire dispatched since ref and the next one not due: nothing can
	// have failed to succeed, and no Next is computed. This is the case of
	// almost every healthy task, so a scan of a fleet stays cheap.
	if r.lastFire <= ref && r.next > now {
		return false
	}
	f1 := l.nextOf(r, ref)
	if f1 == 0 {
		return false
	}
	f2 := l.nextOf(r, f1)
	return f2 != 0 && f2 < now
}

// stateOf is the state of record i at now (unix ns). Called only from the
// dispatch loop.
func (l *loop) stateOf(i uint32, r *record, now int64) *task.State {
	s := &task.State{
		Owner:               l.cfg.NodeID,
		LastStatus:          statusNames[r.status],
		Fires:               uint64(r.fires),
		Failures:            uint64(r.failures),
		Misfires:            uint64(r.misfires),
		Skipped:             uint64(r.skipped),
		ConsecutiveFailures: uint64(r.failStreak),
		Stale:               l.stale(r, now),
		Ended:               l.endedOf(r),
	}
	if r.next != 0 && r.flags&flagPaused == 0 {
		s.NextFireAt = time.Unix(0, r.next).UTC()
	}
	if r.lastFire != 0 {
		s.LastFireAt = time.Unix(0, r.lastFire).UTC()
	}
	h, hasHealth := l.health[i]
	switch {
	case r.flags&flagOK != 0:
		s.LastSuccessAt = time.Unix(int64(r.okAt), 0).UTC()
	case hasHealth && h.okAt != 0:
		s.LastSuccessAt = time.Unix(int64(h.okAt), 0).UTC()
	}
	if hasHealth && h.failAt != 0 {
		s.LastFailureAt = time.Unix(0, h.failAt).UTC()
		s.LastError = h.err
	}
	return s
}

// has reports whether record r has status st at now. Called only from the
// dispatch loop.
func (l *loop) has(r *record, st task.Status, now int64) bool {
	switch st {
	case task.StatusFailing:
		return r.failStreak > 0
	case task.StatusPaused:
		return r.flags&flagPaused != 0
	case task.StatusStale:
		return l.stale(r, now)
	}
	return false
}

// queryChunk is how many records one queryCmd looks at: the dispatch loop
// serves fires between chunks, so that a scan of a million tasks delays
// them by a chunk's time, not the scan's.
const queryChunk = 1 << 15

// queryCmd scans records [from, from+queryChunk) for a task.StatusQuery.
type queryCmd struct {
	q     task.StatusQuery
	from  uint32
	reply chan queryAnswer
}

// queryAnswer is the matches of one chunk, the Limit+1 smallest ids at most
// (one more tells whether more follow),
// in id order; next is the record to go on from, or nilRec at the end.
// The first chunk and the last also carry each partition's load
// (partState.loaded), as they began and ended.
type queryAnswer struct {
	matches []task.Match
	next    uint32
	loaded  []uint64
}

func (c *queryCmd) run(l *loop) { c.reply <- l.query(c) }

// query scans one chunk of records. Called only from the dispatch loop.
func (l *loop) query(c *queryCmd) queryAnswer {
	now := l.cfg.Clock.Now().UnixNano()
	total := uint32(len(l.tab.pages) * recPageSize)
	end := min(total, c.from+queryChunk)
	var a queryAnswer
	if c.from == 0 {
		a.loaded = l.loadedParts()
	}
	var out []task.Match
	for i := c.from; i < end; i++ {
		r := l.tab.rec(i)
		if r.flags&flagLive == 0 || !l.has(r, c.q.Status, now) {
			continue
		}
		id := l.tab.id(r)
		if !strings.HasPrefix(id, c.q.Prefix) || id <= c.q.After {
			continue
		}
		out = append(out, task.Match{ID: id, State: l.stateOf(i, r, now)})
		if len(out) >= 4*(c.q.Limit+1) {
			out = smallest(out, c.q.Limit+1)
		}
	}
	a.matches, a.next = smallest(out, c.q.Limit+1), end
	if end >= total {
		a.next = nilRec
		a.loaded = l.loadedParts()
	}
	return a
}

// loadedParts returns each partition's partState.loaded.
func (l *loop) loadedParts() []uint64 {
	out := make([]uint64, len(l.parts))
	for p := range l.parts {
		out[p] = l.parts[p].loaded
	}
	return out
}

// smallest keeps the n matches of smallest id, in id order.
func smallest(ms []task.Match, n int) []task.Match {
	slices.SortFunc(ms, func(a, b task.Match) int { return strings.Compare(a.ID, b.ID) })
	if len(ms) > n {
		clear(ms[n:])
		ms = ms[:n]
	}
	return ms
}

// Query returns, in id order, the first q.Limit tasks this node owns that
// have status q.Status and an id within q.Prefix after q.After, with their
// states, and whether more follow. The dispatch loop scans its records in
// chunks and serves fires between them, so the answer is not one instant's:
// a task that changes status during the scan may be missed or included.
//
// held are the partitions the answer covers: every task of them was armed
// here from the scan's start to its end, under one load. A partition
// owned but still loading is not among them, nor one released or taken
// again during the scan.
func (e *Engine) Query(ctx context.Context, q task.StatusQuery) (matches []task.Match, more bool, held []int, err error) {
	if _, err := task.ParseStatus(string(q.Status)); err != nil {
		return nil, false, nil, err
	}
	if q.Limit < 1 || q.Limit > registry.MaxListLimit+1 {
		return nil, false, nil, &task.ValidationError{Field: "limit", Reason: fmt.Sprintf("want 1 to %d, got %d", registry.MaxListLimit+1, q.Limit)}
	}
	var all []task.Match
	var began []uint64
	for from := uint32(0); ; {
		c := &queryCmd{q: q, from: from, reply: make(chan queryAnswer, 1)}
		a, err := request(ctx, e, c, c.reply)
		if err != nil {
			return nil, false, nil, fmt.Errorf("query %s tasks: %w", q.Status, err)
		}
		all = smallest(append(all, a.matches...), q.Limit+1)
		if from == 0 {
			began = a.loaded
		}
		if from = a.next; from == nilRec {
			held = []int{}
			for p, load := range a.loaded {
				if load != 0 && load == began[p] {
					held = append(held, p)
				}
			}
			break
		}
	}
	if len(all) > q.Limit {
		return all[:q.Limit], true, held, nil
	}
	return all, false, held, nil
}

// failureLogSize is how many failures a node remembers for
// GET /v1/failures.
const failureLogSize = 1000

// failureLog is a ring of the node's latest failed attempts, in memory:
// written by workers on failures only, so a healthy fleet never touches it.
type failureLog struct {
	mu   sync.Mutex // guards ring and n
	ring [failureLogSize]task.Execution
	n    uint64 // failures ever added; the newest is at (n-1) % size
}

func (f *failureLog) add(e task.Execution) {
	e.Error = truncateError(e.Error)
	f.mu.Lock()
	f.ring[f.n%failureLogSize] = e
	f.n++
	f.mu.Unlock()
}

// latest returns at most limit failures, newest added first.
func (f *failureLog) latest(limit int) []task.Execution {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := min(uint64(max(limit, 0)), f.n, failureLogSize)
	out := make([]task.Execution, 0, k)
	for j := uint64(1); j <= k; j++ {
		out = append(out, f.ring[(f.n-j)%failureLogSize])
	}
	return out
}

// RecentFailures returns this node's latest failed or timed-out attempts,
// newest first: at most limit, and at most the last 1000 since the node
// started (kept in memory, whatever --history says).
func (e *Engine) RecentFailures(limit int) []task.Execution {
	if e.pool == nil {
		return []task.Execution{} // not started
	}
	return e.pool.failures.latest(limit)
}

// statesCmd asks for the states of tasks.
type statesCmd struct {
	ids   []string
	reply chan []*task.State
}

func (c *statesCmd) run(l *loop) {
	now := l.cfg.Clock.Now().UnixNano()
	out := make([]*task.State, len(c.ids))
	for k, id := range c.ids {
		if i, r, ok := l.tab.lookup(id); ok {
			out[k] = l.stateOf(i, r, now)
		}
	}
	c.reply <- out
}

// maxStates bounds the ids of one TaskStates call, so that the dispatch
// loop answers it in well under a millisecond.
const maxStates = 1000

// TaskStates returns the states of the tasks of ids that this node holds,
// in the order of ids, nil for the others; a list of ids costs one request
// to the dispatch loop per thousand.
func (e *Engine) TaskStates(ctx context.Context, ids []string) ([]*task.State, error) {
	out := make([]*task.State, 0, len(ids))
	for len(ids) > 0 {
		part := ids[:min(len(ids), maxStates)]
		ids = ids[len(part):]
		c := &statesCmd{ids: part, reply: make(chan []*task.State, 1)}
		got, err := request(ctx, e, c, c.reply)
		if err != nil {
			return nil, fmt.Errorf("task states: %w", err)
		}
		out = append(out, got...)
	}
	return out, nil
}

// handedHealth is the health of a task that failed, as a released
// checkpoint hands it to the partition's next owner: a graceful hand-over
// keeps a failing task failing. A crash loses it (the next owner starts
// afresh), as it loses the counters.
type handedHealth struct {
	ID       string    `json:"id"`
	Fails    uint32    `json:"fails,omitempty"`
	FailedAt time.Time `json:"failed_at,omitzero"`
	Error    string    `json:"error,omitempty"`
	OKAt     time.Time `json:"ok_at,omitzero"`
}

// Bounds of the health a checkpoint hands over, which keep a checkpoint
// within etcd's request size: the failing tasks first, then the others
// that failed once.
const (
	maxHandOverHealth = 500
	handOverErrorLen  = 256
)

// handHealth returns the health to hand over with partition p: its tasks
// that failed since this node took them. Called only from the dispatch
// loop, before the partition's records are removed.
func (l *loop) handHealth(p int) []handedHealth {
	var failing, recovered []handedHealth
	l.tab.eachIn(p, func(i uint32, r *record) {
		h, ok := l.health[i]
		if !ok && r.failStreak == 0 {
			return
		}
		e := handedHealth{ID: l.tab.id(r), Fails: r.failStreak, Error: h.err}
		if len(e.Error) > handOverErrorLen {
			e.Error = e.Error[:handOverErrorLen]
			for len(e.Error) > 0 && !utf8.ValidString(e.Error) {
				e.Error = e.Error[:len(e.Error)-1]
			}
		}
		if h.failAt != 0 {
			e.FailedAt = time.Unix(0, h.failAt).UTC()
		}
		switch {
		case r.flags&flagOK != 0:
			e.OKAt = time.Unix(int64(r.okAt), 0).UTC()
		case h.okAt != 0:
			e.OKAt = time.Unix(int64(h.okAt), 0).UTC()
		}
		if r.failStreak > 0 {
			failing = append(failing, e)
		} else {
			recovered = append(recovered, e)
		}
	})
	out := append(failing, recovered...)
	return out[:min(len(out), maxHandOverHealth)]
}

// adoptHealth gives task i, just loaded, the health its previous owner
// handed over, unless it has a fire's outcome here already. The load that
// arms the task does it, so that no fire comes between: one would start a
// streak of its own and alert again.
func (l *loop) adoptHealth(i uint32, r *record, e handedHealth) {
	if r.failStreak != 0 || r.flags&flagOK != 0 {
		return
	}
	r.failStreak = e.Fails
	h := l.health[i]
	if !e.FailedAt.IsZero() {
		h.failAt, h.err = e.FailedAt.UnixNano(), strings.Clone(e.Error)
	}
	if !e.OKAt.IsZero() {
		h.okAt = unixSecs(e.OKAt.UnixNano())
	}
	l.health[i] = h
}
