package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// Run runs cfg's scenarios and returns what they measured, one Result per
// scenario in the order given (All: the order of Scenarios). With
// cfg.Runs > 1 the scenarios run in turn, run after run, so that a noisy
// moment of the machine falls on all of them alike, and each Result holds
// the medians of its runs. On an error it returns the scenarios measured
// so far with it.
func Run(ctx context.Context, cfg Config) ([]*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	given := cfg
	cfg = cfg.Defaults()
	names := scenarioList(cfg.Scenario)
	per := make([][]*Result, len(names))
	medians := func() []*Result {
		var out []*Result
		for _, rs := range per {
			if len(rs) > 0 {
				out = append(out, median(rs))
			}
		}
		return out
	}
	for run := range cfg.Runs {
		for i, s := range names {
			c := scenarioConfig(given, s, len(names) > 1)
			if c.Dir != "" && (cfg.Runs > 1 || len(names) > 1) {
				// Each run starts from an empty etcd and empty caches.
				c.Dir = filepath.Join(c.Dir, fmt.Sprintf("%s-%d", s, run+1))
			}
			switch {
			case cfg.Runs > 1:
				fmt.Fprintf(cfg.Progress, "bench: == %s, run %d of %d ==\n", s, run+1, cfg.Runs)
			case len(names) > 1:
				fmt.Fprintf(cfg.Progress, "bench: == %s ==\n", s)
			}
			r, err := runOne(ctx, c)
			if err != nil {
				return medians(), &scenarioError{s, err}
			}
			per[i] = append(per[i], r)
		}
	}
	return medians(), nil
}

// scenarioError is a scenario's error, named by the scenario. Its text
// drops the "bench: " the package's errors start with, which would
// otherwise come after the scenario's name ("robfig: bench: ...").
type scenarioError struct {
	scenario string
	err      error
}

func (e *scenarioError) Error() string {
	return e.scenario + ": " + strings.TrimPrefix(e.err.Error(), "bench: ")
}

func (e *scenarioError) Unwrap() error { return e.err }

// scenarioList expands All and splits a comma-separated list.
func scenarioList(scenario string) []string {
	var out []string
	for _, s := range strings.Split(scenario, ",") {
		if s == All {
			out = append(out, Scenarios...)
		} else {
			out = append(out, s)
		}
	}
	return out
}

// scenarioConfig is the configuration of scenario s in a run of given. In
// a list, the flags given apply to every scenario they fit; the others
// take each scenario's defaults (its task count, its nodes).
func scenarioConfig(given Config, s string, inList bool) Config {
	c := given
	c.Scenario = s
	if inList {
		if (s == Rebalance || s == Failover) && c.Nodes > 0 {
			c.Nodes = max(c.Nodes, 2)
		}
		c.Procs = c.Procs && slices.Contains(ProcScenarios, s)
	}
	return c.Defaults()
}

// IsList reports whether scenario names more than one scenario (All or a
// comma-separated list): Run then returns several Results.
func IsList(scenario string) bool { return len(scenarioList(scenario)) > 1 }

func runOne(ctx context.Context, cfg Config) (*Result, error) {
	r, err := runScenario(ctx, cfg)
	if err != nil {
		return nil, err
	}
	for _, w := range nothingMeasured(r) {
		// A zero that was not measured reads as a perfect result: say so
		// now, and in the result.
		fmt.Fprintf(cfg.Progress, "bench: warning: %s: %s\n", r.Scenario, w)
		r.Note = strings.TrimPrefix(r.Note+"; "+w, "; ")
	}
	return r, nil
}

// nothingMeasured says which of r's figures measured nothing: no fire in
// the window (the schedule gave none, or nothing ran), so that fires/s and
// the lag are 0; no partition moved in a hand-over, so that its figures
// are 0; no fire after a restart.
func nothingMeasured(r *Result) []string {
	var out []string
	switch r.Scenario {
	case Throughput, Burst, LockPerFire, Robfig, AfterFunc, Rebalance, Failover:
		if r.Fires == 0 {
			out = append(out, fmt.Sprintf("no fire ran in the measured window (the schedule gave it %d): "+
				"fires_per_sec and the lag measured nothing", r.ExpectedFires))
		}
	}
	switch r.Scenario {
	case Rebalance:
		if r.MovedPartitions == 0 {
			out = append(out, "no partition moved when the node joined: the hand-over figures measured nothing")
		}
		if r.Leave.MovedPartitions == 0 {
			out = append(out, "no partition moved when the node left: the leave's hand-over figures measured nothing")
		}
		if r.Rejoin.MovedPartitions == 0 {
			out = append(out, "no partition moved when the node started again: the rejoin's hand-over figures measured nothing")
		}
	case Failover:
		if r.MovedPartitions == 0 {
			out = append(out, "no partition moved when the node was killed (it owned none): the hand-over figures measured nothing")
		}
	case Restart:
		if r.FirstFireMs == 0 {
			out = append(out, "no fire came within a minute of ready (the schedule gave none): first_fire_ms measured nothing")
		}
	}
	return out
}

func runScenario(ctx context.Context, cfg Config) (*Result, error) {
	switch cfg.Scenario {
	case Throughput:
		return runThroughput(ctx, cfg)
	case Burst:
		return runBurst(ctx, cfg)
	case Rebalance, Failover:
		return runHandover(ctx, cfg, cfg.Scenario)
	case Memory:
		return runMemory(ctx, cfg)
	case Import:
		return runImport(ctx, cfg)
	case Restart:
		return runRestart(ctx, cfg)
	case Query:
		return runQuery(ctx, cfg)
	case Trigger:
		return runTrigger(ctx, cfg)
	case LockPerFire:
		return runLockPerFire(ctx, cfg)
	case Robfig:
		return runRobfig(ctx, cfg)
	case AfterFunc:
		return runAfterFunc(ctx, cfg)
	}
	return nil, fmt.Errorf("bench: scenario %q is not built yet", cfg.Scenario)
}
