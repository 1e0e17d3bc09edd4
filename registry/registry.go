package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/shardcron/shardcron/ring"
	"github.com/shardcron/shardcron/task"
)

// Registry errors.
var (
	ErrNotFound           = errors.New("registry: task not found")
	ErrVersionMismatch    = errors.New("registry: task version does not match")
	ErrPartitionsMismatch = errors.New("registry: partition count differs from the cluster's")
	ErrRingMismatch       = errors.New("registry: ring settings differ from the cluster's")

	// ErrContention is matched by the error of a write that lost to other
	// writers of the same keys as many times as it tries: it changed
	// nothing, and a retry is the remedy.
	ErrContention = errors.New("registry: too much contention")

	// ErrVersionGone is matched by the error of WrittenBy and HeldAt when
	// etcd no longer holds the version asked for: it compacted it, or (for
	// WrittenBy) more than maxVersionsBack writes came after it.
	ErrVersionGone = errors.New("registry: the task's version asked for is no longer in etcd's history")

	// ErrNoSpace is matched (errors.Is) by the error of a write etcd
	// refused because its space quota is exhausted (its NOSPACE alarm is
	// raised). etcd then refuses every write, in every member, until an
	// operator frees space (compact, defragment) and disarms the alarm;
	// reads, watches and lease keep-alives go on. It is etcd's own error
	// value, so an error from any etcd call matches it.
	ErrNoSpace error = rpctypes.ErrNoSpace
)

// etcd's request limits (docs/design.md): a transaction holds at most 128
// operations and a request at most 1.5 MiB; batches stay well inside both,
// and so do the engine's checkpoint and watermark transactions.
const (
	MaxTxnOps   = 128     // operations in one transaction
	MaxTxnBytes = 1 << 20 // bytes of one transaction's operations
)

// MaxBatchItems is the most items one PutItems takes.
const MaxBatchItems = 10000

const (
	listPageSize = 500
	casRetries   = 5 // attempts of a read-modify-write under contention
)

// Registry is the authoritative store of task definitions: etcd keys
// /<prefix>/tasks/<partition>/<id>. Every method validates its input before
// it writes, so a refused request leaves etcd (and its revision) untouched.
// A Registry is safe for concurrent use and needs no running Engine.
type Registry struct {
	cli        *clientv3.Client
	indexCli   *clientv3.Client // index range streams (WithIndexClient); cli by default
	keys       keys
	partitions int
	now        func() time.Time
	triggers   triggerTimes
	origin     []byte   // the cluster and prefix, as Origin names them
	opened     int64    // etcd's revision when OpenRegistry read the cluster record
	ringSet    *Cluster // the ring's settings to check (WithRing), or nil
	// noIndex makes writes leave the index alone, as writers did before it
	// existed. Tests set it to build such clusters, and to measure what the
	// index costs.
	noIndex bool
}

// Cluster is the record /<prefix>/cluster, written when the cluster is
// created: the settings every node must share.
type Cluster struct {
	Partitions int `json:"partitions"`
	// Replication and Load are the ring's settings (ring.Config): nodes
	// with others would each compute a ring of their own and leave
	// partitions without an owner. A record written before they were kept
	// has neither; the first node that opens it WithRing adds its own.
	Replication int       `json:"replication,omitempty"`
	Load        float64   `json:"load,omitempty"`
	Created     time.Time `json:"created"`
}

// An Option configures OpenRegistry.
type Option func(*Registry)

// WithIndexClient makes the registry read its index ranges (the ids of
// list pages and of filtered exports) through cli, a client dialled with
// IndexDialOptions, and everything else through the client OpenRegistry
// is given. cli must outlive the registry.
func WithIndexClient(cli *clientv3.Client) Option {
	return func(r *Registry) { r.indexCli = cli }
}

// WithRing makes OpenRegistry check the ring's settings against the
// cluster's, as it checks the partition count: a node's ring must be every
// other node's.
func WithRing(replication int, load float64) Option {
	return func(r *Registry) { r.ringSet = &Cluster{Replication: replication, Load: load} }
}

// IndexDialOptions are the gRPC dial options of the client WithIndexClient
// takes: a fixed flow-control window of 64 KiB a stream. etcd sends an
// index range as a stream of chunks that double in size, computing each as
// soon as the one before is sent, and a page cancels its stream once it
// holds its ids. On a connection whose window gRPC has grown (it does with
// every bulk read), etcd runs ahead of a slow reader by several chunks,
// all of them read for nothing: about as much etcd CPU as the page's 1000
// task reads, and a quarter of a page's allocations in etcd (BENCHMARKS.md,
// issue 14's fifth pass). With 64 KiB it stops about one chunk ahead. Bulk
// reads (whole-fleet exports, partition loads) stay on the main client,
// whose window grows.
func IndexDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(indexStreamWindow)}
}

// indexStreamWindow is gRPC's smallest stream window.
const indexStreamWindow = 64 << 10

