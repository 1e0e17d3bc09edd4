package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The index: keys without values, written in the same transaction as the
// task they describe, so that a query reads its matches in id order with
// one range read instead of scanning every partition.
//
//	<prefix>/index/id/<id>                  one per task
//	<prefix>/index/label/<k>=<v>/<id>       one per label of a task
//	<prefix>/index/built                    present once every task written
//	                                        before the index existed is indexed
//
// The partition of an indexed id is ring.Partition(id, P), so the index
// stores nothing but the keys. Label keys and values are escaped (see
// escapeLabel) so that "=" and "/" inside them cannot make two labels share
// a key range.

func (k keys) index() string            { return k.prefix + "/index/" }
func (k keys) indexBuilt() string       { return k.prefix + "/index/built" }
func (k keys) indexIDs() string         { return k.prefix + "/index/id/" }
func (k keys) indexID(id string) string { return k.indexIDs() + id }
func (k keys) indexLabel(name, value string) string {
	return k.prefix + "/index/label/" + escapeLabel(name) + "=" + escapeLabel(value) + "/"
}

// escapeLabel escapes the bytes that delimit an index key: '%', '/' and
// '='. Label keys may hold '/', values anything.
func escapeLabel(s string) string {
	if !strings.ContainsAny(s, "%/=") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			b.WriteString("%25")
		case '/':
			b.WriteString("%2F")
		case '=':
			b.WriteString("%3D")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// storedLabels reads only the labels of a stored task. A value that does
// not decode has no labels: the index then holds no label key for it.
func storedLabels(val []byte) map[string]string {
	l, _ := decodeStoredLabels(val)
	return l
}

func decodeStoredLabels(val []byte) (map[string]string, error) {
	var v struct {
		Labels map[string]string `json:"labels"`
	}
	err := json.Unmarshal(val, &v)
	return v.Labels, err
}

// storedHasLabels reports whether the stored task val has every label of
// want. A value that is not JSON is taken to match, so that its reader
// reports it corrupt rather than a query by label leaving it out unsaid.
func storedHasLabels(val []byte, want map[string]string) bool {
	l, err := decodeStoredLabels(val)
	var syntax *json.SyntaxError
	return errors.As(err, &syntax) || hasLabels(l, want)
}

// indexOps returns the index writes that go with a task write: from the
// labels stored before (oldLabels, and existed whether the task did) to the
// labels written (newLabels, and exists whether the task will). A label
// that keeps its value costs nothing; the id key is written on create and
// deleted on delete only. Deletes come first, in label order, so the
// operations are deterministic.
func (k keys) indexOps(id string, existed bool, oldLabels map[string]string, exists bool, newLabels map[string]string) []clientv3.Op {
	var ops []clientv3.Op
	switch {
	case exists && !existed:
		ops = append(ops, clientv3.OpPut(k.indexID(id), ""))
	case existed && !exists:
		ops = append(ops, clientv3.OpDelete(k.indexID(id)))
	}
	if !exists {
		newLabels = nil
	}
	for _, name := range slices.Sorted(maps.Keys(oldLabels)) {
		if v, ok := newLabels[name]; !ok || v != oldLabels[name] {
			ops = append(ops, clientv3.OpDelete(k.indexLabel(name, oldLabels[name])+id))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(newLabels)) {
		if v, ok := oldLabels[name]; !ok || v != newLabels[name] {
			ops = append(ops, clientv3.OpPut(k.indexLabel(name, newLabels[name])+id, ""))
		}
	}
	return ops
}

// taskWrite is one task's write with its index: guarded by the mod
// revision of the task key read before (0: the task did not exist).
type taskWrite struct {
	key    string
	modRev int64
	ops    []clientv3.Op  // the task write first, then the index writes
	size   int            // bytes of keys and values, to keep a transaction under MaxTxnBytes
	extra  []clientv3.Cmp // further conditions of the write (the chains it was checked against)
}

// write is the write of a task's new stored value val with labels over
// old (nil: no task stored), with its index.
func (r *Registry) write(id string, old *mvccpb.KeyValue, val []byte, labels map[string]string) taskWrite {
	key := r.key(id)
	w := taskWrite{key: key, ops: []clientv3.Op{clientv3.OpPut(key, string(val))}, size: len(key) + len(val)}
	return r.withIndex(w, id, old, true, labels)
}

// remove is the delete of the stored task old, with its index.
func (r *Registry) remove(id string, old *mvccpb.KeyValue) taskWrite {
	key := r.key(id)
	// A deleted task's backfill ends with it.
	bf := r.keys.backfill(r.Partition(id), id)
	w := taskWrite{key: key, ops: []clientv3.Op{clientv3.OpDelete(key), clientv3.OpDelete(bf)}, size: len(key) + len(bf)}
	return r.withIndex(w, id, old, false, nil)
}

func (r *Registry) withIndex(w taskWrite, id string, old *mvccpb.KeyValue, exists bool, labels map[string]string) taskWrite {
	var oldLabels map[string]string
	if old != nil {
		w.modRev = old.ModRevision
		oldLabels = storedLabels(old.Value)
	}
	if r.noIndex {
		return w
	}
	for _, op := range r.keys.indexOps(id, old != nil, oldLabels, exists, labels) {
		w.ops = append(w.ops, op)
		w.size += len(op.KeyBytes())
	}
	return w
}

// cmps is the write's conditions: cmp and extra.
func (w taskWrite) cmps() []clientv3.Cmp { return append([]clientv3.Cmp{w.cmp()}, w.extra...) }

func (w taskWrite) cmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(w.key), "=", w.modRev)
}

