package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"
)

// baseline is a scheduler the harness compares shardcron with, running in
// this process; fires are recorded as node 0 (or the baseline's node).
type baseline struct {
	*meter
	fires atomic.Uint64 // for the meter's counters
}

func newBaseline(cfg Config, spec string, nodes int) *baseline {
	b := &baseline{}
	b.meter = &meter{cfg: cfg, spec: spec, samples: map[int64]counters{}}
	b.count = func() counters { return counters{fires: b.fires.Load()} }
	width := int(cfg.Duration/time.Second) + 240 + cfg.Tasks/20_000
	b.rec = newRecorder(cfg.Tasks, 1, nodes, time.Now().Truncate(time.Second), width, nil)
	return b
}

func (b *baseline) observe(node int, id string, sched time.Time) {
	b.rec.observe(node, id, sched, time.Now())
	b.fires.Add(1)
}

// measure runs the window and fills the baseline's result, with the heap
// the scheduler holds per task (heap0: the live heap before it was built).
func (b *baseline) measure(ctx context.Context, scenario string, nodes int, heap0 uint64) (*Result, error) {
	b.startSampling()
	defer b.stopSampling()
	w, err := b.openWindow(ctx)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(b.cfg.Progress, "bench: measuring %v\n", b.cfg.Duration)
	if err := b.closeWindow(ctx, w, w.from.Add(b.cfg.Duration)); err != nil {
		return nil, err
	}
	r, err := b.result(scenario, nodes, w)
	if err != nil {
		return nil, err
	}
	if heap0 > 0 {
		r.BytesPerTask = heapGrowth(heap0, liveHeap(), b.cfg.Tasks)
	}
	return r, nil
}

// heapGrowth is how much the live heap grew from heap0 to heap1, per
// task. A heap that shrank (an earlier scenario's garbage collected in
// between) grew by nothing: 0, where a uint64 subtraction would wrap.
func heapGrowth(heap0, heap1 uint64, tasks int) float64 {
	if heap1 <= heap0 || tasks < 1 {
		return 0
	}
	return float64(heap1-heap0) / float64(tasks)
}

// liveHeap is the heap in use after a full GC. Two: the first leaves what
// sync.Pools held in their victim caches, which the second frees, so that
// it is not freed between two readings instead.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// robfigSpec is the robfig/cron spec (with seconds) of a harness schedule:
// "@every 1s" becomes "* * * * * *", since robfig's @every counts from
// when the entry was added rather than from the epoch.
func robfigSpec(spec string) string {
	if spec == "@every 1s" {
		return "* * * * * *"
	}
	return spec
}

// robfigParser parses schedules as robfig/cron does with WithSeconds,
// plus its descriptors (@every, @daily).
var robfigParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseRobfig parses a harness schedule (robfigSpec) with robfig/cron,
// which panics on some specs ("TZ=" prefixes): that is an error too.
func parseRobfig(spec string) (sched cron.Schedule, err error) {
	defer func() {
		if p := recover(); p != nil {
			sched, err = nil, fmt.Errorf("robfig/cron panicked: %v", p)
		}
	}()
	return robfigParser.Parse(robfigSpec(spec))
}

// robfigJob is a robfig entry that knows which scheduled time each of its
// runs is for: robfig asks the schedule for the next time when it starts a
// run, so the times it was given are queued and each run takes the oldest.
type robfigJob struct {
	sched cron.Schedule
	run   func(sched time.Time)
	mu    sync.Mutex // guards due
	due   []time.Time
}

func (j *robfigJob) Next(t time.Time) time.Time {
	n := j.sched.Next(t)
	j.mu.Lock()
	j.due = append(j.due, n)
	j.mu.Unlock()
	return n
}

func (j *robfigJob) Run() {
	j.mu.Lock()
	var at time.Time
	if len(j.due) > 0 {
		at = j.due[0]
		j.due = j.due[1:]
	}
	j.mu.Unlock()
	j.run(at)
}

// newRobfig returns a robfig cron (with seconds) holding one entry per
// task, each calling run with the task's index and the time it was for.
func newRobfig(cfg Config, spec string, run func(i int, sched time.Time)) (*cron.Cron, error) {
	parsed, err := parseRobfig(spec)
	if err != nil {
		return nil, fmt.Errorf("bench: schedule %q: %w", spec, err)
	}
	c := cron.New(cron.WithSeconds())
	for i := range cfg.Tasks {
		j := &robfigJob{sched: parsed}
		j.run = func(at time.Time) { run(i, at) }
		c.Schedule(j, j)
	}
	return c, nil
}

// runRobfig is robfig/cron/v3's own runner with one entry per task, as its
// users run it: a goroutine per fire.
func runRobfig(ctx context.Context, cfg Config) (*Result, error) {
	b := newBaseline(cfg, cfg.Schedule, 1)
	heap0 := liveHeap()
	ids := taskIDs(cfg.Tasks)
	c, err := newRobfig(cfg, cfg.Schedule, func(i int, at time.Time) { b.observe(0, ids[i], at) })
	if err != nil {
		return nil, err
	}
	c.Start()
	defer func() { <-c.Stop().Done() }()
	return b.measure(ctx, Robfig, 1, heap0)
}

// runAfterFunc is one time.AfterFunc per task, each setting the next when
// it fires, as a hand-written scheduler does.
func runAfterFunc(ctx context.Context, cfg Config) (*Result, error) {
	b := newBaseline(cfg, cfg.Schedule, 1)
	heap0 := liveHeap()
	ids := taskIDs(cfg.Tasks)
	sched, err := parseRobfig(cfg.Schedule)
	if err != nil {
		return nil, fmt.Errorf("bench: schedule %q: %w", cfg.Schedule, err)
	}
	// No lock on the fire path: each task's timer has its own slot. A
	// callback that runs while the run stops may arm one more timer, which
	// fires once into the recorder and is gone.
	var stopped atomic.Bool
	timers := make([]atomic.Pointer[time.Timer], cfg.Tasks)
	var arm func(i int, at time.Time)
	arm = func(i int, at time.Time) {
		if stopped.Load() {
			return
		}
		timers[i].Store(time.AfterFunc(time.Until(at), func() {
			b.observe(0, ids[i], at)
			arm(i, sched.Next(time.Now()))
		}))
	}
	now := time.Now()
	for i := range cfg.Tasks {
		arm(i, sched.Next(now))
	}
	defer func() {
		stopped.Store(true)
		for i := range timers {
			if t := timers[i].Load(); t != nil {
				t.Stop()
			}
		}
	}()
	return b.measure(ctx, AfterFunc, 1, heap0)
}

// taskIDs builds the ids once, so the fire path does not format them.
func taskIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = taskID(i)
	}
	return ids
}
