package registry

import (
	"context"
	"fmt"

	"github.com/shardcron/shardcron/task"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// ListJSON is ListFunc giving each task of the page as API responses
// write it, the JSON that encoding List's task (without HTML escaping)
// gives, byte for byte, but without decoding it: a stored task is that
// JSON without its partition and version, which are added to it. A stored
// task that is not exactly what the registry writes (written by hand, or
// by a version with other fields) is decoded and encoded again, and one
// that does not decode is an error, as for List. fn must not keep the
// slice it is given past its call.
func (r *Registry) ListJSON(ctx context.Context, opts ListOptions, fn func(task []byte) error) (next string, err error) {
	var buf []byte
	return r.listKV(ctx, opts, func(kv *mvccpb.KeyValue) error {
		if buf, err = r.appendTaskJSON(buf[:0], kv); err != nil {
			return err
		}
		return fn(buf)
	})
}

// appendTaskJSON appends the task of kv as API responses write it: the
// stored JSON with the partition and the version added when it is
// canonical (task.AppendResponse), else decoded and encoded again.
func (r *Registry) appendTaskJSON(dst []byte, kv *mvccpb.KeyValue) ([]byte, error) {
	p, _, _ := r.keys.parseTaskKey(string(kv.Key))
	if out, ok := task.AppendResponse(dst, kv.Value, p, kv.ModRevision); ok {
		return out, nil
	}
	t, err := r.decode(kv)
	if err != nil {
		return dst, err
	}
	b, err := marshalStored(t)
	if err != nil {
		return dst, fmt.Errorf("registry: encode stored task %s: %w", kv.Key, err)
	}
	return append(dst, b...), nil
}
