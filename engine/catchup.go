package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/store"
)

// Catching a prepared partition up to its acquisition.
//
// A partition is prepared (read from the Badger cache or from etcd, as of
// revision R) before its lock is ours, so the acquire must bring it up to
// A, the revision of the transaction that writes its checkpoint under the
// lock, before it arms it: a task deleted, paused or changed before A must
// not fire as it was.
//
// A watch of the partition from R+1 opens as soon as the partition is
// prepared, and the acquire reads it up to A: until an event past A, or a
// progress notification at A or later, which says that the watch delivered
// every event up to it. etcd sends one on request, only once every watch
// of the stream has caught up with its history, and drops the request
// before; so catch-up watches have a few gRPC streams of their own
// (registry.CatchUp, registry.CatchUpStreams), where they wait for no
// partition watch and for a quarter of the other catch-ups only (at a
// restart, hundreds of partitions open theirs), and the acquire asks every
// progressEvery until it is answered. Not a stream each: with password
// authentication each stream opened costs etcd a login, queued ahead of
// the node's keep-alives. The partition's own watch then follows it from
// the revision reached, on the stream the node's watches share.
//
// This costs etcd the revisions written since R. Reading the partition's
// changes instead costs the partition's size whatever changed: etcd reads
// every task of the range and filters them by revision, which at a warm
// restart of 1 M tasks in the acquiring transactions held etcd's apply
// loop for about 5 s (BENCHMARKS.md). When the watch cannot say (etcd
// compacted R, the watch failed, or no progress within catchUpWait: etcd
// before 3.4 has no progress requests), the acquire reads the changes at A
// instead (registry.ChangesAt).
//
// etcd before 3.4.25 and 3.5.8 (etcd-io/etcd#15220) can send a progress
// notification at revision V before the events of V itself, never before
// those of earlier revisions. A, the acquire's own transaction, writes no
// task; so a notification at V ≥ A lacks at most events past A, which the
// partition's watch delivers, as any change, and the partition counts as
// synced to A only.

// errNoCatchUp says that a partition's watch could not say that it
// delivered every change up to the acquisition.
var errNoCatchUp = errors.New("engine: the partition watch did not catch up")

// taskChanges are the tasks of a partition changed since its read: their
// last value (nil when deleted), and the revision each one not deleted
// was created at.
type taskChanges struct {
	values  map[string][]byte
	created map[string]int64
}

// catchUp reads wch, a watch of partition prep.p from after its prepared
// read (registry.CatchUp, which gives progress), until it has delivered
// every change up to atRev. It returns the tasks changed since the read
// and the revision the partition is then synced to, at least atRev. It
// returns errNoCatchUp when the watch cannot say: the caller reads the
// changes instead.
func (e *Engine) catchUp(ctx context.Context, prep *prepared, atRev int64, wch clientv3.WatchChan, progress func() error) (taskChanges, int64, error) {
	ch := taskChanges{values: map[string][]byte{}, created: map[string]int64{}}
	rev := prep.rev
	every := time.NewTicker(progressEvery)
	defer every.Stop()
	giveUp := time.NewTimer(catchUpWait)
	defer giveUp.Stop()
	ask := func() {
		if err := progress(); err != nil && ctx.Err() == nil {
			e.log.Debug("requesting watch progress failed; asking again", "partition", prep.p, "err", err)
		}
	}
	ask()
	for {
		select {
		case resp, ok := <-wch:
			switch {
			case !ok || resp.Canceled || resp.Err() != nil || resp.CompactRevision != 0:
				if err := ctx.Err(); err != nil {
					return taskChanges{}, 0, err
				}
				return taskChanges{}, 0, errNoCatchUp
			case resp.IsProgressNotify():
				if resp.Header.Revision >= atRev {
					return ch, atRev, nil
				}
				continue
			}
			for _, ev := range resp.Events {
				id := e.reg.PartitionID(prep.p, ev.Kv.Key)
				if ev.Type == mvccpb.DELETE {
					ch.values[id] = nil
					delete(ch.created, id)
				} else {
					ch.values[id] = ev.Kv.Value
					ch.created[id] = ev.Kv.CreateRevision
				}
				rev = ev.Kv.ModRevision
			}
			if rev > atRev {
				return ch, rev, nil // etcd sends a revision's events together
			}
		case <-every.C:
			ask()
		case <-giveUp.C:
			return taskChanges{}, 0, errNoCatchUp
		case <-ctx.Done():
			return taskChanges{}, 0, ctx.Err()
		}
	}
}

// changesSince brings a prepared partition up to atRev, the revision of its
// acquisition: from its catch-up watch (catchUp), else with a read of its
// changes at atRev. It applies the changes to the Badger cache, moves
// prep.created to the latest creation among them when it is known, and
// returns them and the revision the partition is synced to.
func (e *Engine) changesSince(ctx context.Context, prep *prepared, atRev int64, wch clientv3.WatchChan, progress func() error) (map[string][]byte, int64, error) {
	p := prep.p
	if prep.rev > atRev {
		// Read from a history etcd no longer has: it was restored from a
		// backup after the read (a standby's waits longest). No change
		// brings it back to atRev, and armed as read it could fire tasks
		// etcd lacks. The acquire fails, and its retry prepares again,
		// from etcd: the cache, replaced by this read, is ahead too.
		return nil, 0, fmt.Errorf("prepared at revision %d, past etcd's %d: etcd was restored under it", prep.rev, atRev)
	}
	ch, rev, err := e.catchUp(ctx, prep, atRev, wch, progress)
	if errors.Is(err, errNoCatchUp) {
		rev = atRev
		e.log.Info("the partition's watch did not catch up; reading its changes", "partition", p, "since", prep.rev, "revision", atRev)
		had := make(map[string]bool, len(prep.defs))
		for i := range prep.defs {
			had[prep.defs[i].id] = true
		}
		ch.values, ch.created, err = e.reg.ChangesAt(ctx, p, had, prep.rev, atRev)
	}
	if err != nil {
		return nil, 0, err
	}
	if prep.created != 0 {
		for _, c := range ch.created {
			prep.created = max(prep.created, c)
		}
	}
	if e.caching(p) {
		var puts []store.KV
		var dels []string
		for id, v := range ch.values {
			if v != nil {
				puts = append(puts, store.KV{ID: id, Value: v, Created: ch.created[id]})
			} else {
				dels = append(dels, id)
			}
		}
		if err := e.store.Apply(uint32(p), rev, puts, dels); err != nil {
			e.dropCache(p, err)
		}
	}
	return ch.values, rev, nil
}
