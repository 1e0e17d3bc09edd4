package engine

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/task"
)

// A staged segment is queued ahead of the jobs pushed after it, counts
// against the queue's room, and is taken, dropped and reset as queued jobs
// are; once taken, its slice comes back emptied for the next stage.
func TestPool_StagedSegmentIsQueuedFirst(t *testing.T) {
	cfg := DefaultConfig("n").withDefaults()
	cfg.Workers, cfg.Queue = 1, 32
	var hold atomic.Bool
	hold.Store(true) // the worker takes nothing until the queue is set up
	p := newPool(cfg, nil, &stats{}, hold.Load, 0)
	t.Cleanup(func() { close(p.quit); p.drain(time.Second) })
	prof := &profile{key: "noop", exec: executor.Noop, noop: true, timeout: time.Minute, maxAttempts: 1,
		misfire: task.MisfireFireOnce, catchup: time.Minute, concurrency: task.ConcurrencyAllow}
	jobs := func(from, to uint32) []job {
		var js []job
		for i := from; i < to; i++ {
			js = append(js, job{id: "t", prof: prof, sched: int64(i), rec: i, attempt: 1})
		}
		return js
	}
	seg := jobs(0, 10)
	if !p.pushStaged(seg) {
		t.Fatal("an empty queue refused a staged segment")
	}
	if k := p.push(jobs(10, 15)); k != 5 {
		t.Fatalf("pushed %d jobs behind the segment, want 5", k)
	}
	if p.pushStaged(jobs(20, 22)) {
		t.Fatal("a second segment was queued while jobs wait")
	}
	if d, f := p.depth(), p.free(); d != 15 || f != 17 {
		t.Fatalf("depth %d and room %d, want 15 and 17", d, f)
	}
	p.dropQueued(func(j *job) bool { return j.rec == 3 || j.rec == 12 })

	p.mu.Lock()
	hold.Store(false)
	p.ready.Broadcast()
	p.mu.Unlock()
	var order []uint32
	for len(order) < 13 {
		select {
		case b := <-p.done:
			for _, c := range b.c[:b.n] {
				order = append(order, c.rec)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the worker ran %v, then nothing", order)
		}
	}
	want := []uint32{0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14}
	if !slices.Equal(order, want) {
		t.Fatalf("ran %v, want %v: the segment first, in order, without the dropped jobs", order, want)
	}
	if s := p.spareSlice(); cap(s) != cap(seg) || len(s) != 0 || slices.ContainsFunc(s[:cap(s)], func(j job) bool { return j.prof != nil }) {
		t.Errorf("the taken segment came back with length %d, capacity %d (want 0, %d), or not emptied", len(s), cap(s), cap(seg))
	}

	hold.Store(true)
	p.push(jobs(20, 21))
	if p.pushStaged(jobs(21, 23)) {
		t.Fatal("a segment was queued ahead of a job pushed before it")
	}
	p.reset()
	if !p.pushStaged(jobs(30, 40)) {
		t.Fatal("an empty queue refused a staged segment")
	}
	p.reset()
	if d := p.depth(); d != 0 || p.seg != nil {
		t.Errorf("after a reset %d jobs wait (segment %v)", d, p.seg != nil)
	}
}