// commit writes one task and its index atomically, and reports whether the
// task was still at the revision it was read at, and the revision of the
// write.
func (r *Registry) commit(ctx context.Context, w taskWrite) (rev int64, ok bool, err error) {
	if len(w.ops) <= MaxTxnOps {
		resp, err := r.cli.Txn(ctx).If(w.cmps()...).Then(w.ops...).Commit()
		if err != nil {
			return 0, false, err
		}
		return resp.Header.Revision, resp.Succeeded, nil
	}
	// A task that changes nearly all of its 64 labels at once does not fit
	// one transaction: first the new index keys, then the task with the
	// rest, each under the same compare. The first alone leaves only extra
	// index keys behind, which queries skip because they check every match
	// against the task.
	var puts, rest []clientv3.Op
	for _, op := range w.ops[1:] {
		if op.IsPut() {
			puts = append(puts, op)
		} else {
			rest = append(rest, op)
		}
	}
	for chunk := range slices.Chunk(puts, MaxTxnOps) {
		resp, err := r.cli.Txn(ctx).If(w.cmps()...).Then(chunk...).Commit()
		if err != nil || !resp.Succeeded {
			return 0, false, err
		}
	}
	resp, err := r.cli.Txn(ctx).If(w.cmps()...).Then(append([]clientv3.Op{w.ops[0]}, rest...)...).Commit()
	if err != nil {
		return 0, false, err
	}
	return resp.Header.Revision, resp.Succeeded, nil
}

// indexMarker is the value of the marker: the index's layout version and
// when it was complete.
func (r *Registry) indexMarker() []byte {
	return fmt.Appendf(nil, `{"version":1,"built":%q}`, r.now().UTC().Format(time.RFC3339))
}

// indexBuildChunk is how many tasks one transaction of BuildIndex indexes at
// most; fewer when their labels need more operations.
const indexBuildChunk = 64

// IndexBuilt reports whether every task is in the index: the marker that
// BuildIndex writes once done is present. Until then List and Export scan
// the task keys themselves (slow at fleet size, but complete).
func (r *Registry) IndexBuilt(ctx context.Context) (bool, error) {
	resp, err := r.cli.Get(ctx, r.keys.indexBuilt(), clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("read index marker: %w", err)
	}
	return resp.Count > 0, nil
}

