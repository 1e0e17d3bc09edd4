package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Stray lock keys.
//
// A lock attempt that fails (canceled because the ring moved the
// partition away, timed out, cut by a leader change) deletes its lock key
// (acquire). But the transaction that puts the key can still be applied
// after that delete: etcd applies a proposal once it is committed, whatever
// became of the request that sent it, and the delete, which the client may
// send to another member, can be committed first. The key then stays, under
// the session's live lease, ahead of the partition's next owner, which
// waits for it as long as the lease lives: nothing logs, nothing retries.
//
// So each session follows its own lock keys (followLocks): one that
// appears for a partition the coordinator neither holds nor acquires is
// deleted at once (lockCreated); one that appears while the partition is
// being acquired is deleted if that acquire fails (finish). A key that
// cannot be deleted ends the session, as a failed acquire's does.

// followLocks sends the partition of every lock key of the session's lease
// that etcd holds or creates, until ctx ends; then it closes out. Lock keys
// change only when partitions change hands, so the watch costs nothing in
// steady state.
func (e *Engine) followLocks(ctx context.Context, lease clientv3.LeaseID, out chan<- int) {
	defer close(out)
	prefix := e.keys.locks()
	suffix := fmt.Sprintf("/%x", int64(lease))
	send := func(key []byte) bool {
		k, ok := strings.CutSuffix(string(key), suffix)
		if !ok {
			return true // another session's
		}
		p, err := strconv.Atoi(strings.TrimPrefix(k, prefix))
		if err != nil {
			return true
		}
		select {
		case out <- p:
			return true
		case <-ctx.Done():
			return false
		}
	}
	var b backoff
	var rev int64 // followed up to here; 0: list first
	for ctx.Err() == nil {
		if rev == 0 {
			resp, err := e.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				if !b.wait(ctx) {
					return
				}
				continue
			}
			for _, kv := range resp.Kvs {
				if !send(kv.Key) {
					return
				}
			}
			rev = resp.Header.Revision
		}
		wctx, cancel := context.WithCancel(ctx)
		for wr := range e.cli.Watch(clientv3.WithRequireLeader(wctx), prefix, clientv3.WithPrefix(),
			clientv3.WithRev(rev+1), clientv3.WithFilterDelete(), clientv3.WithKeysOnly()) {
			if wr.CompactRevision != 0 {
				rev = 0 // what was compacted away is listed
				break
			}
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if !send(ev.Kv.Key) {
					cancel()
					return
				}
				rev = ev.Kv.ModRevision
			}
			b.reset()
		}
		cancel()
		if !b.wait(ctx) {
			return
		}
	}
}

// lockCreated deletes this session's lock key of p unless the coordinator
// holds p (a held or stuck partition's key is its lock) or acquires it
// (then finish looks again if the acquire fails). It blocks the
// coordinator for as long as deleteLockKey, which only a stray key costs.
func (s *serving) lockCreated(p int) {
	switch {
	case s.parts[p] != nil || s.stuck[p] != nil:
	case s.acquiring[p] != nil:
		s.unsure[p] = true
	default:
		s.deleteStray(p)
	}
}

// deleteStray deletes this session's lock key of p, which no acquire is
// using, or ends the session so that its lease takes the key with it.
func (s *serving) deleteStray(p int) {
	gone, deleted := s.e.deleteLockKey(p, s.sess)
	if deleted {
		s.e.log.Info("deleted a lock key of this session put after its attempt failed", "partition", p)
	}
	if gone {
		return
	}
	s.e.log.Error("a lock key left behind could not be deleted; ending the session so that it goes", "partition", p)
	s.sess.Lost()
}
