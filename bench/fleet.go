package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardcron/shardcron/engine"
)

// fleet is a cluster whose tasks fire: tasks written, nodes started, fires
// recorded, counters sampled every second.
type fleet struct {
	*cluster
	*meter
	slot []int32 // keyed slots (noop executor), nil: every task is keyed
	recv *receiver
}

// meter measures a run that fires tasks: the recorder, the counters
// sampled every second, and the window.
type meter struct {
	cfg   Config
	spec  string
	rec   *recorder
	count func() counters
	// lagByScheduled takes the window's lag from the fires scheduled in it
	// (a burst) rather than from those that ran in it.
	lagByScheduled bool
	// nodeLags, when set, reads the nodes' own fire-lag histograms at the
	// window's snapshots, and the window's lag is theirs (runThroughput).
	nodeLags func(context.Context) ([]engine.Histogram, error)

	sampleStop context.CancelFunc
	sampleWG   sync.WaitGroup
	smu        sync.Mutex         // guards samples
	samples    map[int64]counters // at unix second s + 0.5 s: the counters then
}

// startFleet writes cfg.Tasks tasks on spec, starts nodes nodes and waits
// until they are ready with every task loaded.
func startFleet(ctx context.Context, cfg Config, spec string, nodes int) (f *fleet, err error) {
	c, err := startCluster(ctx, cfg)
	if err != nil {
		return nil, err
	}
	f = &fleet{cluster: c, meter: &meter{cfg: cfg, spec: spec, samples: map[int64]counters{}}}
	f.meter.count = c.counters
	// The fleet is held apart from the result: a 'return nil, err' below
	// sets f to nil before this runs.
	started := f
	defer func() {
		if err != nil {
			started.close()
		}
	}()
	if cfg.Executor == ExecNoop {
		f.slot = probeSlots(cfg.Tasks, cfg.Partitions, probedPartitions(cfg))
	}
	// The recorder must exist before tasks fire, and its seconds must cover
	// the whole run: loading, the window and the tail.
	width := int((2*cfg.Duration+cfg.LeaseTTL)/time.Second) + 300 + cfg.Tasks/10_000
	f.meter.rec = newRecorder(cfg.Tasks, cfg.Partitions, cfg.Nodes, time.Now().Truncate(time.Second), width, f.slot)
	f.cluster.rec = f.meter.rec
	url := ""
	// A node process cannot call the bench's handler: its keyed tasks post
	// to the receiver instead.
	if cfg.Executor == ExecHTTP || cfg.Procs {
		if f.recv, err = startReceiver(f.meter.rec); err != nil {
			return nil, err
		}
		url = f.recv.url
	}
	if err := f.putTasks(ctx, cfg.Tasks, spec, executorFor(cfg.Executor, url, f.slot)); err != nil {
		return nil, err
	}
	if err := f.startNodes(ctx, nodes); err != nil {
		return nil, err
	}
	f.startSampling()
	return f, nil
}

// fewProbes is how many partitions a burst, or a throughput run through
// node processes, probes. Each probe fire costs the node far more than the
// noop fires around it: through a process it is an HTTP request to the
// receiver (with a probe in each of 1 024 partitions the node's own fire
// lag in a burst of 100 000 was 70-130 ms at p50 where it is 23 ms with 64,
// and a node firing 1 M a second had a p99 of 140-179 ms where it had
// 97-101 ms with 64); in-process it is a handler call on a context with a
// timeout, taken by a worker alone, and 1 024 of them made a burst of
// 100 000 take its workers 7 ms where 64 took 2.7. The lag there comes
// from the nodes' histograms (runBurst, runThroughput); the probes keep
// counting duplicates and misses. A hand-over needs a probe in every
// partition, to time each partition's gap.
const fewProbes = 64

// probedPartitions returns how many partitions get a probe.
func probedPartitions(cfg Config) int {
	if cfg.Scenario == Burst || cfg.Procs && cfg.Scenario == Throughput {
		return min(cfg.Partitions, fewProbes)
	}
	return cfg.Partitions
}

// startNodes starts nodes nodes and waits until all hold every task.
func (f *fleet) startNodes(ctx context.Context, nodes int) error {
	start := time.Now()
	for range nodes {
		if _, err := f.addNode(ctx, false); err != nil {
			return err
		}
	}
	if err := f.waitReady(ctx, f.meter.cfg.Tasks, readyTimeout(f.meter.cfg)); err != nil {
		return err
	}
	fmt.Fprintf(f.meter.cfg.Progress, "bench: %d node(s) ready with %d tasks in %v\n", nodes, f.meter.cfg.Tasks, time.Since(start).Round(time.Millisecond))
	return nil
}

// readyTimeout bounds a wait for nodes to load their tasks: generous, as
// the machine may be shared.
func readyTimeout(cfg Config) time.Duration {
	return 2*time.Minute + 2*cfg.LeaseTTL + time.Duration(cfg.Tasks/2_000)*time.Second
}

// startSampling starts taking the counters every second; stopSampling
// stops it.
func (m *meter) startSampling() {
	ctx, stop := context.WithCancel(context.Background())
	m.sampleStop = stop
	m.sampleWG.Add(1)
	go func() { defer m.sampleWG.Done(); m.sample(ctx) }()
}

func (m *meter) stopSampling() {
	if m.sampleStop != nil {
		m.sampleStop()
		m.sampleWG.Wait()
	}
}

