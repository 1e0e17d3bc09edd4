package registry

import (
	"context"
	"fmt"
	"reflect"
	"strconv"

	"github.com/shardcron/shardcron/task"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// taskShape is how the encoder writes a task.Task; nil (taskShapeErr says
// why) when it cannot be followed, and then every task is decoded.
var taskShape, taskShapeErr = shapeOf(reflect.TypeFor[task.Task]())

// The fields a stored task leaves out and decode sets or clears.
var (
	partitionField = taskField("partition")
	versionField   = taskField("version")
	stateField     = taskField("state")
)

// passThrough: stored tasks can be passed on, the shape of task.Task being
// followed, with partition and then version among its fields.
var passThrough = taskShape != nil && partitionField >= 0 && versionField == partitionField+1 && stateField > versionField

func taskField(name string) int {
	if taskShape != nil {
		for i, f := range taskShape.fields {
			if f.name == name {
				return i
			}
		}
	}
	return -1
}

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
// canonical (appendStored), else decoded and encoded again.
func (r *Registry) appendTaskJSON(dst []byte, kv *mvccpb.KeyValue) ([]byte, error) {
	p, _, _ := r.keys.parseTaskKey(string(kv.Key))
	if out, ok := appendStored(dst, kv.Value, p, kv.ModRevision); ok {
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

// appendStored appends stored with the fields decode sets, partition and
// version, where the encoder writes them (before created_at), when stored
// is canonical: exactly the JSON the encoder writes for what it decodes to.
// ok is false otherwise, and dst is returned unchanged.
func appendStored(dst, stored []byte, partition int, version int64) (out []byte, ok bool) {
	if !passThrough || !validText(stored) {
		return dst, false
	}
	insert := -1 // the offset of the first key after version
	end, closing, ok := taskShape.canonicalStruct(stored, 0, func(field, off int) bool {
		switch field {
		case partitionField, versionField, stateField:
			return false // a stored task has none: decode would replace them
		}
		if insert < 0 && field > versionField {
			insert = off
		}
		return true
	})
	if !ok || end != len(stored) {
		return dst, false
	}
	if insert < 0 { // no field after version: they end the object
		dst = append(dst, stored[:closing]...)
		dst = appendOutputFields(append(dst, ','), partition, version)
		return append(dst, stored[closing:]...), true
	}
	dst = append(dst, stored[:insert]...)
	dst = append(appendOutputFields(dst, partition, version), ',')
	return append(dst, stored[insert:]...), true
}

// appendOutputFields appends "partition":p and, when not 0 (omitempty),
// "version":v.
func appendOutputFields(dst []byte, partition int, version int64) []byte {
	dst = strconv.AppendInt(append(dst, `"partition":`...), int64(partition), 10)
	if version != 0 {
		dst = strconv.AppendInt(append(dst, `,"version":`...), version, 10)
	}
	return dst
}