// OpenRegistry returns the registry under prefix, creating the cluster record
// with the given partition count (and ring, WithRing) if there is none. If
// the cluster exists with another partition count it returns an error
// wrapping ErrPartitionsMismatch, with another ring one wrapping
// ErrRingMismatch: both are fixed for the life of a cluster.
func OpenRegistry(ctx context.Context, cli *clientv3.Client, prefix string, partitions int, opts ...Option) (*Registry, error) {
	if partitions < 1 || partitions > ring.MaxPartitions {
		return nil, fmt.Errorf("registry: partitions must be between 1 and %d, got %d", ring.MaxPartitions, partitions)
	}
	r := &Registry{cli: cli, indexCli: cli, keys: newKeys(prefix), partitions: partitions, now: time.Now}
	for _, o := range opts {
		o(r)
	}
	c := Cluster{Partitions: partitions, Created: r.now().UTC()}
	if r.ringSet != nil {
		c.Replication, c.Load = r.ringSet.Replication, r.ringSet.Load
	}
	rec, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	key := r.keys.cluster()
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		// A new cluster is indexed from its first task on.
		Then(clientv3.OpPut(key, string(rec)), clientv3.OpPut(r.keys.indexBuilt(), string(r.indexMarker()))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("registry: read cluster record %s: %w", key, err)
	}
	r.opened = resp.Header.Revision
	if resp.Succeeded {
		r.origin = origin(key, resp.Header.Revision, c.Created)
		return r, nil
	}
	for range casRetries {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		var have Cluster
		if len(kvs) == 0 || json.Unmarshal(kvs[0].Value, &have) != nil || have.Partitions < 1 {
			return nil, fmt.Errorf("registry: cluster record %s is unreadable: %q", key, firstValue(kvs))
		}
		if have.Partitions != partitions {
			return nil, fmt.Errorf("%w: the cluster under %s has %d partitions, this node was started with %d (partitions are fixed when a cluster is created)",
				ErrPartitionsMismatch, r.keys.prefix, have.Partitions, partitions)
		}
		r.origin = origin(key, kvs[0].CreateRevision, have.Created)
		want := r.ringSet
		switch {
		case want == nil:
			return r, nil
		case have.Replication != 0:
			if have.Replication != want.Replication || have.Load != want.Load {
				return nil, fmt.Errorf("%w: the cluster under %s has --replication %d and --load %g, this node was started with %d and %g (the ring's settings are fixed when a cluster is created: every node must compute the same ring)",
					ErrRingMismatch, r.keys.prefix, have.Replication, have.Load, want.Replication, want.Load)
			}
			return r, nil
		}
		// A record from before the ring was kept: this node's settings
		// become the cluster's, unless another node's got there first.
		have.Replication, have.Load = want.Replication, want.Load
		if rec, err = json.Marshal(have); err != nil {
			return nil, err
		}
		resp, err = cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", kvs[0].ModRevision)).
			Then(clientv3.OpPut(key, string(rec))).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return nil, fmt.Errorf("registry: record the ring's settings in %s: %w", key, err)
		}
		if resp.Succeeded {
			return r, nil
		}
	}
	return nil, fmt.Errorf("registry: record the ring's settings in %s: %w", key, ErrContention)
}

// OpenRevision is etcd's revision when OpenRegistry read the cluster
// record. Every read through the registry comes after it, so a watch that
// follows from it misses no change made after any of them, as one created
// later might.
func (r *Registry) OpenRevision() int64 { return r.opened }

func firstValue(kvs []*mvccpb.KeyValue) []byte {
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0].Value
}

// origin names the cluster under a prefix by its cluster record: its key
// (the prefix), the revision that created it and the time of its
// creation, to the nanosecond; not the settings a later node may add.
// etcd's own cluster id would not do: every embedded etcd started with
// the same settings has the same one.
func origin(key string, createRev int64, created time.Time) []byte {
	return fmt.Appendf(nil, "%s\n%d\n%s", key, createRev, created.Format(time.RFC3339Nano))
}

// Origin names the tasks this registry holds: the etcd cluster and prefix,
// as their cluster record identifies them. Another origin's revisions are
// another history, so a node's cache of partitions read from one is of no
// use with another, even one whose revision is further on.
func (r *Registry) Origin() []byte { return r.origin }

// Partitions returns the cluster's partition count.
func (r *Registry) Partitions() int { return r.partitions }

// Partition returns the partition of a task id.
func (r *Registry) Partition(id string) int { return ring.Partition(id, r.partitions) }

func (r *Registry) key(id string) string { return r.keys.task(r.Partition(id), id) }