// sample takes the counters every second at half past, until ctx ends.
func (m *meter) sample(ctx context.Context) {
	for {
		next := time.Now().Truncate(time.Second).Add(1500 * time.Millisecond)
		if time.Until(next) > time.Second {
			next = next.Add(-time.Second)
		}
		if sleepUntil(ctx, next) != nil {
			return
		}
		c := m.count()
		m.smu.Lock()
		m.samples[next.Unix()] = c
		m.smu.Unlock()
	}
}

func (f *fleet) close() {
	f.stopSampling()
	_ = f.cluster.close()
	if f.recv != nil {
		f.recv.close()
	}
}

// window is the measured part of a run: scheduled seconds [from, to),
// whose fires run between the snapshots a and b taken half a second after
// from and to.
type window struct {
	from, to time.Time
	a, b     usage
	ca, cb   counters
	la, lb   []engine.Histogram // the nodes' fire lag at a and b (meter.nodeLags)
}

// openWindow waits for the second after the next whole one plus half a
// second, and takes the first snapshot there.
func (m *meter) openWindow(ctx context.Context) (*window, error) {
	from := time.Now().Truncate(time.Second).Add(2 * time.Second)
	if err := sleepUntil(ctx, from.Add(-500*time.Millisecond)); err != nil {
		return nil, err
	}
	w := &window{from: from, ca: m.count(), a: snapshot()}
	if m.nodeLags != nil {
		var err error
		if w.la, err = m.nodeLags(ctx); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// closeWindow waits for the whole second at or after end plus half a
// second, takes the second snapshot there, and waits 2 s more for the
// window's last fires.
func (m *meter) closeWindow(ctx context.Context, w *window, end time.Time) error {
	w.to = end.Add(time.Second - 1).Truncate(time.Second)
	if err := sleepUntil(ctx, w.to.Add(-500*time.Millisecond)); err != nil {
		return err
	}
	w.cb, w.b = m.count(), snapshot()
	if m.nodeLags != nil {
		var err error
		if w.lb, err = m.nodeLags(ctx); err != nil {
			return err
		}
	}
	return sleepUntil(ctx, w.to.Add(2*time.Second))
}

// result fills the figures every firing scenario reports.
func (m *meter) result(scenario string, nodes int, w *window) (*Result, error) {
	r := &Result{Scenario: scenario, Tasks: m.cfg.Tasks, Nodes: nodes, KeyedTasks: m.rec.keyed}
	// The snapshots are half a second before from and to: the fires of the
	// seconds [from, to) run between them when they are less than half a
	// second late.
	r.DurationS = w.b.at.Sub(w.a.at).Seconds()
	r.Fires = w.cb.fires - w.ca.fires
	r.FiresPerSec = float64(r.Fires) / r.DurationS
	r.setUse(m.cfg.Procs, w.a, w.b, w.ca, w.cb)
	r.Misfires = w.cb.misfires - w.ca.misfires
	lag := m.rec.lagRan(w.from, w.to)
	if m.lagByScheduled {
		lag = m.rec.lag(w.from, w.to)
	}
	r.LagP50Ms, r.LagP99Ms, r.LagMaxMs = lag.quantileMs(0.5), lag.quantileMs(0.99), lag.maxMs()
	r.LagDist = lag.buckets()
	if w.la != nil && w.lb != nil {
		h, err := lagSince(w.la, w.lb)
		if err != nil {
			return nil, err
		}
		r.LagP50Ms, r.LagP99Ms, r.LagMaxMs = h.Quantile(0.5)*1000, h.Quantile(0.99)*1000, maxMs(h)
		r.LagDist = histBuckets(h)
	}
	r.Duplicates = m.rec.dups(w.from, w.to)
	var err error
	if r.Missed, err = m.rec.missed(m.spec, m.cfg.Tasks, w.from, w.to); err != nil {
		return nil, err
	}
	if r.ExpectedFires, err = expected(m.spec, m.cfg.Tasks, w.from, w.to); err != nil {
		return nil, err
	}
	r.LagSeries = m.series()
	return r, nil
}

// series is the run second by second: fires from the samples, lag from
// the recorder by scheduled second.
func (m *meter) series() []SeriesPoint {
	m.smu.Lock()
	defer m.smu.Unlock()
	secs := make([]int64, 0, len(m.samples))
	for s := range m.samples {
		secs = append(secs, s)
	}
	slices.Sort(secs)
	var out []SeriesPoint
	for i := 1; i < len(secs); i++ {
		s := secs[i]
		p := SeriesPoint{T: float64(s - secs[0])}
		if secs[i-1] == s-1 {
			p.Fires = m.samples[s].fires - m.samples[s-1].fires
		}
		if k := s - m.rec.base; k >= 0 && k < int64(m.rec.width) {
			if h := m.rec.perSec[k]; h.n.Load() > 0 {
				p.HasLag, p.P50Ms, p.P99Ms, p.MaxMs = true, h.quantileMs(0.5), h.quantileMs(0.99), h.maxMs()
			}
		}
		out = append(out, p)
	}
	return out
}

// nodeIndex is the index of node id "bench-<i>", -1 for another id.
func nodeIndex(id string) int {
	i, err := strconv.Atoi(strings.TrimPrefix(id, "bench-"))
	if err != nil || !strings.HasPrefix(id, "bench-") {
		return -1
	}
	return i
}
