package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/task"
)

// Chains (on_success, on_failure) are checked on write, here rather than in
// package task, because the check needs the other tasks' definitions: a
// target must exist (unless the put allows missing ones), and following
// the targets' own chains must not lead back to the task written.

// maxChainWalk bounds the tasks the cycle check reads for one put: each is
// also a compare of the put's transaction, so that two puts closing a cycle
// between them cannot both succeed.
const maxChainWalk = 64

// chainLinks is what a stored task's JSON says of its chains.
type chainLinks struct {
	OnSuccess []string `json:"on_success"`
	OnFailure []string `json:"on_failure"`
}

// checkChains reads the tasks t's chains lead to, transitively, and
// refuses (*task.ValidationError) a chain that leads back to t, naming the
// cycle, or a target that does not exist unless allowMissing. It returns
// compares on the revisions of the tasks it read (a missing one: that it
// is still missing), for the put's transaction.
func (r *Registry) checkChains(ctx context.Context, t *task.Task, allowMissing bool) ([]clientv3.Cmp, error) {
	if len(t.OnSuccess) == 0 && len(t.OnFailure) == 0 {
		return nil, nil
	}
	var cmps []clientv3.Cmp
	// read returns the targets of stored task id, and whether it exists;
	// either way the put's transaction is conditioned on what it saw.
	read := func(id string) ([]string, bool, error) {
		key := r.key(id)
		resp, err := r.cli.Get(ctx, key)
		if err != nil {
			return nil, false, fmt.Errorf("check the chains of %q: %w", id, err)
		}
		if len(resp.Kvs) == 0 {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
			return nil, false, nil
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision))
		next, err := links(resp.Kvs[0].Value)
		if err != nil {
			return nil, false, fmt.Errorf("check the chains of %q: %w", id, err)
		}
		return next, true, nil
	}
	seen := map[string]bool{t.ID: true}
	path := map[string][]string{} // how the walk reached id from t, for the error
	origin := map[string]string{} // the field of t whose target led to id
	type hop struct{ id, field string }
	var queue []hop
	for _, f := range []struct {
		name string
		ids  []string
	}{{"on_success", t.OnSuccess}, {"on_failure", t.OnFailure}} {
		for _, id := range f.ids {
			if !seen[id] {
				seen[id] = true
				path[id], origin[id] = []string{t.ID, id}, f.name
				queue = append(queue, hop{id, fmt.Sprintf("%s[%d]", f.name, slices.Index(f.ids, id))})
			}
		}
	}
	top := len(queue) // the first top hops are t's own targets
	for n := 0; n < len(queue); n++ {
		id := queue[n].id
		if len(cmps) >= maxChainWalk {
			return nil, task.Invalid(origin[id], "the chains from %q reach more than %d tasks, more than the cycle check reads", t.ID, maxChainWalk)
		}
		next, ok, err := read(id)
		if err != nil {
			return nil, err
		}
		if !ok && n < top && !allowMissing {
			return nil, task.Invalid(queue[n].field,
				"task %q does not exist (put it first, or allow missing targets: ?allow_missing_targets=1, --allow-missing)", id)
		}
		for _, m := range next {
			if m == t.ID {
				return nil, cycleError(origin[id], append(path[id], t.ID))
			}
			if !seen[m] {
				seen[m] = true
				path[m], origin[m] = append(slices.Clone(path[id]), m), origin[id]
				queue = append(queue, hop{id: m})
			}
		}
	}
	return cmps, nil
}

func links(stored []byte) ([]string, error) {
	var l chainLinks
	if err := json.Unmarshal(stored, &l); err != nil {
		return nil, fmt.Errorf("stored task is corrupt: %w", err)
	}
	return append(l.OnSuccess, l.OnFailure...), nil
}

func cycleError(field string, cycle []string) error {
	q := make([]string, len(cycle))
	for i, id := range cycle {
		q[i] = fmt.Sprintf("%q", id)
	}
	return task.Invalid(field, "the chains would form a cycle: %s", strings.Join(q, " -> "))
}

// chainsChanged reports whether t's chains differ from those of the
// stored task: a put that keeps them (a pause, an edit of the schedule)
// needs no check.
func chainsChanged(t *task.Task, stored []byte) bool {
	var l chainLinks
	if json.Unmarshal(stored, &l) != nil {
		return true
	}
	return !slices.Equal(l.OnSuccess, t.OnSuccess) || !slices.Equal(l.OnFailure, t.OnFailure)
}
