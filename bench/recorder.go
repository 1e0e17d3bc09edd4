package bench

import (
	"fmt"
	"iter"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/ring"
)

// taskID names task i: 16 bytes, so that every scenario holds ids of the
// size the memory target is stated for.
func taskID(i int) string { return fmt.Sprintf("t%015d", i) }

// taskIndex is the inverse of taskID; -1 for an id the harness did not make.
func taskIndex(id string) int {
	if len(id) != 16 || id[0] != 't' {
		return -1
	}
	i, err := strconv.Atoi(id[1:])
	if err != nil {
		return -1
	}
	return i
}

// recorder receives every keyed fire, from any number of goroutines. It
// keeps one bit per keyed task and second (duplicates, misses), lag
// histograms by scheduled second, and per partition and node the first fire
// after the event and the last fire (hand-over).
type recorder struct {
	partitions int
	nodes      int
	base       int64           // unix second of bit 0 and of perSec[0]
	width      int             // seconds covered
	slot       []int32         // task index -> keyed slot, -1: not keyed
	bits       []atomic.Uint32 // slot*width + second
	keyed      int

	fires     atomic.Uint64
	dupPerSec []atomic.Uint32 // duplicates by scheduled second
	outside   atomic.Uint64   // fires scheduled outside the covered seconds
	perSec    []*lagHist      // by scheduled second
	perExec   []*lagHist      // by the second the fire ran in

	event    atomic.Int64   // unix ns of the event (join, kill), 0 before
	first    []atomic.Int64 // [p*nodes+n] unix ns of n's first fire of p after the event
	firstLag []atomic.Int64 // its lag
	last     []atomic.Int64 // [p*nodes+n] unix ns of n's latest fire of p
	dead     []atomic.Int64 // per node: unix ns it was killed at; its later fires never happened
	lastExec atomic.Int64   // unix ns of the latest fire
}

// newRecorder covers width seconds from base for the tasks whose slot is
// not -1 (slot nil: every task is keyed, its slot is its index).
func newRecorder(tasks, partitions, nodes int, base time.Time, width int, slot []int32) *recorder {
	keyed := tasks
	if slot != nil {
		keyed = 0
		for _, s := range slot {
			if s >= 0 {
				keyed++
			}
		}
	}
	r := &recorder{
		partitions: partitions, nodes: nodes,
		base: base.Unix(), width: width, slot: slot, keyed: keyed,
		bits:      make([]atomic.Uint32, (keyed*width+31)/32),
		perSec:    make([]*lagHist, width),
		dupPerSec: make([]atomic.Uint32, width),
		perExec:   make([]*lagHist, width),
		first:     make([]atomic.Int64, partitions*nodes),
		firstLag:  make([]atomic.Int64, partitions*nodes),
		last:      make([]atomic.Int64, partitions*nodes),
		dead:      make([]atomic.Int64, nodes),
	}
	for i := range r.perSec {
		r.perSec[i], r.perExec[i] = newLagHist(), newLagHist()
	}
	return r
}

// probeSlots returns the keyed slots for the noop executor: the first task
// of each partition below probed is keyed (a probe), the others are not.
func probeSlots(tasks, partitions, probed int) []int32 {
	slot := make([]int32, tasks)
	seen := make([]bool, partitions)
	var n int32
	for i := range slot {
		slot[i] = -1
		if p := ring.Partition(taskID(i), partitions); p < probed && !seen[p] {
			seen[p] = true
			slot[i] = n
			n++
		}
	}
	return slot
}

func (r *recorder) slotOf(i int) int {
	if i < 0 {
		return -1
	}
	if r.slot == nil {
		if i < r.keyed {
			return i
		}
		return -1
	}
	if i >= len(r.slot) {
		return -1
	}
	return int(r.slot[i])
}

// observe records a fire of task id scheduled at sched that node ran at
// now.
func (r *recorder) observe(node int, id string, sched, now time.Time) {
	t := now.UnixNano()
	if d := r.dead[node].Load(); d != 0 && t > d {
		return
	}
	r.fires.Add(1)
	lag := t - sched.UnixNano()
	if e := now.Unix() - r.base; e >= 0 && e < int64(r.width) {
		r.perExec[e].observe(lag)
	}
	sec := sched.Unix() - r.base
	if sec < 0 || sec >= int64(r.width) {
		r.outside.Add(1)
	} else {
		r.perSec[sec].observe(lag)
		i := taskIndex(id)
		if s := r.slotOf(i); s >= 0 {
			bit := s*r.width + int(sec)
			if r.bits[bit/32].Or(1<<(bit%32))&(1<<(bit%32)) != 0 {
				r.dupPerSec[sec].Add(1)
			}
		}
	}
	atomicMax(&r.lastExec, t)
	p := ring.Partition(id, r.partitions)
	k := p*r.nodes + node
	atomicMax(&r.last[k], t)
	if ev := r.event.Load(); ev != 0 && t > ev && r.first[k].CompareAndSwap(0, t) {
		r.firstLag[k].Store(lag)
	}
}

func atomicMax(a *atomic.Int64, v int64) {
	for {
		m := a.Load()
		if v <= m || a.CompareAndSwap(m, v) {
			return
		}
	}
}

// kill makes node's fires after now count as never run.
func (r *recorder) kill(node int, now time.Time) { r.dead[node].Store(now.UnixNano()) }

