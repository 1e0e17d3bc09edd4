package bench

import (
	"context"
	"fmt"
)

// Run runs cfg's scenario and returns what it measured; All runs every
// scenario and returns one Result each, in the order of Scenarios.
func Run(ctx context.Context, cfg Config) ([]*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	given := cfg
	cfg = cfg.Defaults()
	if cfg.Scenario != All {
		r, err := runOne(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return []*Result{r}, nil
	}
	var out []*Result
	for _, s := range Scenarios {
		// Flags given apply to every scenario; the others take each
		// scenario's defaults (its task count, its nodes).
		c := given
		c.Scenario = s
		if s == Rebalance || s == Failover {
			c.Nodes = max(c.Nodes, 2)
		}
		c = c.Defaults()
		fmt.Fprintf(cfg.Progress, "bench: == %s ==\n", s)
		r, err := runOne(ctx, c)
		if err != nil {
			return out, fmt.Errorf("%s: %w", s, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func runOne(ctx context.Context, cfg Config) (*Result, error) {
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
	case LockPerFire:
		return runLockPerFire(ctx, cfg)
	case Robfig:
		return runRobfig(ctx, cfg)
	case AfterFunc:
		return runAfterFunc(ctx, cfg)
	}
	return nil, fmt.Errorf("bench: scenario %q is not built yet", cfg.Scenario)
}
