package task

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"unicode/utf8"
)

// Reading and passing on task JSON as the registry stores it and API
// responses write it (canonical.go): without decoding it through
// encoding/json when it is exactly what the encoder writes.

// taskShape is how the encoder writes a Task; nil when it cannot be
// followed (taskShapeErr says why), and then every task JSON goes through
// encoding/json.
var taskShape, taskShapeErr = shapeOf(reflect.TypeFor[Task]())

// The output-only fields that AppendResponse adds or refuses.
var (
	partitionField = taskField("partition")
	versionField   = taskField("version")
	stateField     = taskField("state")
	// appendable: partition and then version are fields of the shape.
	appendable = taskShape != nil && partitionField >= 0 && versionField == partitionField+1 && stateField > versionField
)

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

// DecodeStored reads task JSON into t, which it overwrites: the Task
// json.Unmarshal reads, read in one pass when data is canonical (what the
// encoder writes, as the registry stores tasks and API responses write
// them), else by json.Unmarshal, whose error it returns. It applies no
// default and checks nothing (DecodeTask does both).
func DecodeStored(data []byte, t *Task) error {
	return decodeInto(data, t, nil, taskShape != nil)
}

// A Projection reads task JSON into T, a struct whose JSON fields are some
// of Task's, with the same names and Go types: the other fields are
// checked, not kept.
type Projection[T any] struct {
	into []int // Go field of T of each field of the task's shape; -1: none
	ok   bool  // T is such a struct: else json.Unmarshal reads it
}

// NewProjection returns the Projection of T. A T whose fields are not
// Task's is read by json.Unmarshal (slower, same result).
func NewProjection[T any]() *Projection[T] {
	p := &Projection[T]{}
	if taskShape == nil {
		return p
	}
	dst, err := shapeOf(reflect.TypeFor[T]())
	if err != nil || dst.kind != kindStruct {
		return p
	}
	taskType := reflect.TypeFor[Task]()
	p.into = make([]int, len(taskShape.fields))
	for k, f := range taskShape.fields {
		p.into[k] = -1
		for _, g := range dst.fields {
			if g.name == f.name {
				if reflect.TypeFor[T]().Field(g.index).Type != taskType.Field(f.index).Type {
					return p
				}
				p.into[k] = g.index
			}
		}
	}
	for _, g := range dst.fields {
		if taskField(g.name) < 0 {
			return p // a field that Task has not
		}
	}
	p.ok = true
	return p
}

// Decode reads data into dst, which it overwrites, as DecodeStored does.
func (p *Projection[T]) Decode(data []byte, dst *T) error {
	return decodeInto(data, dst, p.into, p.ok)
}

func decodeInto[T any](data []byte, dst *T, into []int, walk bool) error {
	var zero T
	*dst = zero
	if walk && utf8.Valid(data) {
		if end, _, ok := taskShape.walkStruct(data, 0, reflect.ValueOf(dst).Elem(), into); ok && end == len(data) {
			return nil
		}
		*dst = zero // half set
	}
	return json.Unmarshal(data, dst)
}

// AppendResponse appends stored, a task's JSON as the registry stores it,
// with the output-only fields partition and version (when not 0) where the
// encoder writes them: the bytes that encoding the task decoded from stored,
// with those two set, gives. It does so only when stored is canonical and
// has no partition, version or state; else ok is false and dst is
// returned as it is.
func AppendResponse(dst, stored []byte, partition int, version int64) (out []byte, ok bool) {
	if !appendable || !utf8.Valid(stored) {
		return dst, false
	}
	insert := -1 // the offset of the first key after version
	end, closing, ok := taskShape.walkStruct(stored, 0, reflect.Value{}, nil, func(field, off int) bool {
		switch field {
		case partitionField, versionField, stateField:
			return false // a stored task has none
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

// CheckShape returns why task JSON cannot be read or passed on without
// encoding/json, nil when it can (a test keeps it so).
func CheckShape() error {
	if taskShapeErr != nil {
		return fmt.Errorf("task: the shape of Task is not followed: %w", taskShapeErr)
	}
	if !appendable {
		return fmt.Errorf("task: partition, version and state are not output fields of Task in that order")
	}
	return nil
}
