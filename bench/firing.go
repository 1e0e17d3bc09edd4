package bench

import (
	"context"
	"fmt"
	"os"
	"runtime/trace"
	"slices"
	"sync"
	"time"
)

// runThroughput fires every task on its schedule for the window.
func runThroughput(ctx context.Context, cfg Config) (*Result, error) {
	f, err := startFleet(ctx, cfg, cfg.Schedule, cfg.Nodes)
	if err != nil {
		return nil, err
	}
	defer f.close()
	if cfg.Procs {
		// The probes' requests to the receiver time the http executor and
		// the receiver too: the lag is the nodes' own, of every fire in the
		// window, from due to a worker taking it.
		f.nodeLags = f.fireLags
	}
	w, err := f.openWindow(ctx)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Progress, "bench: measuring %v\n", cfg.Duration)
	if err := f.closeWindow(ctx, w, w.from.Add(cfg.Duration)); err != nil {
		return nil, err
	}
	return f.result(Throughput, cfg.Nodes, w)
}

// runBurst gives every task the same second: a 6-field cron spec firing
// once a minute at a second chosen a little after the nodes are expected
// to be ready. If they are late, the next minute's burst is measured.
func runBurst(ctx context.Context, cfg Config) (*Result, error) {
	// Writing and loading the tasks takes about 1 s per 10 000 on a small
	// machine; the margin covers it twice.
	at := time.Now().Add(5*time.Second + time.Duration(cfg.Tasks/5_000)*time.Second).Truncate(time.Second)
	spec := fmt.Sprintf("%d * * * * *", at.Second())
	f, err := startFleet(ctx, cfg, spec, cfg.Nodes)
	if err != nil {
		return nil, err
	}
	defer f.close()
	for time.Until(at) < 500*time.Millisecond {
		at = at.Add(time.Minute)
	}
	fmt.Fprintf(cfg.Progress, "bench: burst of %d fires at %s\n", cfg.Tasks, at.Format(time.TimeOnly))
	w := &window{from: at, to: at.Add(time.Second)}
	f.lagByScheduled = true
	if err := sleepUntil(ctx, at.Add(-250*time.Millisecond)); err != nil {
		return nil, err
	}
	w.ca, w.a = f.counters(), snapshot()
	before, err := f.fireLags(ctx)
	if err != nil {
		return nil, err
	}
	stopTrace := func() {}
	if cfg.Trace != "" {
		if stopTrace, err = startTrace(cfg.Trace); err != nil {
			return nil, err
		}
		defer stopTrace()
	}
	// Wait until every fire of the burst ran, or a minute.
	deadline := at.Add(time.Minute)
	for f.counters().fires-w.ca.fires < uint64(cfg.Tasks) && time.Now().Before(deadline) {
		if err := sleepUntil(ctx, time.Now().Add(10*time.Millisecond)); err != nil {
			return nil, err
		}
	}
	w.cb, w.b = f.counters(), snapshot()
	stopTrace() // the burst is out
	if err := sleepUntil(ctx, time.Now().Add(time.Second)); err != nil {
		return nil, err
	}
	r, err := f.result(Burst, cfg.Nodes, w)
	if err != nil {
		return nil, err
	}
	// The lag is the nodes' own, of every fire of the burst, from due to a
	// worker taking it: the few probes (fewProbes) sample the burst too
	// sparsely for a p99, and through a process a probe's request to the
	// receiver times the receiver as much as the node.
	after, err := f.fireLags(ctx)
	if err != nil {
		return nil, err
	}
	h, err := lagSince(before, after)
	if err != nil {
		return nil, err
	}
	r.LagP50Ms, r.LagP99Ms, r.LagMaxMs = h.Quantile(0.5)*1000, h.Quantile(0.99)*1000, maxMs(h)
	r.LagDist = histBuckets(h)
	// The burst lasts from its second to its last fire, not from the
	// snapshot before it.
	if last := time.Unix(0, f.meter.rec.lastExec.Load()); last.After(at) && r.Fires > 0 {
		r.DurationS = max(last.Sub(at), w.b.at.Sub(at)).Seconds()
		r.FiresPerSec = float64(r.Fires) / r.DurationS
	}
	return r, nil
}