// Get returns the task with the given id, or ErrNotFound.
func (r *Registry) Get(ctx context.Context, id string) (*task.Task, error) {
	if err := task.CheckID(id); err != nil {
		return nil, err
	}
	resp, err := r.cli.Get(ctx, r.key(id))
	if err != nil {
		return nil, fmt.Errorf("get task %q: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, ErrNotFound
	}
	return r.decode(resp.Kvs[0])
}

// PutOptions qualify Put.
type PutOptions struct {
	// IfVersion, when not zero, makes Put write only if the stored task's
	// version (its etcd mod revision) is exactly this one; otherwise it
	// returns ErrVersionMismatch.
	IfVersion int64
	// AllowMissingTargets lets on_success and on_failure name tasks that
	// do not exist (yet); their fires' triggers then find nothing.
	AllowMissingTargets bool
}

// Put validates t and creates or replaces it. A put that changes nothing
// writes nothing and returns the stored version. It returns the task as
// stored, with its partition, version and times.
func (r *Registry) Put(ctx context.Context, t *task.Task, opts PutOptions) (*task.Task, error) {
	stored, _, err := r.put(ctx, t, opts)
	return stored, err
}

// put is Put, saying whether the task was identical to what is stored and
// left alone.
func (r *Registry) put(ctx context.Context, t *task.Task, opts PutOptions) (stored *task.Task, same bool, err error) {
	if err := t.Validate(); err != nil {
		return nil, false, err
	}
	key := r.key(t.ID)
	for range casRetries {
		cur, err := r.cli.Get(ctx, key)
		if err != nil {
			return nil, false, fmt.Errorf("put task %q: %w", t.ID, err)
		}
		var old *mvccpb.KeyValue
		if len(cur.Kvs) > 0 {
			old = cur.Kvs[0]
		}
		// Encode first: a task too large as stored is invalid input (400),
		// whatever its version.
		val, same, err := r.encode(t, old)
		if err != nil {
			return nil, false, err
		}
		if opts.IfVersion != 0 && (old == nil || old.ModRevision != opts.IfVersion) {
			return nil, false, ErrVersionMismatch
		}
		if same {
			stored, err := r.decode(old)
			return stored, true, err
		}
		var chains []clientv3.Cmp
		if old == nil || chainsChanged(t, old.Value) {
			if chains, err = r.checkChains(ctx, t, opts.AllowMissingTargets); err != nil {
				return nil, false, err
			}
		}
		w := r.write(t.ID, old, val, t.Labels)
		w.extra = chains
		rev, ok, err := r.commit(ctx, w)
		if err != nil {
			return nil, false, fmt.Errorf("put task %q: %w", t.ID, err)
		}
		if ok {
			stored, err := r.decode(&mvccpb.KeyValue{Key: []byte(key), Value: val,
				ModRevision: rev, CreateRevision: createRev(old, rev)})
			return stored, false, err
		}
		if opts.IfVersion != 0 {
			return nil, false, ErrVersionMismatch
		}
	}
	return nil, false, fmt.Errorf("put task %q: %w, try again", t.ID, ErrContention)
}

// Check is Put without the write (a dry run): it validates t, checks its
// size as stored and opts.IfVersion, and returns the task as Put would
// store it, with the stored version (0 for a task that does not exist).
func (r *Registry) Check(ctx context.Context, t *task.Task, opts PutOptions) (*task.Task, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	key := r.key(t.ID)
	cur, err := r.cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("check task %q: %w", t.ID, err)
	}
	var old *mvccpb.KeyValue
	if len(cur.Kvs) > 0 {
		old = cur.Kvs[0]
	}
	val, _, err := r.encode(t, old)
	if err != nil {
		return nil, err
	}
	if opts.IfVersion != 0 && (old == nil || old.ModRevision != opts.IfVersion) {
		return nil, ErrVersionMismatch
	}
	if old == nil || chainsChanged(t, old.Value) {
		if _, err := r.checkChains(ctx, t, opts.AllowMissingTargets); err != nil {
			return nil, err
		}
	}
	kv := &mvccpb.KeyValue{Key: []byte(key), Value: val}
	if old != nil {
		kv.ModRevision = old.ModRevision
	}
	return r.decode(kv)
}

func createRev(old *mvccpb.KeyValue, rev int64) int64 {
	if old != nil {
		return old.CreateRevision
	}
	return rev
}

