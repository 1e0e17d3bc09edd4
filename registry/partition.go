package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/shardcron/shardcron/task"
)

// readPage is how many keys one range request of ReadPartition reads.
const readPage = 1000

// The partition reads below are what a node that owns partitions needs:
// a whole partition at one revision, what changed since, and a watch. The
// ids they give are the task ids; the values are the stored task JSON,
// which DecodeFiring reads.

// Revision returns etcd's current revision, with one read of one key.
func (r *Registry) Revision(ctx context.Context) (int64, error) {
	resp, err := r.cli.Get(ctx, r.keys.cluster(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("read revision: %w", err)
	}
	return resp.Header.Revision, nil
}

// ReadPartition reads partition p's tasks at one revision, in pages, and
// gives each to fn in id order, with the revisions it was last written
// and created at.
// It returns the revision read.
func (r *Registry) ReadPartition(ctx context.Context, p int, fn func(id string, value []byte, modRev, createRev int64)) (int64, error) {
	prefix := r.keys.partition(p)
	end := clientv3.GetPrefixRangeEnd(prefix)
	var rev int64
	for from := prefix; ; {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(readPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := r.cli.Get(ctx, from, opts...)
		if err != nil {
			return 0, fmt.Errorf("read partition %d: %w", p, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			fn(string(kv.Key[len(prefix):]), kv.Value, kv.ModRevision, kv.CreateRevision)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// ChangesAt returns the tasks of partition p that changed after revision
// since, which a read that found the tasks of had was taken at, as of
// revision atRev: the last value of every task created or changed, and nil
// for every task deleted, whatever etcd compacted since; and the revision
// each task created or changed was created at. It reads every
// task of the partition (etcd filters them by revision), with a count
// that tells whether tasks were deleted; only then does it read the ids.
// A node uses it when the partition's watch cannot say that it caught up
// (WatchPartition).
func (r *Registry) ChangesAt(ctx context.Context, p int, had map[string]bool, since, atRev int64) (map[string][]byte, map[string]int64, error) {
	prefix := r.keys.partition(p)
	end := clientv3.GetPrefixRangeEnd(prefix)
	read, err := r.cli.Txn(ctx).Then(
		clientv3.OpGet(prefix, clientv3.WithRange(end), clientv3.WithMinModRev(since+1), clientv3.WithRev(atRev)),
		clientv3.OpGet(prefix, clientv3.WithRange(end), clientv3.WithCountOnly(), clientv3.WithRev(atRev)),
	).Commit()
	if err != nil {
		return nil, nil, fmt.Errorf("read partition %d's changes: %w", p, err)
	}
	touched := map[string][]byte{}
	created := map[string]int64{}
	added := 0
	for _, kv := range read.Responses[0].GetResponseRange().Kvs {
		id := string(kv.Key[len(prefix):])
		touched[id], created[id] = kv.Value, kv.CreateRevision
		if !had[id] {
			added++
		}
	}
	if count := read.Responses[1].GetResponseRange().Count; count != int64(len(had)+added) {
		keys, err := r.cli.Get(ctx, prefix, clientv3.WithRange(end), clientv3.WithRev(atRev), clientv3.WithKeysOnly())
		if err != nil {
			return nil, nil, fmt.Errorf("read partition %d's ids: %w", p, err)
		}
		present := make(map[string]bool, len(keys.Kvs))
		for _, kv := range keys.Kvs {
			present[string(kv.Key[len(prefix):])] = true
		}
		for id := range had {
			if !present[id] {
				touched[id] = nil
			}
		}
	}
	return touched, created, nil
}

// maxVersionsBack bounds the versions WrittenBy reads, one request each.
const maxVersionsBack = 16

// WrittenBy returns task id's value as it was last written at or before
// at (its updated_at), going back from its version at revision rev: what
// a node that owned its partition up to at knew of it. It returns nil
// when the task was created after at (deleted and put again counts as
// created), and an error matching ErrVersionGone when etcd compacted the
// versions on the way, or more than maxVersionsBack came after at.
func (r *Registry) WrittenBy(ctx context.Context, id string, rev int64, at time.Time) ([]byte, error) {
	for range maxVersionsBack {
		kv, err := r.versionAt(ctx, id, rev)
		if err != nil || kv == nil {
			return nil, err
		}
		var written struct {
			UpdatedAt time.Time `json:"updated_at"`
		}
		if err := json.Unmarshal(kv.Value, &written); err != nil {
			return nil, fmt.Errorf("task %q at revision %d: %w", id, kv.ModRevision, err)
		}
		switch {
		case !written.UpdatedAt.After(at):
			return kv.Value, nil
		case kv.Version == 1:
			return nil, nil
		}
		rev = kv.ModRevision - 1
	}
	return nil, fmt.Errorf("task %q: more than %d versions written after %v: %w", id, maxVersionsBack, at, ErrVersionGone)
}

// HeldAt returns task id's value as it was at revision held, from its
// version at revision rev: what a node that applied its partition's
// changes up to held had of it, whatever the writers' clocks stamped. It
// returns nil when the task was created after held (deleted and put again
// counts as created), and an error matching ErrVersionGone when etcd
// compacted held away. Two reads at most, whatever was written between:
// etcd keeps the version at a revision.
func (r *Registry) HeldAt(ctx context.Context, id string, rev, held int64) ([]byte, error) {
	kv, err := r.versionAt(ctx, id, rev)
	if err != nil || kv == nil || kv.CreateRevision > held {
		return nil, err
	}
	if kv.ModRevision > held {
		if kv, err = r.versionAt(ctx, id, held); err != nil || kv == nil {
			return nil, err
		}
	}
	return kv.Value, nil
}

// versionAt reads task id as it was at revision rev (nil: there was
// none), with an error matching ErrVersionGone once etcd compacted rev.
func (r *Registry) versionAt(ctx context.Context, id string, rev int64) (*mvccpb.KeyValue, error) {
	resp, err := r.cli.Get(ctx, r.key(id), clientv3.WithRev(rev))
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return nil, fmt.Errorf("read task %q at revision %d: %w", id, rev, ErrVersionGone)
	case err != nil:
		return nil, fmt.Errorf("read task %q at revision %d: %w", id, rev, err)
	case len(resp.Kvs) == 0:
		return nil, nil
	}
	return resp.Kvs[0], nil
}

// WatchPartition watches partition p's tasks after revision after, with
// progress notifications, until ctx ends. PartitionID names the task of an
// event.
func (r *Registry) WatchPartition(ctx context.Context, p int, after int64) clientv3.WatchChan {
	return r.cli.Watch(clientv3.WithRequireLeader(ctx), r.keys.partition(p), clientv3.WithPrefix(),
		clientv3.WithRev(after+1), clientv3.WithProgressNotify())
}

// CatchUpStreams is how many gRPC streams the watches of CatchUp share:
// partition p's goes on stream p % CatchUpStreams.
//
// Few, because a stream costs etcd a login when the client authenticates
// with a password: clientv3 calls Authenticate (a bcrypt on etcd, tens of
// milliseconds of CPU, about half a second under -race) for every stream
// it opens. A stream per catch-up made a join of hundreds of partitions
// hundreds of logins, which etcd queued ahead of the node's own
// keep-alive: the node fenced itself after every join. More than one,
// because etcd answers a progress request only once every watch of the
// stream has caught up with its history, and a watch opened from an
// earlier revision has not until etcd's next resync, up to 100 ms later:
// at a restart, acquires open their catch-up watches one after another,
// and each watch delays the answer to the others of its stream only.
const CatchUpStreams = 4

// CatchUp watches partition p's tasks after revision after, as
// WatchPartition does but on one of the CatchUpStreams gRPC streams kept
// for catch-ups, until ctx ends. It returns the watch and progress, which
// asks etcd for a progress notification on that stream: the revision up
// to which every watch of the stream delivered every event. etcd answers
// only once each has caught up with its history, and drops the request
// before: ask again. A stream lives while it has a watch: call progress
// only while this one is open, or it would open an empty stream.
func (r *Registry) CatchUp(ctx context.Context, p int, after int64) (wch clientv3.WatchChan, progress func() error) {
	// The client keys its streams by the context's metadata.
	sctx := clientv3.WithRequireLeader(metadata.AppendToOutgoingContext(ctx,
		"shardcron-catch-up", strconv.Itoa(p%CatchUpStreams)))
	wch = r.cli.Watch(sctx, r.keys.partition(p), clientv3.WithPrefix(), clientv3.WithRev(after+1))
	return wch, func() error {
		if err := r.cli.RequestProgress(sctx); err != nil {
			return fmt.Errorf("request the progress of partition %d's watch: %w", p, err)
		}
		return nil
	}
}

// PartitionID returns the task id of a key of partition p, as
// WatchPartition's events carry.
func (r *Registry) PartitionID(p int, key []byte) string {
	// Every partition's prefix is as long: "<prefix>/tasks/ppppp/".
	return string(key[len(r.keys.prefix)+len("/tasks/00000/"):])
}

// TriggerRead is the read of partition p's pending triggers, as an
// operation; ParseTrigger reads its keys and DecodeTriggerValue the
// overrides their values carry.
func (r *Registry) TriggerRead(p int) clientv3.Op {
	return clientv3.OpGet(r.keys.triggerPrefix(p), clientv3.WithPrefix())
}

// TriggerPut is a put of a trigger key: partition Part's trigger of task
// ID at unix millisecond At, put at revision Rev (its ModRevision).
type TriggerPut struct {
	Part    int
	ID      string
	At, Rev int64
}

// DeleteTriggers deletes the keys of puts (at most MaxTxnOps), each only
// while it still holds that put: a key put again since is another
// trigger, or one its owner has yet to take, and stays for whoever owns
// its partition then. One transaction compares each key's revision and
// deletes them all, etcd bounding its compares and its operations apart
// (MaxTxnOps each); should one have changed, it deletes none, the keys
// are read, and those still at their put are deleted the same way. The
// read is a transaction of its own, not the first's else, which every
// transaction would carry for a read rarely needed
// (BenchmarkBulkTriggerDeletes).
func (r *Registry) DeleteTriggers(ctx context.Context, puts []TriggerPut) error {
	for len(puts) > 0 {
		keys := make([]string, len(puts))
		cmps := make([]clientv3.Cmp, len(puts))
		dels := make([]clientv3.Op, len(puts))
		for i, t := range puts {
			keys[i] = r.keys.trigger(t.Part, t.ID, t.At)
			cmps[i] = clientv3.Compare(clientv3.ModRevision(keys[i]), "=", t.Rev)
			dels[i] = clientv3.OpDelete(keys[i])
		}
		resp, err := r.cli.Txn(ctx).If(cmps...).Then(dels...).Commit()
		if err != nil {
			return fmt.Errorf("delete %d trigger keys: %w", len(puts), err)
		}
		if resp.Succeeded {
			return nil
		}
		reads := make([]clientv3.Op, len(keys))
		for i, key := range keys {
			reads[i] = clientv3.OpGet(key, clientv3.WithKeysOnly())
		}
		if resp, err = r.cli.Txn(ctx).Then(reads...).Commit(); err != nil {
			return fmt.Errorf("read %d trigger keys to delete: %w", len(puts), err)
		}
		// Each round drops a key at least: a revision only grows.
		var still []TriggerPut
		for i, t := range puts {
			kvs := resp.Responses[i].GetResponseRange().Kvs
			if len(kvs) > 0 && kvs[0].ModRevision == t.Rev {
				still = append(still, t)
			}
		}
		puts = still
	}
	return nil
}

// Created reads the revision at which each task of ids (at most
// MaxTxnOps) was created, 0 for one that does not exist, in one
// transaction, and returns the revision read. A trigger key written
// before its task's creation revision belongs to a task of the same id
// deleted since: every trigger's transaction checks that its task exists.
func (r *Registry) Created(ctx context.Context, ids []string) (map[string]int64, int64, error) {
	ops := make([]clientv3.Op, len(ids))
	for i, id := range ids {
		ops[i] = clientv3.OpGet(r.key(id), clientv3.WithKeysOnly())
	}
	resp, err := r.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("read the creation of %d tasks: %w", len(ids), err)
	}
	created := make(map[string]int64, len(ids))
	for i, id := range ids {
		created[id] = 0
		if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
			created[id] = kvs[0].CreateRevision
		}
	}
	return created, resp.Header.Revision, nil
}

// WatchTriggers watches every partition's trigger puts (not deletes),
// after revision after when it is positive, with progress notifications,
// until ctx ends. Its first response says it was created: when after is 0,
// its header's revision is the one the watch follows from.
func (r *Registry) WatchTriggers(ctx context.Context, after int64) clientv3.WatchChan {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithProgressNotify(), clientv3.WithCreatedNotify()}
	if after > 0 {
		opts = append(opts, clientv3.WithRev(after+1))
	}
	return r.cli.Watch(clientv3.WithRequireLeader(ctx), r.keys.triggers(), opts...)
}

// PendingTriggers reads every partition's pending triggers.
func (r *Registry) PendingTriggers(ctx context.Context) (*clientv3.GetResponse, error) {
	return r.cli.Get(ctx, r.keys.triggers(), clientv3.WithPrefix())
}

// PendingTriggerCount counts every partition's pending triggers without
// reading them (a count-only get): what a fleet-wide trigger leaves in
// etcd until the owners have deleted the keys of the fires that started.
func (r *Registry) PendingTriggerCount(ctx context.Context) (int64, error) {
	resp, err := r.cli.Get(ctx, r.keys.triggers(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("count pending triggers: %w", err)
	}
	return resp.Count, nil
}

// ParseTrigger splits a trigger key into partition, time (Unix
// milliseconds) and task id.
func (r *Registry) ParseTrigger(key string) (p int, at int64, id string, ok bool) {
	return r.keys.parseTriggerKey(key)
}

// firing is the part of a stored task a node needs to fire it: decoding
// only these fields skips the labels and times, which loading a partition
// would otherwise allocate for every task.
type firing struct {
	Schedule      string                 `json:"schedule"`
	Timezone      string                 `json:"timezone"`
	Executor      task.Executor          `json:"executor"`
	Timeout       task.Duration          `json:"timeout"`
	Retry         task.Retry             `json:"retry"`
	Misfire       task.MisfirePolicy     `json:"misfire"`
	CatchupWindow task.Duration          `json:"catchup_window"`
	Concurrency   task.ConcurrencyPolicy `json:"concurrency"`
	Jitter        task.Duration          `json:"jitter"`
	Paused        bool                   `json:"paused"`
	HistoryLimit  *task.HistoryLimit     `json:"history_limit"`
	// Alerts and capture (issue 9).
	Notify         *task.Notify  `json:"notify"`
	PauseOnFailure int           `json:"pause_on_failure"`
	Capture        *task.Capture `json:"capture"`
	// Chains (issue 12).
	OnSuccess []string `json:"on_success"`
	OnFailure []string `json:"on_failure"`

	// The window (task.Window): max_fires counts from created_at without
	// not_before.
	NotBefore       time.Time `json:"not_before"`
	NotAfter        time.Time `json:"not_after"`
	MaxFires        int       `json:"max_fires"`
	DeleteAfterFire bool      `json:"delete_after_fire"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"` // delete_after_fire: an edit since keeps the task
}

// DecodeFiring decodes a stored task (a value of ReadPartition, Changes or
// WatchPartition) with only the fields a fire needs: the labels and the
// output-only fields but the times stay zero. The stored task was validated when written.
func DecodeFiring(id string, value []byte) (task.Task, error) {
	var f firing
	if err := task.DecodeStored(value, &f); err != nil {
		return task.Task{}, fmt.Errorf("stored task %q is corrupt: %w", id, err)
	}
	return task.Task{ID: id, Schedule: f.Schedule, Timezone: f.Timezone, Executor: f.Executor, Timeout: f.Timeout,
		Retry: f.Retry, Misfire: f.Misfire, CatchupWindow: f.CatchupWindow, Concurrency: f.Concurrency,
		Jitter: f.Jitter, Paused: f.Paused, HistoryLimit: f.HistoryLimit,
		Notify: f.Notify, PauseOnFailure: f.PauseOnFailure, Capture: f.Capture,
		OnSuccess: f.OnSuccess, OnFailure: f.OnFailure,
		NotBefore: f.NotBefore, NotAfter: f.NotAfter, MaxFires: f.MaxFires, DeleteAfterFire: f.DeleteAfterFire,
		CreatedAt: f.CreatedAt, UpdatedAt: f.UpdatedAt}, nil
}