// runHandover measures a join (rebalance) or a kill (failover) under load:
// the cluster runs, the event happens, and the cluster runs cfg.Duration
// more (at least until every node is ready again, plus 3 s). Rebalance
// then makes the node that joined leave gracefully, then start again from
// its data directory, and measures the same for each.
func runHandover(ctx context.Context, cfg Config, scenario string) (*Result, error) {
	initial := cfg.Nodes
	if scenario == Rebalance {
		initial = cfg.Nodes - 1
	}
	f, err := startFleet(ctx, cfg, cfg.Schedule, initial)
	if err != nil {
		return nil, err
	}
	defer f.close()
	w, err := f.openWindow(ctx)
	if err != nil {
		return nil, err
	}
	// Two steady seconds before the event.
	if err := sleepUntil(ctx, w.from.Add(2*time.Second+300*time.Millisecond)); err != nil {
		return nil, err
	}
	last := cfg.Nodes - 1
	event := func() error {
		if scenario == Rebalance {
			fmt.Fprintf(cfg.Progress, "bench: node %d joins\n", last)
			// With a cache, which its restart starts from.
			_, err := f.addNode(ctx, true)
			return err
		}
		// The time, to read the nodes' logs (--dir) against.
		fmt.Fprintf(cfg.Progress, "bench: node %d is killed at %s\n", last, time.Now().UTC().Format(time.RFC3339Nano))
		f.kill(ctx, last)
		return nil
	}
	h, err := f.handover(ctx, event)
	if err != nil {
		return nil, err
	}
	if scenario != Rebalance {
		if err := f.closeWindow(ctx, w, h.end); err != nil {
			return nil, err
		}
		r, err := f.result(scenario, cfg.Nodes, w)
		if err != nil {
			return nil, err
		}
		h.fill(r)
		return r, nil
	}

	// Then the node that joined leaves, and starts again from its data
	// directory. Each event's window begins where the one before ends,
	// and the event comes 300 ms into it, as the join did.
	windows, hs := []*window{w}, []*handover{h}
	for _, event := range []func() error{
		func() error {
			fmt.Fprintf(cfg.Progress, "bench: node %d leaves\n", last)
			return f.leave(ctx, last)
		},
		func() error {
			fmt.Fprintf(cfg.Progress, "bench: node %d starts again from its data directory\n", last)
			_, err := f.startNode(ctx, last, true)
			return err
		},
	} {
		prev := windows[len(windows)-1]
		prev.to = hs[len(hs)-1].end.Add(time.Second - 1).Truncate(time.Second)
		if err := sleepUntil(ctx, prev.to.Add(-500*time.Millisecond)); err != nil {
			return nil, err
		}
		prev.cb, prev.b = f.count(), snapshot()
		next := &window{from: prev.to, a: prev.b, ca: prev.cb}
		if err := sleepUntil(ctx, next.from.Add(300*time.Millisecond)); err != nil {
			return nil, err
		}
		h, err := f.handover(ctx, event)
		if err != nil {
			return nil, err
		}
		windows, hs = append(windows, next), append(hs, h)
	}
	if err := f.closeWindow(ctx, windows[len(windows)-1], hs[len(hs)-1].end); err != nil {
		return nil, err
	}
	var rs []*Result
	for i, w := range windows {
		r, err := f.result(scenario, cfg.Nodes, w)
		if err != nil {
			return nil, err
		}
		hs[i].fill(r)
		rs = append(rs, r)
	}
	r := rs[0]
	r.Leave, r.Rejoin = rs[1].event(), rs[2].event()
	return r, nil
}

// handover is what one event did to the partitions.
type handover struct {
	ready      time.Duration // from the event until every node is ready with every task
	end        time.Time     // when the measurement of the event may end
	moved      int
	lags, gaps []float64 // per moved partition, ms
}

// handover marks the event, runs it, waits until the live nodes are ready
// with every task, and lets the cluster run until cfg.Duration after the
// event (at least 3 s after ready). It returns the hand-over of every
// partition whose owner changed, from the probes' first fires on their new
// owners.
func (f *fleet) handover(ctx context.Context, event func() error) (*handover, error) {
	cfg := f.meter.cfg
	before, err := f.live()[0].owners(ctx, cfg.Partitions)
	if err != nil {
		return nil, err
	}
	at := time.Now()
	f.meter.rec.markEvent(at)
	if err := event(); err != nil {
		return nil, err
	}
	if err := f.waitReady(ctx, cfg.Tasks, readyTimeout(cfg)); err != nil {
		return nil, err
	}
	h := &handover{ready: time.Since(at)}
	fmt.Fprintf(cfg.Progress, "bench: ready again %v after the event\n", h.ready.Round(time.Millisecond))
	h.end = slices.MaxFunc([]time.Time{at.Add(cfg.Duration), time.Now().Add(3 * time.Second)}, time.Time.Compare)
	// The moved partitions' first fires on their new owners come within a
	// period of ready; the owners are read then.
	if err := sleepUntil(ctx, h.end.Add(-time.Second)); err != nil {
		return nil, err
	}
	after, err := f.live()[0].owners(ctx, cfg.Partitions)
	if err != nil {
		return nil, err
	}
	moves := map[int][2]int{}
	for p := range before {
		if before[p] != after[p] && before[p] >= 0 && after[p] >= 0 {
			moves[p] = [2]int{before[p], after[p]}
		}
	}
	h.moved = len(moves)
	h.lags, h.gaps = f.meter.rec.handoff(moves)
	return h, nil
}

// fill sets r's hand-over figures.
func (h *handover) fill(r *Result) {
	r.ReadyMs = ms(int64(h.ready))
	r.MovedPartitions = h.moved
	r.HandoffP50Ms, r.HandoffP99Ms, r.HandoffMaxMs = quantile(h.lags, 0.5), quantile(h.lags, 0.99), quantile(h.lags, 1)
	r.HandoffGapMaxMs = quantile(h.gaps, 1)
}

// quantile is the nearest-rank q-quantile of vs, 0 for none.
func quantile(vs []float64, q float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// startTrace starts the Go execution trace of the bench's process into
// the file at path (Config.Trace); stop ends it and closes the file, once
// however often it is called.
func startTrace(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench: trace: %w", err)
	}
	if err := trace.Start(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("bench: trace: %w", err)
	}
	return sync.OnceFunc(func() { trace.Stop(); _ = f.Close() }), nil
}