// Delete removes the task, or returns ErrNotFound.
func (r *Registry) Delete(ctx context.Context, id string) error {
	if err := task.CheckID(id); err != nil {
		return err
	}
	key := r.key(id)
	for range casRetries {
		resp, err := r.cli.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("delete task %q: %w", id, err)
		}
		if len(resp.Kvs) == 0 {
			return ErrNotFound
		}
		_, ok, err := r.commit(ctx, r.remove(id, resp.Kvs[0]))
		if err != nil {
			return fmt.Errorf("delete task %q: %w", id, err)
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("delete task %q: %w, try again", id, ErrContention)
}

// DeleteIfVersion removes the task only if its version (etcd mod
// revision) is still version: ErrVersionMismatch when it changed, so that
// a concurrent edit wins; ErrNotFound when it is gone. The owner deletes a
// delete_after_fire task so once it ended, and the API a DELETE with
// If-Match.
func (r *Registry) DeleteIfVersion(ctx context.Context, id string, version int64) error {
	if err := task.CheckID(id); err != nil {
		return err
	}
	resp, err := r.cli.Get(ctx, r.key(id))
	if err != nil {
		return fmt.Errorf("delete task %q: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return ErrNotFound
	}
	if resp.Kvs[0].ModRevision != version {
		return ErrVersionMismatch
	}
	_, ok, err := r.commit(ctx, r.remove(id, resp.Kvs[0]))
	if err != nil {
		return fmt.Errorf("delete task %q: %w", id, err)
	}
	if !ok {
		return ErrVersionMismatch
	}
	return nil
}

// SetPaused sets the task's paused flag, and returns the task as stored.
func (r *Registry) SetPaused(ctx context.Context, id string, paused bool) (*task.Task, error) {
	t, _, err := r.setPaused(ctx, id, paused, nil, false)
	return t, err
}

// Pause pauses the task with a pause record (who, when, a note), which
// the task and its state show until it is resumed. Pausing a paused task
// replaces its record.
func (r *Registry) Pause(ctx context.Context, id string, p task.Pause) (*task.Task, error) {
	t, _, err := r.pause(ctx, id, p, false)
	return t, err
}

// PauseUnlessPaused pauses the task as Pause does, unless it is paused
// already: then it changes nothing, the pause record included, and
// reports false. The owner's pause_on_failure pauses so: an operator's
// pause, note and all, stays.
func (r *Registry) PauseUnlessPaused(ctx context.Context, id string, p task.Pause) (bool, error) {
	_, changed, err := r.pause(ctx, id, p, true)
	return changed, err
}

func (r *Registry) pause(ctx context.Context, id string, p task.Pause, keep bool) (*task.Task, bool, error) {
	rec, err := r.pauseRecord(p)
	if err != nil {
		return nil, false, err
	}
	return r.setPaused(ctx, id, true, rec, keep)
}

// pauseRecord checks the note of the pause record p, and dates it now
// when it has no time.
func (r *Registry) pauseRecord(p task.Pause) (*task.Pause, error) {
	if err := task.CheckPauseNote(p.Note); err != nil {
		return nil, err
	}
	if p.At.IsZero() {
		p.At = r.now().UTC().Truncate(time.Millisecond)
	}
	return &p, nil
}

// setPaused sets the task's paused flag and pause record p, and reports
// whether it wrote the task. One already paused as asked is left as it
// is when there is no record to write, or keep says to keep its own.
func (r *Registry) setPaused(ctx context.Context, id string, paused bool, p *task.Pause, keep bool) (*task.Task, bool, error) {
	for range casRetries {
		t, err := r.Get(ctx, id)
		if err != nil {
			return nil, false, err
		}
		if t.Paused == paused && (p == nil || keep) {
			return t, false, nil
		}
		t.Paused = paused
		t.Pause = p
		t2, err := r.Put(ctx, t, PutOptions{IfVersion: t.Version})
		if !errors.Is(err, ErrVersionMismatch) {
			return t2, err == nil, err
		}
	}
	return nil, false, fmt.Errorf("pause task %q: %w, try again", id, ErrContention)
}

// Trigger asks the task's owner to fire it once now, outside its schedule,
// and returns the scheduled time of that fire (the idempotency key's time).
// The request is a key under /<prefix>/triggers/ that the owner deletes
// once the fire starts, or ends unrun.
func (r *Registry) Trigger(ctx context.Context, id string) (time.Time, error) {
	return r.TriggerWith(ctx, id, nil)
}

// TriggerWith is Trigger with an override of the fire's HTTP body or
// handler payload (nil: none), checked against the task's executor and
// carried as the trigger key's value.
//
// Each call is a fire of its own: its time is 1 ms after the task's last
// trigger from this process (a bulk action's too) when they would share a
// millisecond, and after any trigger of the task at that time still
// pending, since a time is a fire's idempotency key. (Two processes that
// trigger a task in one millisecond, the first fired before the second
// writes, still make one fire: the owner takes the second for the first,
// unless the task was deleted and put again between them.)
func (r *Registry) TriggerWith(ctx context.Context, id string, o *task.Override) (time.Time, error) {
	if err := task.CheckID(id); err != nil {
		return time.Time{}, err
	}
	for range maxTriggerTries {
		at := time.UnixMilli(r.triggers.next(id, r.now())).UTC()
		err := r.trigger(ctx, id, at, o, false)
		if !errors.Is(err, errTriggerPending) {
			return at, err
		}
	}
	return time.Time{}, fmt.Errorf("trigger task %q: %w (%d triggers of it pending at once), try again", id, ErrContention, maxTriggerTries)
}

// maxTriggerTries bounds the times TriggerWith and TriggerAt try when each
// one they take already has a trigger of the task pending.
const maxTriggerTries = 16

// errTriggerPending is a trigger's time that a pending trigger of the
// task already has.
var errTriggerPending = errors.New("a trigger of the task at that time is pending")

// TriggerAt writes a trigger of the task for the scheduled time at (its
// idempotency key "<id>@<at ms>"), as chains do with the scheduled time of
// the fire that triggers them. Two triggers of one task at one time are
// one fire: a plain trigger (no override, no retry) of the task pending at
// at is this one's, and it writes nothing. A pending trigger that is
// another fire, with an override or a retry handed on, would lose it were
// its key written over: this one then takes the next millisecond (none a
// whole second) where none such is pending.
func (r *Registry) TriggerAt(ctx context.Context, id string, at time.Time) error {
	if err := task.CheckID(id); err != nil {
		return err
	}
	for range maxTriggerTries {
		err := r.trigger(ctx, id, at, nil, true)
		if !errors.Is(err, errTriggerPending) {
			return err
		}
		at = time.UnixMilli(offSecond(at.UnixMilli() + 1))
	}
	return fmt.Errorf("trigger task %q: %w (%d triggers of it pending at once), try again", id, ErrContention, maxTriggerTries)
}

// trigger writes the trigger of task id at at where no trigger of the task
// at that time is pending, else returns errTriggerPending; when join, a
// pending plain trigger (an empty value: no override, no retry) is this
// trigger's fire, and it writes nothing.
func (r *Registry) trigger(ctx context.Context, id string, at time.Time, o *task.Override, join bool) error {
	p := r.Partition(id)
	key := r.keys.trigger(p, id, at.UnixMilli())
	tk := r.keys.task(p, id)
	cmp := clientv3.Compare(clientv3.CreateRevision(tk), ">", 0)
	var val []byte
	var version int64
	if !o.Empty() {
		t, err := r.Get(ctx, id)
		if err != nil {
			return err
		}
		if err := o.Check(t); err != nil {
			return err
		}
		if val, err = json.Marshal(o); err != nil {
			return fmt.Errorf("trigger task %q: %w", id, err)
		}
		// The override was checked against this version of the task.
		version = t.Version
		cmp = clientv3.Compare(clientv3.ModRevision(tk), "=", version)
	}
	resp, err := r.cli.Txn(ctx).If(cmp, clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val))).
		Else(clientv3.OpGet(tk, clientv3.WithKeysOnly()), clientv3.OpGet(key)).Commit()
	if err != nil {
		return fmt.Errorf("trigger task %q: %w", id, err)
	}
	if resp.Succeeded {
		return nil
	}
	stored, pending := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	switch {
	case len(stored) == 0:
		return ErrNotFound
	case !o.Empty() && stored[0].ModRevision != version:
		return fmt.Errorf("trigger task %q: %w (it changed while the trigger was checked)", id, ErrVersionMismatch)
	case join && len(pending) == 1 && len(pending[0].Value) == 0 && pending[0].ModRevision > stored[0].CreateRevision:
		// A pending key written before the task was deleted and put
		// again is the task before's: its owner drops it (engine's
		// checkTriggers), and would drop this trigger with it.
		return nil
	default:
		return errTriggerPending
	}
}

