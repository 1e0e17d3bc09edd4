package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/task"
)

// Backfills: /<prefix>/backfills/<partition>/<id> holds a task's latest
// backfill (task.Backfill) with its progress. The registry writes a new
// one; the task's owner runs it and records its progress there (package
// engine), so that a new owner continues after it. One backfill per task
// runs at a time; a finished or canceled one (CancelBackfill) stays until
// the next replaces it or the task is deleted.

// ErrBackfillRunning is returned when a task's backfill is asked for while
// another one of the task runs; the error Backfill returns is a
// *BackfillRunningError, which says how far that one is.
var ErrBackfillRunning = errors.New("registry: a backfill of the task is running")

// BackfillRunningError is ErrBackfillRunning (errors.Is) with the backfill
// that runs.
type BackfillRunningError struct {
	Running task.Backfill
}

// Error returns ErrBackfillRunning's message and the progress.
func (e *BackfillRunningError) Error() string {
	return ErrBackfillRunning.Error() + ": " + e.Progress()
}

// Unwrap returns ErrBackfillRunning.
func (e *BackfillRunningError) Unwrap() error { return ErrBackfillRunning }

// Progress says how far the running backfill is, for people: "3 of its 10
// fires done, through 2026-01-01T00:03:00Z".
func (e *BackfillRunningError) Progress() string {
	p := fmt.Sprintf("%d of its %d fires done", e.Running.Done, e.Running.Fires)
	if !e.Running.Through.IsZero() {
		p += ", through " + e.Running.Through.Format(time.RFC3339)
	}
	return p
}

// Backfill asks the task's owner to run every scheduled time of the task in
// [from, to], at most concurrency at a time (0: the default). It refuses
// (*task.ValidationError) a request out of task.BackfillTimes' limits, and
// returns ErrBackfillRunning while another backfill of the task runs.
func (r *Registry) Backfill(ctx context.Context, id string, from, to time.Time, concurrency int) (*task.Backfill, error) {
	t, err := r.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	now := r.now().UTC()
	times, err := task.BackfillTimes(t, from, to, now, concurrency)
	if err != nil {
		return nil, err
	}
	if concurrency == 0 {
		concurrency = task.DefaultBackfillConcurrency
	}
	key := r.keys.backfill(r.Partition(id), id)
	cur, err := r.cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("backfill task %q: %w", id, err)
	}
	var rev int64
	if len(cur.Kvs) > 0 {
		rev = cur.Kvs[0].ModRevision
		var old task.Backfill
		if json.Unmarshal(cur.Kvs[0].Value, &old) == nil && old.State == task.BackfillRunning {
			return nil, &BackfillRunningError{Running: old}
		}
	}
	b := &task.Backfill{From: from.UTC(), To: to.UTC(), Concurrency: concurrency, Fires: len(times),
		State: task.BackfillRunning, CreatedAt: now.Truncate(time.Millisecond)}
	val, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("backfill task %q: %w", id, err)
	}
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(r.key(id)), "=", t.Version),
			clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(clientv3.OpPut(key, string(val))).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("backfill task %q: %w", id, err)
	}
	if !resp.Succeeded {
		return nil, fmt.Errorf("backfill task %q: %w (it changed meanwhile; try again)", id, ErrVersionMismatch)
	}
	return b, nil
}

// ErrNoBackfillRunning is returned by CancelBackfill when the task has no
// backfill running; the error is a *NoBackfillRunningError, which holds
// the latest backfill, if any.
var ErrNoBackfillRunning = errors.New("registry: no backfill of the task is running")

// NoBackfillRunningError is ErrNoBackfillRunning (errors.Is) with the
// task's latest backfill, nil when it never had one.
type NoBackfillRunningError struct {
	Latest *task.Backfill
}

// Error returns ErrNoBackfillRunning's message and the latest backfill's
// state.
func (e *NoBackfillRunningError) Error() string {
	if e.Latest == nil {
		return ErrNoBackfillRunning.Error() + ": it has had none"
	}
	return ErrNoBackfillRunning.Error() + ": its latest is " + e.Latest.State
}

// Unwrap returns ErrNoBackfillRunning.
func (e *NoBackfillRunningError) Unwrap() error { return ErrNoBackfillRunning }

