package schedule

import (
	"strings"
	"sync"
	"sync/atomic"
)

// Handle names a schedule interned in a Table. The zero Handle is never
// issued, so it can mean "no schedule" in a record.
type Handle uint32

const (
	chunkBits = 10
	chunkSize = 1 << chunkBits
)

// chunk holds the schedules of chunkSize consecutive handles. Slots are
// written once, before their handle is returned, and read without locks.
type chunk [chunkSize]atomic.Pointer[entry]

type entry struct{ s Schedule }

// textKey identifies an interned schedule by its resolved text, which lets
// Intern skip robfig's parser for a spec it has seen.
type textKey struct{ resolved, zone string }

// Table interns schedules: all tasks whose specs resolve to the same schedule
// in the same time zone share one Schedule, named by a small Handle, so task
// records can stay free of pointers. The zero value is ready to use; a Table
// is safe for concurrent use and Get takes no lock.
//
// Schedules are never removed: a Table holds every distinct schedule ever
// interned. There are few in practice (H specs multiply them by at most the
// number of values of their H fields: "H * * * *" yields at most 60).
type Table struct {
	mu     sync.Mutex               // guards byText, byRaw, byKey and growth of chunks
	byText map[textKey]Handle       // resolved text and zone -> handle
	byRaw  map[textKey]Handle       // text as given, without H fields, and zone -> handle
	byKey  map[key]Handle           // equivalent schedules -> handle
	next   Handle                   // the next handle to issue, under mu
	chunks atomic.Pointer[[]*chunk] // copied on growth, so Get needs no lock
}

// NewTable returns an empty Table.
func NewTable() *Table { return &Table{} }

// Intern parses spec in zone for task taskID like Parse and returns the
// handle of the equal schedule already in the table, or adds it. Two specs
// share a handle when they resolve to the same fire times in the same zone
// ("H * * * *" for two ids whose H is the same minute, "0 * * * *" and
// "0 0 * * * *", "@hourly"); @every schedules are shared across zones,
// which they ignore. Errors are those of Parse; nothing is added then.
func (t *Table) Intern(spec, zone, taskID string) (Handle, error) {
	// A spec without H fields means the same for every task: found by its
	// text alone, it needs no parsing (a partition load interns one spec
	// per task).
	raw := !strings.ContainsRune(spec, 'H')
	if raw {
		t.mu.Lock()
		h, ok := t.byRaw[textKey{resolved: spec, zone: zone}]
		t.mu.Unlock()
		if ok {
			return h, nil
		}
	}
	p, err := parseSpec(spec, taskID)
	if err != nil {
		return 0, err
	}
	tk := textKey{resolved: p.resolved, zone: zone}
	if zone == "" {
		tk.zone = "UTC"
	}
	if p.every > 0 {
		tk.zone = "" // @every ignores the zone, but the zone must still be valid
		if _, err := loadZone(zone); err != nil {
			return 0, err
		}
	}
	t.mu.Lock()
	h, ok := t.byText[tk]
	t.mu.Unlock()
	if ok {
		return h, nil
	}

	// Parse outside the lock: it costs microseconds.
	s, k, err := parse(spec, zone, taskID)
	if err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if h, ok := t.byText[tk]; ok {
		return h, nil
	}
	if t.byText == nil {
		t.byText = make(map[textKey]Handle)
		t.byKey = make(map[key]Handle)
		t.byRaw = make(map[textKey]Handle)
	}
	h, ok = t.byKey[k]
	if !ok {
		h = t.add(s)
		t.byKey[k] = h
	}
	t.byText[tk] = h
	if raw {
		t.byRaw[textKey{resolved: spec, zone: zone}] = h
	}
	return h, nil
}

// add stores s under a new handle. Called with mu held.
func (t *Table) add(s Schedule) Handle {
	if t.next == 0 {
		t.next = 1
	}
	h := t.next
	t.next++
	ci := int(h >> chunkBits)
	var cs []*chunk
	if p := t.chunks.Load(); p != nil {
		cs = *p
	}
	if ci == len(cs) {
		grown := make([]*chunk, len(cs)+1, len(cs)+1+len(cs)/4)
		copy(grown, cs)
		grown[ci] = new(chunk)
		cs = grown
		t.chunks.Store(&cs)
	}
	cs[ci][h&(chunkSize-1)].Store(&entry{s: s})
	return h
}

// Get returns the schedule of h, or nil for a handle this table did not
// issue. It takes no lock.
func (t *Table) Get(h Handle) Schedule {
	p := t.chunks.Load()
	if p == nil {
		return nil
	}
	ci := int(h >> chunkBits)
	if ci >= len(*p) {
		return nil
	}
	e := (*p)[ci][h&(chunkSize-1)].Load()
	if e == nil {
		return nil
	}
	return e.s
}

// Len returns the number of distinct schedules in the table.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.next == 0 {
		return 0
	}
	return int(t.next) - 1
}