// Retry is what a trigger key carries when it is a retry handed on
// through etcd: which attempt of which fire it is, and when it is due.
type Retry struct {
	Attempt uint16    `json:"attempt"`
	Due     time.Time `json:"due"`
	// At is the fire's scheduled time. The key's time is later: the fire's own belongs to the triggers of
	// the task at that time (a chain's), another fire.
	At time.Time `json:"at,omitzero"`
	// Backfill: the fire is a backfill's, whose retries run while the
	// task is paused, until the backfill is canceled.
	Backfill bool `json:"backfill,omitempty"`
	// Trigger: the fire is a trigger's, and this its first attempt, which
	// its node's stop met unrun: it runs while the task is paused, as the
	// trigger's own fire does.
	Trigger bool `json:"trigger,omitempty"`
}

// triggerValue is a trigger key's value: the fire's override, and the
// retry it is, if one.
type triggerValue struct {
	task.Override
	Retry *Retry `json:"retry,omitempty"`
}

// TriggerRetry writes the trigger of the task's fire at at that is
// attempt retry.Attempt of it, due at retry.Due, with the fire's override
// (checked when the fire was triggered). A node whose attempt of a task
// failed after it had released the task's partition hands the retry on
// so, for the partition's owner, whoever it is, to run. Its key is the
// first of the task's times after at with no trigger pending: the key at
// at is that of the task's triggers at at (a chain's, of a fire at the
// same time), another fire that the retry must neither replace nor be
// replaced by; the value names at (Retry.At). The same retry written again
// (after an error that hid the first write) finds its own key pending, and
// leaves it.
//
// created is a revision at or after which the task whose attempt failed
// was created (its node's view of the partition, engine's partState.created):
// the retry is written only while the task stored under id was created at
// or before it. One created after it was put again since (deleted, then
// written again under the same id), another task that must not fire from
// the retry of the one before: ErrNotFound, as for a task deleted. 0:
// not known, and not checked.
func (r *Registry) TriggerRetry(ctx context.Context, id string, at time.Time, retry Retry, o *task.Override, created int64) error {
	retry.At = at.UTC()
	v := triggerValue{Retry: &retry}
	if o != nil {
		v.Override = *o
	}
	val, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("trigger a retry of task %q: %w", id, err)
	}
	p := r.Partition(id)
	tk := r.keys.task(p, id)
	if created == 0 {
		created = math.MaxInt64 - 1
	}
	for ms := at.UnixMilli() + 1; ms <= at.UnixMilli()+maxTriggerTries; ms++ {
		key := r.keys.trigger(p, id, ms)
		// "< created+1": etcd's compares have no "<=".
		resp, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(tk), ">", 0),
			clientv3.Compare(clientv3.CreateRevision(tk), "<", created+1), clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, string(val))).Else(clientv3.OpGet(tk, clientv3.WithKeysOnly()), clientv3.OpGet(key)).Commit()
		if err != nil {
			return fmt.Errorf("trigger a retry of task %q: %w", id, err)
		}
		if resp.Succeeded {
			return nil
		}
		stored := resp.Responses[0].GetResponseRange().Kvs
		if len(stored) == 0 || stored[0].CreateRevision > created {
			return ErrNotFound
		}
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 && string(kvs[0].Value) == string(val) &&
			kvs[0].ModRevision > stored[0].CreateRevision {
			return nil // written before, for this task (not one deleted since)
		}
	}
	return fmt.Errorf("trigger a retry of task %q: %w (%d triggers of it pending at once), try again", id, ErrContention, maxTriggerTries)
}