// CancelBackfill cancels the task's running backfill and returns its
// record, marked canceled, with the progress its owner last recorded. The
// owner stops it when its watch sees the record: fires it had started by
// then, at most the backfill's concurrency, run to their end. A progress
// write of the owner meanwhile is retried over.
func (r *Registry) CancelBackfill(ctx context.Context, id string) (*task.Backfill, error) {
	if err := task.CheckID(id); err != nil {
		return nil, err
	}
	key := r.keys.backfill(r.Partition(id), id)
	for {
		cur, err := r.cli.Get(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("cancel the backfill of %q: %w", id, err)
		}
		if len(cur.Kvs) == 0 {
			return nil, &NoBackfillRunningError{}
		}
		b, err := DecodeBackfill(cur.Kvs[0].Value)
		if err != nil {
			return nil, fmt.Errorf("cancel the backfill of %q: %w", id, err)
		}
		if b.State != task.BackfillRunning {
			return nil, &NoBackfillRunningError{Latest: b}
		}
		b.State = task.BackfillCanceled
		_, ok, _, err := r.RecordBackfill(ctx, id, b, cur.Kvs[0].ModRevision)
		if err != nil {
			return nil, err
		}
		if ok {
			return b, nil
		}
		// The owner recorded progress in between: read it again.
	}
}

// GetBackfill returns the task's latest backfill, nil when it has none.
func (r *Registry) GetBackfill(ctx context.Context, id string) (*task.Backfill, error) {
	if err := task.CheckID(id); err != nil {
		return nil, err
	}
	resp, err := r.cli.Get(ctx, r.keys.backfill(r.Partition(id), id))
	if err != nil {
		return nil, fmt.Errorf("get the backfill of %q: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	b, err := DecodeBackfill(resp.Kvs[0].Value)
	if err != nil {
		return nil, fmt.Errorf("the backfill of %q: %w", id, err)
	}
	return b, nil
}

// DecodeBackfill decodes a backfill record.
func DecodeBackfill(v []byte) (*task.Backfill, error) {
	var b task.Backfill
	if err := json.Unmarshal(v, &b); err != nil {
		return nil, fmt.Errorf("backfill record is corrupt: %w", err)
	}
	return &b, nil
}

// PartitionBackfills reads partition p's backfill records.
func (r *Registry) PartitionBackfills(ctx context.Context, p int) (*clientv3.GetResponse, error) {
	return r.cli.Get(ctx, r.keys.backfillPrefix(p), clientv3.WithPrefix())
}

// Backfills reads every partition's backfill records.
func (r *Registry) Backfills(ctx context.Context) (*clientv3.GetResponse, error) {
	return r.cli.Get(ctx, r.keys.backfills(), clientv3.WithPrefix())
}

// WatchBackfills watches every partition's backfill records, after
// revision after when it is positive, until ctx ends. Its first response
// says it was created: when after is 0, its header's revision is the one
// the watch follows from.
func (r *Registry) WatchBackfills(ctx context.Context, after int64) clientv3.WatchChan {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithProgressNotify(), clientv3.WithCreatedNotify()}
	if after > 0 {
		opts = append(opts, clientv3.WithRev(after+1))
	}
	return r.cli.Watch(clientv3.WithRequireLeader(ctx), r.keys.backfills(), opts...)
}

// ParseBackfill splits a backfill key into partition and task id.
func (r *Registry) ParseBackfill(key string) (p int, id string, ok bool) {
	return r.keys.parseBackfillKey(key)
}

// RecordBackfill writes the task's backfill record b if the stored one is
// still at revision rev, and returns the new revision. ok is false when it
// is not: cur is then the stored record (nil when there is none), which
// another backfill replaced or a cancel wrote, or a write of the caller's
// whose answer was lost, which etcd applied.
func (r *Registry) RecordBackfill(ctx context.Context, id string, b *task.Backfill, rev int64) (newRev int64, ok bool, cur *mvccpb.KeyValue, err error) {
	val, err := json.Marshal(b)
	if err != nil {
		return 0, false, nil, err
	}
	key := r.keys.backfill(r.Partition(id), id)
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(clientv3.OpPut(key, string(val))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return 0, false, nil, fmt.Errorf("record the backfill of %q: %w", id, err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			cur = kvs[0]
		}
	}
	return resp.Header.Revision, resp.Succeeded, cur, nil
}