// BuildIndex indexes the tasks of a cluster written before the index
// existed, in transactions of at most indexBuildChunk tasks read from one
// revision, and then writes the marker /index/built. Each transaction
// writes only if none of its tasks changed since it was read; a changed
// task is indexed again from what is stored now. Writers of this version
// index what they write themselves, so BuildIndex can run while the cluster
// takes writes. A cluster that already has the marker costs one read.
//
// Writers of an older version do not index: run every node of this version
// before BuildIndex, or delete the marker to have it run again.
func (r *Registry) BuildIndex(ctx context.Context) (indexed int, err error) {
	if ok, err := r.IndexBuilt(ctx); err != nil || ok {
		return 0, err
	}
	rev, _, err := r.readRevision(ctx)
	if err != nil {
		return 0, fmt.Errorf("build index: %w", err)
	}
	s := &keyStream{cli: r.cli, base: r.keys.tasks(), rev: rev, values: true}
	defer s.close()
	chunk := make([]*mvccpb.KeyValue, 0, indexBuildChunk)
	for {
		_, ok, err := s.head(ctx)
		if err != nil {
			return indexed, fmt.Errorf("build index: read tasks: %w", err)
		}
		if ok {
			chunk = append(chunk, s.buf[s.i])
			s.i++
		}
		if len(chunk) == indexBuildChunk || (!ok && len(chunk) > 0) {
			n, err := r.indexChunk(ctx, chunk)
			indexed += n
			if err != nil {
				return indexed, err
			}
			chunk = chunk[:0]
		}
		if !ok {
			break
		}
	}
	if _, err := r.cli.Put(ctx, r.keys.indexBuilt(), string(r.indexMarker())); err != nil {
		return indexed, fmt.Errorf("build index: write marker: %w", err)
	}
	return indexed, nil
}

// indexChunk indexes tasks read at one revision, in transactions that each
// hold whole tasks; a transaction that finds a task changed falls back to
// indexing its tasks one by one from what is stored now.
func (r *Registry) indexChunk(ctx context.Context, kvs []*mvccpb.KeyValue) (int, error) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	var pending []*mvccpb.KeyValue
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		resp, err := r.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("build index: %w", err)
		}
		if !resp.Succeeded {
			for _, kv := range pending {
				if err := r.indexOne(ctx, string(kv.Key)); err != nil {
					return err
				}
			}
		}
		cmps, ops, pending = nil, nil, nil
		return nil
	}
	for _, kv := range kvs {
		_, id, ok := r.keys.parseTaskKey(string(kv.Key))
		if !ok {
			continue
		}
		add := r.keys.indexOps(id, false, nil, true, storedLabels(kv.Value))
		if len(ops)+len(add) > MaxTxnOps {
			if err := flush(); err != nil {
				return 0, err
			}
		}
		if len(add) > MaxTxnOps {
			if err := r.indexOne(ctx, string(kv.Key)); err != nil {
				return 0, err
			}
			continue
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
		ops = append(ops, add...)
		pending = append(pending, kv)
	}
	return len(kvs), flush()
}

// indexOne indexes one task as stored now. Index keys that exist already
// are rewritten, which changes nothing a query sees.
func (r *Registry) indexOne(ctx context.Context, key string) error {
	_, id, _ := r.keys.parseTaskKey(key)
	for range casRetries {
		resp, err := r.cli.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("build index: read %s: %w", key, err)
		}
		if len(resp.Kvs) == 0 {
			return nil // deleted since: its writer removed what it had indexed
		}
		kv := resp.Kvs[0]
		// The task itself is not rewritten: a read takes its place.
		w := taskWrite{key: key, modRev: kv.ModRevision,
			ops: append([]clientv3.Op{clientv3.OpGet(key)}, r.keys.indexOps(id, false, nil, true, storedLabels(kv.Value))...)}
		_, ok, err := r.commit(ctx, w)
		if err != nil {
			return fmt.Errorf("build index: %s: %w", key, err)
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("build index: %s: %w, try again", key, ErrContention)
}
