package registry

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/shardcron/shardcron/task"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// bulkItem is one matched task on its way to a transaction.
type bulkItem struct {
	key string
	kv  *mvccpb.KeyValue
	val []byte // the new value of a pause or resume
}

// Bulk applies action to every task sel chooses, read at one etcd revision
// (through the index for a prefix or labels, see each), writing them in
// transactions of at most 128 operations and 1 MiB. Each write compares
// the task's version with the one read, so a task changed in between is
// read again and acted on only if it still matches (a trigger by prefix
// or of all tasks, which no change can move out of the selection,
// compares only that the task still exists). The tasks are not changed
// atomically as a whole: a failure or ctx ending midway returns what was
// done so far with the error, and running the same action again finishes
// the job (actions are idempotent; a trigger fires again). A pause goes
// through BulkPause, which names who pauses.
func (r *Registry) Bulk(ctx context.Context, action task.BulkAction, sel task.Selector) (task.BulkResult, error) {
	if action == task.BulkPause {
		return task.BulkResult{Action: action, DryRun: sel.DryRun, Sample: []string{}},
			errors.New("registry: a bulk pause writes who paused each task: use BulkPause")
	}
	return r.bulk(ctx, action, sel, nil)
}

// BulkPause pauses every task sel chooses, as Bulk does, each with the
// pause record {sel.Note, by, the action's time}, which the task and its
// state show until it is resumed, as after Pause. A task paused already is
// left as it is, its record included.
func (r *Registry) BulkPause(ctx context.Context, sel task.Selector, by string) (task.BulkResult, error) {
	p, err := r.pauseRecord(task.Pause{Note: sel.Note, By: by})
	if err != nil {
		return task.BulkResult{Action: task.BulkPause, DryRun: sel.DryRun, Sample: []string{}}, err
	}
	return r.bulk(ctx, task.BulkPause, sel, p)
}

// bulk is Bulk, with the pause record p of a pause.
func (r *Registry) bulk(ctx context.Context, action task.BulkAction, sel task.Selector, p *task.Pause) (task.BulkResult, error) {
	res := task.BulkResult{Action: action, DryRun: sel.DryRun, Sample: []string{}}
	if _, err := task.ParseBulkAction(string(action)); err != nil {
		return res, err
	}
	if err := sel.Validate(); err != nil {
		return res, err
	}
	if sel.Note != "" && action != task.BulkPause {
		return res, task.Invalid("note", "only a pause takes a note, not a %s", action)
	}
	var batch []bulkItem
	size := 0
	flush := func() error {
		err := r.bulkCommit(ctx, action, sel, p, batch, &res)
		batch, size = batch[:0], 0
		return err
	}
	rev, built, err := r.readRevision(ctx)
	if err != nil {
		return res, fmt.Errorf("bulk %s: %w", action, err)
	}
	var fnErr error // an error of the action, not of the read
	err = r.each(ctx, query{prefix: sel.Prefix, labels: sel.Labels}, rev, built, func(kv *mvccpb.KeyValue, _ string) error {
		it, change, ok, err := r.bulkMatch(action, sel, p, kv)
		if err != nil {
			fnErr = fmt.Errorf("bulk %s: %w", action, err)
			return fnErr
		}
		if !ok {
			return nil
		}
		res.Matched++
		if len(res.Sample) < task.BulkSampleSize {
			_, id, _ := r.keys.parseTaskKey(it.key)
			res.Sample = append(res.Sample, id)
		}
		if !change {
			res.Unchanged++
			return nil
		}
		if sel.DryRun {
			res.Changed++
			return nil
		}
		if n := len(it.key) + len(it.val); len(batch) == MaxTxnOps || size+n > MaxTxnBytes && len(batch) > 0 {
			if fnErr = flush(); fnErr != nil {
				return fnErr
			}
		}
		batch = append(batch, it)
		size += len(it.key) + len(it.val)
		return nil
	})
	if err != nil {
		if fnErr == nil {
			err = fmt.Errorf("bulk %s: read tasks at revision %d: %w", action, rev, err)
		}
		return res, err
	}
	if len(batch) > 0 {
		if err := flush(); err != nil {
			return res, err
		}
	}
	return res, nil
}

// bulkMatch decides what action does to the stored task kv: ok when sel
// chooses it, change when the action would change it (with the new value
// of a pause, with its record p, or of a resume in it.val).
func (r *Registry) bulkMatch(action task.BulkAction, sel task.Selector, p *task.Pause, kv *mvccpb.KeyValue) (it bulkItem, change, ok bool, err error) {
	key := string(kv.Key)
	_, id, valid := r.keys.parseTaskKey(key)
	if !valid || !strings.HasPrefix(id, sel.Prefix) {
		return it, false, false, nil
	}
	it = bulkItem{key: key, kv: kv}
	if len(sel.Labels) == 0 && (action == task.BulkDelete || action == task.BulkTrigger) {
		return it, true, true, nil // no need to decode
	}
	t, err := r.decode(kv)
	if err != nil {
		return it, false, false, err
	}
	if !hasLabels(t.Labels, sel.Labels) {
		return it, false, false, nil
	}
	switch action {
	case task.BulkPause, task.BulkResume:
		want := action == task.BulkPause
		if t.Paused == want {
			return it, false, true, nil
		}
		t.Paused, t.Pause = want, p
		val, _, err := r.encode(t, kv)
		if err != nil {
			return it, false, false, err
		}
		it.val = val
	}
	return it, true, true, nil
}

