package registry

import (
	"context"
	"fmt"
	"slices"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/task"
)

// Runners is what the cluster's live nodes can run, as their membership
// records say (membership.NodeInfo Exec and Handlers). Leaving nodes are
// left out: they are handing their partitions over.
type Runners struct {
	Nodes    int            // live nodes that stay
	Exec     int            // of them, those running the exec executor
	Handlers map[string]int // handler name -> nodes that registered it
	// ExecAllow holds the exec allow-list of each node that runs exec (nil
	// for none), HTTPAllow that of each live node. An allow-list a node
	// publishes but this one cannot parse (a newer version's syntax)
	// counts as an empty one: no path, no host.
	ExecAllow []*executor.PathAllow
	HTTPAllow []*executor.HostAllow
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
			var pa *executor.PathAllow
			if len(m.Info.ExecAllow) > 0 {
				if pa, err = executor.ParsePathAllow(m.Info.ExecAllow); err != nil {
					pa = &executor.PathAllow{}
				}
			}
			rs.ExecAllow = append(rs.ExecAllow, pa)
		}
		var ha *executor.HostAllow
		if len(m.Info.HTTPAllow) > 0 {
			if ha, err = executor.ParseHostAllow(m.Info.HTTPAllow); err != nil {
				ha = &executor.HostAllow{}
			}
		}
		rs.HTTPAllow = append(rs.HTTPAllow, ha)
		for _, h := range slices.Compact(slices.Clone(m.Info.Handlers)) {
			rs.Handlers[h]++
		}
	}
	return rs, nil
}

// NeedsRunner reports whether t's executor may run only on some nodes
// (exec, handler, and http under an allow-list), so that Runners.Check
// applies.
func NeedsRunner(t *task.Task) bool {
	if t.Notify != nil && t.Notify.URL != "" {
		return true // the nodes' --http-allow applies to alerts
	}
	switch t.Executor.Type {
	case task.ExecutorExec, task.ExecutorHandler, task.ExecutorHTTP:
		return true
	}
	return false
}

// Check refuses, with a *ValidationError, a task that no live node can
// run: an exec task when no node runs --allow-exec with an --exec-allow
// that admits its command, an http task when every node's --http-allow
// leaves its host out, a handler task when no node registered its handler.
// When only some nodes can, it returns a warning: fires whose partition
// another node owns fail. A notify url is checked as an http task's url:
// alerts go through the same client (checkNotify).
func (rs Runners) Check(t *task.Task) (warning string, err error) {
	nw, err := rs.checkNotify(t)
	if err != nil {
		return "", err
	}
	w, err := rs.checkExecutor(t)
	if err != nil {
		return "", err
	}
	if w != "" && nw != "" {
		return w + "; " + nw, nil
	}
	return w + nw, nil
}

// checkNotify refuses a notify url that every live node's --http-allow
// leaves out, and warns when only some allow it.
func (rs Runners) checkNotify(t *task.Task) (warning string, err error) {
	if t.Notify == nil || t.Notify.URL == "" || rs.Nodes == 0 {
		return "", nil
	}
	can, why := rs.reaching(t.Notify.URL)
	switch {
	case can == rs.Nodes:
		return "", nil
	case can == 0:
		return "", task.Invalid("notify.url", "no live node may send alerts there: %v", why)
	}
	return fmt.Sprintf("only %d of %d live nodes may send alerts to the notify url: alerts of this task are refused while another node owns it", can, rs.Nodes), nil
}

// checkExecutor is Check of the task's executor.
func (rs Runners) checkExecutor(t *task.Task) (warning string, err error) {
	var can int
	var what, how string
	switch t.Executor.Type {
	case task.ExecutorExec:
		can, what, how = rs.Exec, "the exec executor", "start a node with --allow-exec"
		if rs.Exec > 0 && len(t.Executor.Command) > 0 {
			var why error
			can, why = 0, nil
			for _, a := range rs.ExecAllow {
				err := a.CheckCommand(t.Executor.Command[0])
				if err == nil {
					err = a.CheckEnv(t.Executor.Env)
				}
				if err != nil {
					why = err
					continue
				}
				can++
			}
			if can == 0 {
				return "", task.Invalid("executor.command", "no live node may run %q: %v", t.Executor.Command[0], why)
			}
			what = fmt.Sprintf("the exec executor with %q allowed", t.Executor.Command[0])
		}
	case task.ExecutorHTTP:
		var why error
		can, why = rs.reaching(t.Executor.URL)
		if rs.Nodes == 0 || can == rs.Nodes {
			return "", nil
		}
		if can == 0 {
			return "", task.Invalid("executor.url", "no live node may reach it: %v", why)
		}
		what = "an --http-allow that admits this URL"
	case task.ExecutorHandler:
		can = rs.Handlers[t.Executor.Name]
		what = fmt.Sprintf("the handler %q", t.Executor.Name)
		how = "register it with Engine.Handle on the nodes that should run it"
	default:
		return "", nil
	}
	switch {
	case can == 0:
		field := "executor.type"
		if t.Executor.Type == task.ExecutorHandler {
			field = "executor.name"
		}
		nodes := fmt.Sprintf("%d live nodes", rs.Nodes)
		if rs.Nodes == 1 {
			nodes = "1 live node"
		}
		return "", task.Invalid(field, "no live node runs %s (of %s): %s", what, nodes, how)
	case can < rs.Nodes:
		return fmt.Sprintf("only %d of %d live nodes run %s: fires of this task fail while its partition is owned by another node", can, rs.Nodes, what), nil
	}
	return "", nil
}

// reaching counts the live nodes whose --http-allow admits url, with the
// reason of one that does not.
func (rs Runners) reaching(url string) (can int, why error) {
	for _, a := range rs.HTTPAllow {
		if err := a.CheckURL(url); err != nil {
			why = err
			continue
		}
		can++
	}
	return can, why
}