// DecodeTriggerValue reads a trigger key's value: the override it carries,
// nil for none (an empty value, as Trigger writes), and the retry it is,
// nil for a trigger's own fire. A retry of attempt 1 is a fire's first
// attempt that its node's stop came before, handed on unrun.
func DecodeTriggerValue(v []byte) (*task.Override, *Retry) {
	if len(v) == 0 {
		return nil, nil
	}
	var tv triggerValue
	if json.Unmarshal(v, &tv) != nil {
		return nil, nil
	}
	var o *task.Override
	if !tv.Override.Empty() {
		o = &tv.Override
	}
	if tv.Retry != nil && tv.Retry.Attempt < 1 {
		tv.Retry = nil // attempt 0 names no attempt: the trigger's own fire
	}
	return o, tv.Retry
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// BatchResult is what PutItems did with a batch.
type BatchResult struct {
	// Written counts the items now stored as given (rewritten or already
	// identical), replaced items included.
	Written int
	// Errors are the items not written and why, in index order.
	Errors []task.BatchError
	// Replaced are the items, in index order, that a later item of the same
	// id replaced; that item was written.
	Replaced []int
	// Unchanged counts the items of Written that were identical to what is
	// stored and left alone; Replaced items are not among them.
	Unchanged int
}

// RefusedLaterMessage is the error of a batch item not written because a later
// item of its id, which would have replaced it, was refused.
func RefusedLaterMessage(id string) string {
	return fmt.Sprintf("not written: task %q comes again later in this batch, and that item was refused", id)
}

// BatchItem is one item of a batch for PutItems: a task, or an item its
// caller refused before (Task nil, Refused the error to report), with
// the id it gives when that could be read.
type BatchItem struct {
	Task    *task.Task
	ID      string // of a refused item; "" when unknown
	Refused string
}

// PutBatch is PutItems of tasks.
func (r *Registry) PutBatch(ctx context.Context, tasks []*task.Task) (BatchResult, error) {
	items := make([]BatchItem, len(tasks))
	for i, t := range tasks {
		items[i].Task = t
	}
	return r.PutItems(ctx, items)
}

// PutItems validates and writes many tasks, each with its index keys in the
// same transaction, in transactions of at most 128 operations and 1 MiB, a
// few at once. Invalid tasks are reported by index and do not stop the
// others; tasks identical to what is stored are not rewritten, so putting
// the same batch twice writes nothing the second time. A later item with
// the same id as an earlier one wins: the earlier is Replaced and counts as
// written when the later is written, and is an error saying so when the
// later is refused (invalid, refused as it is written, or refused by the
// caller). err stops the batch: what it wrote until then stays written,
// counted in Written but for replaced items, and Replaced is empty.
func (r *Registry) PutItems(ctx context.Context, items []BatchItem) (res BatchResult, err error) {
	defer func() { slices.SortStableFunc(res.Errors, byIndex) }() // however it returns
	if len(items) > MaxBatchItems {
		return res, task.Invalid("", "a batch holds at most %d tasks, got %d", MaxBatchItems, len(items))
	}
	tasks := make([]*task.Task, len(items))  // the valid ones; nil for the others
	last := make(map[string]int, len(items)) // id -> its last item
	for i, it := range items {
		id := it.ID
		if it.Task == nil {
			res.Errors = append(res.Errors, task.BatchError{Index: i, Error: it.Refused})
		} else if err := it.Task.Validate(); err != nil {
			res.Errors = append(res.Errors, task.BatchError{Index: i, Error: err.Error()})
			id = it.Task.ID
		} else {
			tasks[i], id = it.Task, it.Task.ID
		}
		if id != "" {
			last[id] = i
		}
	}
	valid := make([]int, 0, len(items))
	superseded := map[int][]int{} // the last item of an id -> the earlier valid items it replaces
	for i, t := range tasks {
		if t == nil {
			continue
		}
		switch l := last[t.ID]; {
		case l == i:
			valid = append(valid, i)
		case tasks[l] == nil:
			res.Errors = append(res.Errors, task.BatchError{Index: i, Error: RefusedLaterMessage(t.ID)})
		default:
			superseded[l] = append(superseded[l], i)
		}
	}
	// Tasks with chains go one by one after the others, in batch order,
	// through Put's chain check: targets may come later in the batch, and
	// a cycle closed within the batch is refused at the task that closes it.
	var chained []int
	plain := valid[:0]
	for _, i := range valid {
		if len(tasks[i].OnSuccess)+len(tasks[i].OnFailure) > 0 {
			chained = append(chained, i)
		} else {
			plain = append(plain, i)
		}
	}
	valid = plain
	defer func() {
		if err != nil {
			return
		}
		for _, i := range chained {
			_, same, perr := r.put(ctx, tasks[i], PutOptions{AllowMissingTargets: true})
			if perr != nil {
				var ve *task.ValidationError
				if !errors.As(perr, &ve) {
					err = perr
					return
				}
				res.Errors = append(res.Errors, task.BatchError{Index: i, Error: perr.Error()})
				continue
			}
			res.Written++
			if same {
				res.Unchanged++
			}
		}
		// Replaced items count as written with their replacement, and are
		// errors without it.
		refused := map[int]bool{}
		for _, e := range res.Errors {
			refused[e.Index] = true
		}
		for last, earlier := range superseded {
			if !refused[last] {
				res.Written += len(earlier)
				res.Replaced = append(res.Replaced, earlier...)
				continue
			}
			for _, i := range earlier {
				res.Errors = append(res.Errors, task.BatchError{Index: i,
					Error: RefusedLaterMessage(tasks[i].ID)})
			}
		}
		slices.Sort(res.Replaced)
	}()
	var chunks [][]int
	for len(valid) > 0 {
		n, size := 0, 0
		for n < len(valid) && n < MaxTxnOps && size < MaxTxnBytes {
			size += len(tasks[valid[n]].ID) + 1024 // a rough bound before encoding
			n++
		}
		chunks = append(chunks, valid[:n])
		valid = valid[n:]
	}
	var (
		mu       sync.Mutex // guards res and failed
		failed   error
		wg       sync.WaitGroup
		next     atomic.Int64
		nworkers = min(batchWorkers, len(chunks))
	)
	for range nworkers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				mu.Lock()
				stop := i >= len(chunks) || failed != nil
				mu.Unlock()
				if stop {
					return
				}
				w, cerrs, err := r.putChunk(ctx, tasks, chunks[i])
				mu.Lock()
				res.Written += w.written
				res.Unchanged += w.unchanged
				res.Errors = append(res.Errors, cerrs...)
				if err != nil && failed == nil {
					failed = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return res, failed
}

func byIndex(a, b task.BatchError) int { return a.Index - b.Index }

// batchWorkers is how many chunks of one PutItems are written at once:
// etcd commits concurrent transactions together, so with the index's extra
// keys a few chunks in flight keep the import rate of single-key batches.
// 8 puts every chunk of a batch of 1000 (the import's default) in flight:
// about 10 % more tasks/s than 4 through the HTTP batch path (BENCHMARKS.md).
const batchWorkers = 8

// putChunk writes up to MaxTxnOps tasks, each with its index keys, in
// transactions of at most MaxTxnOps operations. It first writes them as new
// tasks: each transaction compares every key's mod revision with 0 (not
// stored) and, when one is stored, reads all of its keys in its Else branch
// instead of writing. An import into a fleet that does not hold its tasks
// yet thus takes one round trip per transaction, not a read and then a
// write. The tasks of a transaction that found some stored are then written
// over what it read (identical ones left alone), under compares of the mod
// revisions read; those of a transaction that finds one of them changed by
// another writer are written again one at a time.
func (r *Registry) putChunk(ctx context.Context, tasks []*task.Task, idx []int) (chunkCount, []task.BatchError, error) {
	var (
		n      chunkCount
		errs   []task.BatchError
		g      txnGroup
		stored []readTask // tasks the first write found stored
		alone  []int      // tasks to write one at a time
	)
	flushNew := func() error {
		if len(g.tasks) == 0 {
			return nil
		}
		tr, err := r.cli.Txn(ctx).If(g.cmps...).Then(g.ops...).Else(g.reads...).Commit()
		if err != nil {
			return fmt.Errorf("batch: write tasks: %w", err)
		}
		if tr.Succeeded {
			n.written += len(g.tasks)
		} else {
			for k, j := range g.tasks {
				rt := readTask{index: j}
				if kvs := tr.Responses[k].GetResponseRange().Kvs; len(kvs) > 0 {
					rt.old = kvs[0]
				}
				stored = append(stored, rt)
			}
		}
		g.reset()
		return nil
	}
	for _, j := range idx {
		t := tasks[j]
		val, _, err := r.encode(t, nil)
		if err != nil {
			// Put reads what is stored and reports the error it finds.
			alone = append(alone, j)
			continue
		}
		w := r.write(t.ID, nil, val, t.Labels)
		if len(w.ops) > MaxTxnOps || w.size > MaxTxnBytes {
			alone = append(alone, j)
			continue
		}
		if !g.fits(w) {
			if err := flushNew(); err != nil {
				return n, errs, err
			}
		}
		g.add(j, w, true)
	}
	if err := flushNew(); err != nil {
		return n, errs, err
	}
	flush := func() error {
		if len(g.tasks) == 0 {
			return nil
		}
		tr, err := r.cli.Txn(ctx).If(g.cmps...).Then(g.ops...).Commit()
		if err != nil {
			return fmt.Errorf("batch: write tasks: %w", err)
		}
		if tr.Succeeded {
			n.written += len(g.tasks)
		} else {
			alone = append(alone, g.tasks...)
		}
		g.reset()
		return nil
	}
	for _, rt := range stored {
		t := tasks[rt.index]
		val, same, err := r.encode(t, rt.old)
		if err != nil {
			errs = append(errs, task.BatchError{Index: rt.index, Error: err.Error()})
			continue
		}
		if same {
			n.written++
			n.unchanged++
			continue
		}
		w := r.write(t.ID, rt.old, val, t.Labels)
		if len(w.ops) > MaxTxnOps || w.size > MaxTxnBytes {
			alone = append(alone, rt.index)
			continue
		}
		if !g.fits(w) {
			if err := flush(); err != nil {
				return n, errs, err
			}
		}
		g.add(rt.index, w, false)
	}
	if err := flush(); err != nil {
		return n, errs, err
	}
	// Contention, or tasks too large for a shared transaction.
	for _, j := range alone {
		_, same, err := r.put(ctx, tasks[j], PutOptions{})
		if err != nil {
			if ctx.Err() != nil {
				return n, errs, err
			}
			errs = append(errs, task.BatchError{Index: j, Error: err.Error()})
			continue
		}
		n.written++
		if same {
			n.unchanged++
		}
	}
	return n, errs, nil
}

// chunkCount is what putChunk wrote: the tasks now stored as given, and
// those of them left alone, identical.
type chunkCount struct{ written, unchanged int }

// readTask is a task of a batch, by its index, with what etcd holds under
// its key (nil: nothing).
type readTask struct {
	index int
	old   *mvccpb.KeyValue
}

// txnGroup packs task writes into one transaction of at most MaxTxnOps
// operations and MaxTxnBytes.
type txnGroup struct {
	cmps  []clientv3.Cmp
	ops   []clientv3.Op
	reads []clientv3.Op // the Else branch: read every task's key
	size  int
	tasks []int // the batch indexes of the tasks packed
}

// fits reports whether w joins the group without breaking its limits.
func (g *txnGroup) fits(w taskWrite) bool {
	return len(g.ops)+len(w.ops) <= MaxTxnOps && g.size+w.size <= MaxTxnBytes
}

// add packs w, the write of the task at batch index j, with a read of its
// key in the Else branch when read is set.
func (g *txnGroup) add(j int, w taskWrite, read bool) {
	g.cmps = append(g.cmps, w.cmp())
	g.ops = append(g.ops, w.ops...)
	if read {
		g.reads = append(g.reads, clientv3.OpGet(w.key))
	}
	g.size += w.size
	g.tasks = append(g.tasks, j)
}

func (g *txnGroup) reset() { *g = txnGroup{} }

// storedTask is a task as the registry writes it: the input fields and the
// times; partition and version come from the key and its revision.
func (r *Registry) encode(t *task.Task, old *mvccpb.KeyValue) (val []byte, same bool, err error) {
	s := *t
	s.Partition, s.Version, s.State = nil, 0, nil
	if !s.Paused {
		s.Pause = nil
	}
	now := r.now().UTC().Truncate(time.Millisecond)
	// A created_at given to a create is kept (an export's, read back by
	// an import: max_fires counts from it), unless it is yet to come.
	if s.CreatedAt = s.CreatedAt.UTC().Truncate(time.Millisecond); s.CreatedAt.IsZero() || s.CreatedAt.After(now) {
		s.CreatedAt = now
	}
	if s.Pause != nil && s.Pause.At.IsZero() {
		// A pause record given without its time (task JSON's, not an
		// export's) dates from its write.
		p := *s.Pause
		p.At = now
		s.Pause = &p
	}
	s.UpdatedAt = now
	if old != nil {
		var prev task.Task
		if task.DecodeStored(old.Value, &prev) == nil {
			if s.Paused && s.Pause == nil {
				s.Pause = prev.Pause // a PUT that keeps the task paused keeps who paused it
			}
			s.CreatedAt = prev.CreatedAt
			s.UpdatedAt = prev.UpdatedAt
			if v, err := marshalStored(&s); err == nil && bytes.Equal(v, old.Value) {
				return old.Value, true, nil
			}
			s.UpdatedAt = now
		}
	}
	val, err = marshalStored(&s)
	if err != nil {
		return nil, false, fmt.Errorf("encode task %q: %w", t.ID, err)
	}
	// What is stored comes back with the fields responses add, and a client
	// may PUT back what it got: that must fit DecodeTask's limit too. So
	// must the task with any pause record, stored and repeated in the
	// answer's state: a task that was taken can always be paused.
	size := len(val)
	if s.Pause != nil {
		s.Pause = nil
		unpaused, err := marshalStored(&s)
		if err != nil {
			return nil, false, fmt.Errorf("encode task %q: %w", t.ID, err)
		}
		size = len(unpaused)
	}
	if size+responseRoom > task.MaxTaskSize {
		return nil, false, task.Invalid("", "task is %d bytes of JSON as stored (with its defaults); with the %d bytes kept for what responses add and for a pause record it exceeds the limit of %d (64 KiB)",
			size, responseRoom, task.MaxTaskSize)
	}
	return val, false, nil
}

// responseRoom is what a response adds to a stored task at most:
// partition, version and the owner's state (1 KiB), and a pause record
// twice, stored and in the state: its note escaped (2 bytes a byte at
// most), who and when.
const responseRoom = 1024 + 2*(2*task.MaxPauseNote+256)

// marshalStored encodes a task as the registry stores it: without HTML
// escaping, so that "<" stays one byte, as the API answers it.
func marshalStored(t *task.Task) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(t); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// decode turns a stored task into the API's form.
func (r *Registry) decode(kv *mvccpb.KeyValue) (*task.Task, error) {
	var t task.Task
	if err := task.DecodeStored(kv.Value, &t); err != nil {
		return nil, fmt.Errorf("registry: stored task %s is corrupt: %w", kv.Key, err)
	}
	p, _, _ := r.keys.parseTaskKey(string(kv.Key))
	t.Partition = &p
	t.Version = kv.ModRevision
	t.State = nil
	return &t, nil
}