// bulkCommit writes one transaction of items, each under a compare of the
// version read. When another writer changed one of them in between, the
// transaction changes nothing and the items are done one at a time.
func (r *Registry) bulkCommit(ctx context.Context, action task.BulkAction, sel task.Selector, p *task.Pause, items []bulkItem, res *task.BulkResult) error {
	if len(items) == 0 {
		return nil
	}
	var at int64
	if action == task.BulkTrigger {
		// A time of its own, so that this action and another trigger of a
		// task in one millisecond are two fires (triggerTimes).
		at = r.triggers.nextBulk(r.now())
	}
	// A delete takes the task's index keys with it, and a trigger has two
	// compares: items are grouped so that a transaction holds at most
	// MaxTxnOps operations and as many compares.
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	var group []bulkItem
	commit := func() error {
		if len(group) == 0 {
			return nil
		}
		resp, err := r.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("bulk %s: write %d tasks: %w", action, len(group), err)
		}
		if resp.Succeeded {
			res.Changed += len(group)
		} else {
			for _, it := range group {
				if err := r.bulkOne(ctx, action, sel, p, it, res); err != nil {
					return err
				}
			}
		}
		cmps, ops, group = nil, nil, nil
		return nil
	}
	for _, it := range items {
		itCmps, itOps := r.bulkOp(action, it, at, len(sel.Labels) > 0)
		if max(len(cmps)+len(itCmps), len(ops)+len(itOps)) > MaxTxnOps {
			if err := commit(); err != nil {
				return err
			}
		}
		cmps, ops, group = append(cmps, itCmps...), append(ops, itOps...), append(group, it)
	}
	return commit()
}

// bulkOp is the compares and the write of one item. A trigger does not
// change the task: it needs no trigger of it at that time pending
// (another process's, in the same millisecond), and the task to exist,
// or, when byLabels (a selection by labels, which another writer may
// change), to be still the version read: a task that left the selection
// since is read again and skipped (bulkOne), as a pause skips it.
func (r *Registry) bulkOp(action task.BulkAction, it bulkItem, at int64, byLabels bool) ([]clientv3.Cmp, []clientv3.Op) {
	p, id, _ := r.keys.parseTaskKey(it.key)
	switch action {
	case task.BulkDelete:
		w := r.remove(id, it.kv) // the task and its index keys
		return []clientv3.Cmp{w.cmp()}, w.ops
	case task.BulkTrigger:
		key := r.keys.trigger(p, id, at)
		exists := clientv3.Compare(clientv3.CreateRevision(it.key), ">", 0)
		if byLabels {
			exists = clientv3.Compare(clientv3.ModRevision(it.key), "=", it.kv.ModRevision)
		}
		return []clientv3.Cmp{exists, clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(key, "")}
	default: // pause and resume change no label: the index stays as it is
		return []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(it.key), "=", it.kv.ModRevision)},
			[]clientv3.Op{clientv3.OpPut(it.key, string(it.val))}
	}
}

// bulkTriggerOne triggers the task of key at a time of its own, as
// TriggerWith does: the action's time may have a trigger of the task
// pending.
func (r *Registry) bulkTriggerOne(ctx context.Context, key string, res *task.BulkResult) error {
	_, id, _ := r.keys.parseTaskKey(key)
	_, err := r.TriggerWith(ctx, id, nil)
	switch {
	case errors.Is(err, ErrNotFound):
		res.Skipped++ // deleted in between
	case err != nil:
		return fmt.Errorf("bulk %s: %w", task.BulkTrigger, err)
	default:
		res.Changed++
	}
	return nil
}

// bulkOne reads one task again and acts on it if it still matches, up to
// casRetries times under contention.
func (r *Registry) bulkOne(ctx context.Context, action task.BulkAction, sel task.Selector, p *task.Pause, it bulkItem, res *task.BulkResult) error {
	for range casRetries {
		cur, err := r.cli.Get(ctx, it.key)
		if err != nil {
			return fmt.Errorf("bulk %s: read %s: %w", action, it.key, err)
		}
		if len(cur.Kvs) == 0 {
			res.Skipped++ // deleted in between
			return nil
		}
		next, change, ok, err := r.bulkMatch(action, sel, p, cur.Kvs[0])
		if err != nil {
			return fmt.Errorf("bulk %s: %w", action, err)
		}
		if !ok {
			res.Skipped++
			return nil
		}
		if !change {
			res.Unchanged++
			return nil
		}
		if action == task.BulkTrigger {
			return r.bulkTriggerOne(ctx, it.key, res)
		}
		cmps, ops := r.bulkOp(action, next, 0, false) // not a trigger's: bulkTriggerOne above
		tr, err := r.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("bulk %s: write %s: %w", action, it.key, err)
		}
		if tr.Succeeded {
			res.Changed++
			return nil
		}
	}
	return fmt.Errorf("bulk %s: %s: %w, run the action again", action, it.key, ErrContention)
}
