package engine

import (
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/shardcron/shardcron/task"
)

// Shapes: how the Badger cache keeps tasks that share their firing fields,
// so that a warm restart decodes each distinct shape once, not each task.
//
// A task's shape is what its fires depend on apart from its id: schedule,
// time zone, pause, executor and policies. Fleets hold many tasks of one
// shape (a million tasks calling the same endpoint every minute). The
// cache keeps a task either as etcd holds it (its JSON, which starts with
// '{') or, once another task of its shape was seen, as shapeMark followed
// by the JSON of the shape alone: no id, labels or times. Tasks of one
// shape then have byte-equal cached values, and a load decodes the first
// and reuses it for the others (decoder.fromShape). A task whose fires
// depend on its times (a window, max_fires, an @at time, delete_after_fire)
// has no shape: it is cached as etcd holds it.
//
// A cache written before shapes holds JSON only, which loads as before; a
// node that does not know shapes finds a shape undecodable and reads the
// partition from etcd (prepareCached).

// shapeMark starts a cached value holding a shape. JSON never starts with it.
const shapeMark = 0x01

// maxShapes bounds shapeCodes: past it, the codes are forgotten and learnt
// again (each costs one more task cached as JSON).
const maxShapes = 1 << 14

// shape is a decoded shape, shared by the tasks of one load that have it.
type shape struct {
	spec, zone string
	paused     bool
	prof       *profile
}

// shapeCodes remembers the cache encodings of the shapes this node has
// seen, so that encoding one costs a marshal per shape, not per task. A
// shape seen once has no code yet: a task alone of its shape stays JSON.
type shapeCodes struct {
	mu    sync.Mutex        // guards codes
	codes map[string][]byte // by shape key (appendShapeKey): nil after one task, the code after two
}

// code returns the cache value of t, a plain task whose shape key is
// key, or nil when no other task of this shape was seen yet or the shape
// cannot be encoded. The value returned is shared: not to be modified.
func (s *shapeCodes) code(key []byte, t *task.Task) []byte {
	s.mu.Lock()
	c, seen := s.codes[string(key)]
	if c != nil || !seen {
		if !seen {
			if s.codes == nil || len(s.codes) >= maxShapes {
				s.codes = make(map[string][]byte)
			}
			s.codes[string(key)] = nil
		}
		s.mu.Unlock()
		return c
	}
	s.mu.Unlock()
	c, err := encodeShape(t)
	if err != nil {
		return nil // cached as JSON, as before shapes
	}
	s.mu.Lock()
	if _, ok := s.codes[string(key)]; ok {
		s.codes[string(key)] = c
	}
	s.mu.Unlock()
	return c
}

// encodeShape returns the cache value of t's shape: shapeMark and the JSON
// of its firing fields without id, labels and times.
func encodeShape(t *task.Task) ([]byte, error) {
	c := *t
	c.ID, c.Labels, c.CreatedAt, c.UpdatedAt = "", nil, time.Time{}, time.Time{}
	c.Partition, c.Version, c.State, c.Pause = nil, 0, nil, nil
	b, err := json.Marshal(&c)
	if err != nil {
		return nil, err
	}
	return append([]byte{shapeMark}, b...), nil
}

// appendShapeKey appends the key of a plain task's shape to b: the tasks
// with one key have one profile (appendProfileKey, whose test keeps it complete)
// and the same schedule, time zone and pause, so one shape stands for all
// of them.
func appendShapeKey(b, profKey []byte, t *task.Task) []byte {
	b = append(b, profKey...)
	for _, s := range []string{t.Schedule, t.Timezone} {
		b = append(strconv.AppendInt(append(b, '|'), int64(len(s)), 10), ':')
		b = append(b, s...)
	}
	return strconv.AppendBool(append(b, '|'), t.Paused)
}

// plain reports whether t's fires depend on nothing but its shape and id:
// no window, max_fires or deletion, whose times are the task's own.
func plain(t *task.Task, spec string) bool {
	return spec == t.Schedule && t.NotBefore.IsZero() && t.NotAfter.IsZero() && t.MaxFires == 0 && !t.DeleteAfterFire
}
