package engine

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Make-before-break: a partition changes hands only once its next owner
// has read it.
//
// A node that the ring gives a partition first prepares it (reads and
// decodes its tasks, and opens a watch from that revision), then publishes
// it under /<prefix>/prepared/<node-id>, a JSON list of partitions under
// its lease, and only then waits for the partition's lock. The previous
// owner, which still fires the partition, watches those keys and releases
// a partition it lost once the partition's new owner lists it, or after
// prepareWait. The gap between the two owners is then a lock hand-off and
// a catch-up of the changes since the read, whatever the partition's size.
// A node lists a few dozen partitions at a time (serving.admit), so that
// the gap stays that short when hundreds are prepared at once.

// preparedSets maps a node id to the partitions it has prepared.
type preparedSets map[string]map[int]bool

// publishPrepared writes the partitions this node prepared and waits to
// lock, sorted, under the session's lease.
func (e *Engine) publishPrepared(ctx context.Context, lease clientv3.LeaseID, parts []int) {
	val, _ := json.Marshal(parts)
	pctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	_, err := e.cli.Put(pctx, e.keys.prepared(e.cfg.NodeID), string(val), clientv3.WithLease(lease))
	switch {
	case err == nil:
	case ctx.Err() != nil:
		e.log.Debug("publishing the prepared partitions stopped with the session (the node stops or lost etcd)", "err", err)
	default:
		e.log.Warn("publishing the prepared partitions failed; their owners hand them over after a wait", "err", err)
	}
}

// watchPrepared sends every node's prepared partitions at once and after
// every change, the newest only, until ctx ends; then it closes the
// channel.
func (e *Engine) watchPrepared(ctx context.Context) <-chan preparedSets {
	out := make(chan preparedSets, 1)
	send := func(sets preparedSets) {
		c := make(preparedSets, len(sets))
		maps.Copy(c, sets)
		select {
		case <-out: // the reader takes the newest only
		default:
		}
		out <- c
	}
	decode := func(sets preparedSets, key, value []byte) {
		node := strings.TrimPrefix(string(key), e.keys.preparedPrefix())
		var ps []int
		if value == nil || json.Unmarshal(value, &ps) != nil {
			delete(sets, node)
			return
		}
		set := make(map[int]bool, len(ps))
		for _, p := range ps {
			set[p] = true
		}
		sets[node] = set
	}
	go func() {
		defer close(out)
		for ctx.Err() == nil {
			resp, err := e.cli.Get(ctx, e.keys.preparedPrefix(), clientv3.WithPrefix())
			if err != nil {
				sleepCtx(ctx, time.Second)
				continue
			}
			sets := preparedSets{}
			for _, kv := range resp.Kvs {
				decode(sets, kv.Key, kv.Value)
			}
			send(sets)
			for wr := range e.cli.Watch(clientv3.WithRequireLeader(ctx), e.keys.preparedPrefix(),
				clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
				if wr.Err() != nil {
					break
				}
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypeDelete {
						decode(sets, ev.Kv.Key, nil)
					} else {
						decode(sets, ev.Kv.Key, ev.Kv.Value)
					}
				}
				send(sets)
			}
			sleepCtx(ctx, 100*time.Millisecond)
		}
	}()
	return out
}
