package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/task"
)

// fireStall ends the wait for a bulk trigger's fires once its call has
// answered: no new fire for this long, and the triggers not fired by then
// are missing.
const fireStall = 30 * time.Second

// keyStall ends the wait for the owners to delete the keys of the
// triggers that fired: no key deleted for this long, and those left stay
// left.
const keyStall = 10 * time.Second

// keyPoll is how often the trigger keys are counted: a count walks etcd's
// index of every key left, which is the bench's process's CPU.
const keyPoll = 100 * time.Millisecond

// bulkCall is the answer of the bulk trigger and when it came.
type bulkCall struct {
	res *task.BulkResult
	err error
	end time.Time
}

// firesSeen is the nodes' counters as the last new fire was seen.
type firesSeen struct {
	at time.Time
	u  usage
	k  counters
}

// runTrigger writes cfg.Tasks tasks that fire once a year (noop, with the
// probes of probeSlots keyed), starts cfg.Nodes nodes, and triggers every
// task at once through the first node's HTTP API, as 'shardcron task
// trigger --all' does (POST /v1/tasks:trigger {"all": true}). It times the
// call and, from its start, the last fire and the last trigger key the
// owners deleted. Fires are the nodes' fire counters (polled: the last
// fire is known to the poll, 20 ms in-process, 100 ms through a process);
// duplicates and misses are the keyed tasks'.
func runTrigger(ctx context.Context, cfg Config) (*Result, error) {
	f, err := startFleet(ctx, cfg, quietSchedule, cfg.Nodes)
	if err != nil {
		return nil, err
	}
	defer f.close()
	url, stop, err := f.serveAPI(f.live()[0])
	if err != nil {
		return nil, err
	}
	defer stop()
	if n, err := f.reg.PendingTriggerCount(ctx); err != nil || n != 0 {
		return nil, fmt.Errorf("bench: %d trigger keys in etcd before the trigger (%v), want none", n, err)
	}

	fmt.Fprintf(cfg.Progress, "bench: triggering every task through %s\n", url)
	ca, a := f.counters(), snapshot()
	start := a.at
	done := make(chan bulkCall, 1)
	go func() {
		res, err := client.NewClient(url, "").Bulk(ctx, task.BulkTrigger, task.Selector{All: true})
		done <- bulkCall{res, err, time.Now()}
	}()
	call, last, err := f.awaitFires(ctx, done, firesSeen{at: start, u: a, k: ca})
	if err != nil {
		return nil, err
	}
	triggered := uint64(call.res.Changed)
	fired := last.k.fires - ca.fires

	r := &Result{Scenario: Trigger, Tasks: cfg.Tasks, Nodes: cfg.Nodes, KeyedTasks: f.meter.rec.keyed, ExpectedFires: triggered}
	r.TriggerMs = ms(int64(call.end.Sub(start)))
	r.TriggersPerSec = float64(triggered) / call.end.Sub(start).Seconds()
	r.DurationS = last.at.Sub(start).Seconds()
	r.LastFireMs = ms(int64(last.at.Sub(start)))
	r.FiresPerSec = float64(fired) / r.DurationS
	r.setUse(cfg.Procs, a, last.u, ca, last.k)
	r.Misfires = last.k.misfires - ca.misfires
	fmt.Fprintf(cfg.Progress, "bench: %d of %d triggers fired %v after the call's start; counting the trigger keys left\n",
		fired, triggered, last.at.Sub(start).Round(time.Millisecond))

	if err := f.awaitKeys(ctx, start, r); err != nil {
		return nil, err
	}
	// Fires that came after the last one awaited are repeats: counted in
	// fires, and by key for the keyed tasks.
	r.Fires = f.counters().fires - ca.fires
	from, to := start.Truncate(time.Second), call.end.Truncate(time.Second).Add(time.Second)
	r.Duplicates = f.meter.rec.dups(from, to)
	r.Missed = f.meter.rec.unfired(cfg.Tasks, from, to)
	var notes []string
	if triggered != uint64(cfg.Tasks) {
		notes = append(notes, fmt.Sprintf("the call triggered %d of %d tasks", triggered, cfg.Tasks))
	}
	if r.Fires < triggered {
		notes = append(notes, fmt.Sprintf("%d of %d triggers never fired (no fire for %v)", triggered-r.Fires, triggered, fireStall))
	}
	if r.Fires > triggered {
		notes = append(notes, fmt.Sprintf("%d fires more than triggers", r.Fires-triggered))
	}
	if n := f.meter.rec.outside.Load(); n > 0 {
		notes = append(notes, fmt.Sprintf("%d keyed fires scheduled outside the recorder's seconds, not counted by key", n))
	}
	r.Note = strings.Join(notes, "; ")
	return r, nil
}

// awaitFires waits for the bulk trigger's answer on done and for its
// fires: until the nodes have fired as many as it triggered, or none came
// for fireStall after its answer. It returns the answer and the counters
// as the last new fire was seen (from: as the call started).
func (f *fleet) awaitFires(ctx context.Context, done <-chan bulkCall, from firesSeen) (*bulkCall, firesSeen, error) {
	cfg := f.meter.cfg
	every := 20 * time.Millisecond
	if cfg.Procs {
		every = 100 * time.Millisecond // a process is asked over HTTP
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var call *bulkCall
	last, told := from, time.Now()
	for {
		select {
		case c := <-done:
			if c.err != nil {
				return nil, last, fmt.Errorf("bench: bulk trigger: %w", c.err)
			}
			call = &c
			fmt.Fprintf(cfg.Progress, "bench: the call triggered %d tasks in %v\n", c.res.Changed, c.end.Sub(from.at).Round(time.Millisecond))
		case <-tick.C:
		case <-ctx.Done():
			if call == nil {
				<-done // the call ends with ctx
			}
			return nil, last, ctx.Err()
		}
		if k := f.counters(); k.fires > last.k.fires {
			last = firesSeen{at: time.Now(), u: snapshot(), k: k}
		}
		fired := last.k.fires - from.k.fires
		if call != nil && (fired >= uint64(call.res.Changed) || time.Since(slices.MaxFunc([]time.Time{last.at, call.end}, time.Time.Compare)) > fireStall) {
			return call, last, nil
		}
		if time.Since(told) > 5*time.Second {
			told = time.Now()
			fmt.Fprintf(cfg.Progress, "bench: %d fired after %v\n", fired, told.Sub(from.at).Round(time.Second))
		}
	}
}

// awaitKeys counts the trigger keys in etcd until there are none, or none
// was deleted for keyStall, and sets r's figures of them, timed from
// start.
func (f *fleet) awaitKeys(ctx context.Context, start time.Time, r *Result) error {
	tick := time.NewTicker(keyPoll)
	defer tick.Stop()
	var fewest int64 = -1
	progress := time.Now()
	for {
		n, err := f.reg.PendingTriggerCount(ctx)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if fewest < 0 {
			r.TriggerKeysAtLastFire = uint64(n)
		}
		if fewest < 0 || n < fewest {
			fewest, progress = n, time.Now()
		}
		if n == 0 {
			r.TriggerKeysGoneMs = ms(int64(time.Since(start)))
			return nil
		}
		if time.Since(progress) > keyStall {
			r.TriggerKeysLeft = uint64(n)
			fmt.Fprintf(f.meter.cfg.Progress, "bench: warning: %d trigger keys left in etcd, none deleted for %v\n", n, keyStall)
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
