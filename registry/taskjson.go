package registry

import (
	"context"
	"fmt"

	"github.com/shardcron/shardcron/task"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// ListJSON is ListFunc giving each task of the page as API responses
// write it, without decoding it: the stored JSON with its partition and
// version added (task.AppendResponse), for a task the registry wrote the
// bytes that encoding List's task (without HTML escaping) gives. A stored
// value is checked as JSON, not as a task: one that is not a JSON object,
// or that holds a field only responses write, is an error (a corrupt
// stored task), and one written by hand is passed on as it is. fn must
// not keep the slice it is given past its call.
func (r *Registry) ListJSON(ctx context.Context, opts ListOptions, fn func(task []byte) error) (next string, err error) {
	var buf []byte
	return r.listKV(ctx, opts, func(kv *mvccpb.KeyValue) error {
		if buf, err = r.appendTaskJSON(buf[:0], kv); err != nil {
			return err
		}
		return fn(buf)
	})
}

// appendTaskJSON appends the task of kv as API responses write it.
func (r *Registry) appendTaskJSON(dst []byte, kv *mvccpb.KeyValue) ([]byte, error) {
	p, _, _ := r.keys.parseTaskKey(string(kv.Key))
	out, err := task.AppendResponse(dst, kv.Value, p, kv.ModRevision)
	if err != nil {
		return dst, fmt.Errorf("registry: stored task %s is corrupt: %w", kv.Key, err)
	}
	return out, nil
}
