package engine

import (
	"context"
	"fmt"
	"slices"

	"github.com/shardcron/shardcron/membership"
)

// Runners is what the cluster's live nodes can run, as their membership
// records say (membership.NodeInfo Exec and Handlers). Leaving nodes are
// left out: they are handing their partitions over.
type Runners struct {
	Nodes    int            // live nodes that stay
	Exec     int            // of them, those running the exec executor
	Handlers map[string]int // handler name -> nodes that registered it
}

// Runners reads the live nodes' capabilities: one etcd range read of the
// member keys.
func (r *Registry) Runners(ctx context.Context) (Runners, error) {
	ms, _, err := membership.List(ctx, r.cli, r.keys.prefix)
	if err != nil {
		return Runners{}, fmt.Errorf("read what the nodes run: %w", err)
	}
	rs := Runners{Handlers: map[string]int{}}
	for _, m := range ms {
		if m.Info.Leaving {
			continue
		}
		rs.Nodes++
		if m.Info.Exec {
			rs.Exec++
		}
		for _, h := range slices.Compact(slices.Clone(m.Info.Handlers)) {
			rs.Handlers[h]++
		}
	}
	return rs, nil
}

// NeedsRunner reports whether t's executor runs only on some nodes (exec,
// handler), so that Runners.Check applies.
func NeedsRunner(t *Task) bool {
	return t.Executor.Type == ExecutorExec || t.Executor.Type == ExecutorHandler
}

// Check refuses, with a *ValidationError, a task that no live node can
// run: an exec task when no node runs --allow-exec, a handler task when no
// node registered its handler. When only some nodes can, it returns a
// warning: fires whose partition another node owns fail.
func (rs Runners) Check(t *Task) (warning string, err error) {
	var can int
	var what, how string
	switch t.Executor.Type {
	case ExecutorExec:
		can, what, how = rs.Exec, "the exec executor", "start a node with --allow-exec"
	case ExecutorHandler:
		can = rs.Handlers[t.Executor.Name]
		what = fmt.Sprintf("the handler %q", t.Executor.Name)
		how = "register it with Engine.Handle on the nodes that should run it"
	default:
		return "", nil
	}
	switch {
	case can == 0:
		field := "executor.type"
		if t.Executor.Type == ExecutorHandler {
			field = "executor.name"
		}
		return "", invalid(field, "no live node runs %s (%d live nodes): %s", what, rs.Nodes, how)
	case can < rs.Nodes:
		return fmt.Sprintf("only %d of %d live nodes run %s: fires of this task fail while its partition is owned by another node", can, rs.Nodes, what), nil
	}
	return "", nil
}