// markEvent starts the hand-over accounting, anew at each event: the
// first fires of an earlier event are forgotten.
func (r *recorder) markEvent(now time.Time) {
	// No first fire is taken while the old ones are cleared: with the
	// event at 0, observe takes none.
	r.event.Store(0)
	for i := range r.first {
		r.first[i].Store(0)
		r.firstLag[i].Store(0)
	}
	r.event.Store(now.UnixNano())
}

// dups counts the duplicates among the keyed fires scheduled in the
// seconds [from, to).
func (r *recorder) dups(from, to time.Time) uint64 {
	var n uint64
	for s := max(from.Unix()-r.base, 0); s < min(to.Unix()-r.base, int64(r.width)); s++ {
		n += uint64(r.dupPerSec[s].Load())
	}
	return n
}

// lag merges the histograms of the scheduled seconds [from, to).
func (r *recorder) lag(from, to time.Time) *lagHist {
	return merge(r.perSec, from.Unix()-r.base, to.Unix()-r.base)
}

// lagRan merges the histograms of the fires that ran in the seconds
// [from, to), whenever they were scheduled: a scheduler that falls behind
// shows its lag there, not as fires missing from their seconds.
func (r *recorder) lagRan(from, to time.Time) *lagHist {
	return merge(r.perExec, from.Unix()-r.base, to.Unix()-r.base)
}

func merge(hs []*lagHist, lo, hi int64) *lagHist {
	h := newLagHist()
	for s := max(lo, 0); s < min(hi, int64(len(hs))); s++ {
		h.add(hs[s])
	}
	return h
}

// missed counts the keyed fires the schedule gives the seconds [from, to)
// that never ran.
func (r *recorder) missed(spec string, tasks int, from, to time.Time) (uint64, error) {
	lo, hi := max(from.Unix()-r.base, 0), min(to.Unix()-r.base, int64(r.width))
	if lo >= hi {
		return 0, nil
	}
	perTask := strings.Contains(spec, "H")
	var shared schedule.Schedule
	var err error
	if !perTask {
		if shared, err = schedule.Parse(spec, "UTC", taskID(0)); err != nil {
			return 0, err
		}
	}
	var missed uint64
	for i, s := range r.keyedSlots(tasks) {
		sch := shared
		if perTask {
			if sch, err = schedule.Parse(spec, "UTC", taskID(i)); err != nil {
				return 0, err
			}
		}
		for t := sch.Next(time.Unix(r.base+lo, 0).Add(-time.Nanosecond)); !t.IsZero() && t.Unix()-r.base < hi; t = sch.Next(t) {
			if !r.ran(s, t.Unix()-r.base) {
				missed++
			}
		}
	}
	return missed, nil
}

// unfired counts the keyed tasks among tasks of which no fire scheduled in
// the seconds [from, to) ran: a trigger's fire is scheduled at the
// trigger's time, so a task triggered once in them and never fired.
func (r *recorder) unfired(tasks int, from, to time.Time) uint64 {
	lo, hi := max(from.Unix()-r.base, 0), min(to.Unix()-r.base, int64(r.width))
	var n uint64
	for _, s := range r.keyedSlots(tasks) {
		sec := lo
		for sec < hi && !r.ran(s, sec) {
			sec++
		}
		if sec >= hi {
			n++
		}
	}
	return n
}

// keyedSlots yields the index and keyed slot of each keyed task among
// tasks [0, tasks).
func (r *recorder) keyedSlots(tasks int) iter.Seq2[int, int] {
	return func(yield func(i, slot int) bool) {
		for i := range tasks {
			if s := r.slotOf(i); s >= 0 && !yield(i, s) {
				return
			}
		}
	}
}

// ran reports whether a fire of keyed slot s scheduled in second sec of
// the covered ones ran.
func (r *recorder) ran(s int, sec int64) bool {
	bit := s*r.width + int(sec)
	return r.bits[bit/32].Load()&(1<<(bit%32)) != 0
}

// expected counts the fires the schedule gives tasks tasks in the seconds
// [from, to).
func expected(spec string, tasks int, from, to time.Time) (uint64, error) {
	perTask := strings.Contains(spec, "H")
	var n uint64
	for i := range tasks {
		if !perTask && i > 0 {
			return n * uint64(tasks), nil
		}
		sch, err := schedule.Parse(spec, "UTC", taskID(i))
		if err != nil {
			return 0, err
		}
		for t := sch.Next(from.Add(-time.Nanosecond)); !t.IsZero() && t.Before(to); t = sch.Next(t) {
			n++
		}
	}
	return n, nil
}

// handoff is the hand-over of the partitions that moved from one owner to
// another at the event: per partition, the lag of its first fire on the new
// owner, and the gap from its last fire on the old owner.
func (r *recorder) handoff(moves map[int][2]int) (lags, gaps []float64) {
	for p, m := range moves {
		from, to := p*r.nodes+m[0], p*r.nodes+m[1]
		f := r.first[to].Load()
		if f == 0 {
			continue // no keyed fire of p on its new owner: counted as missed
		}
		lags = append(lags, ms(r.firstLag[to].Load()))
		if l := r.last[from].Load(); l != 0 {
			gaps = append(gaps, ms(f-l))
		}
	}
	return lags, gaps
}

// firstAfterEvent is the earliest first fire after the event on any node
// and partition, unix ns; 0 when none yet.
func (r *recorder) firstAfterEvent() int64 {
	var first int64
	for i := range r.first {
		if f := r.first[i].Load(); f != 0 && (first == 0 || f < first) {
			first = f
		}
	}
	return first
}
