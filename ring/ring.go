package ring

import (
	"sync"
	"sync/atomic"
)

// Ring holds the current Assignment of a node and swaps it atomically on
// each membership change. Owner and Current are lock-free and may be called
// from any number of goroutines concurrently with Update.
type Ring struct {
	cfg Config

	mu  sync.Mutex                 // serialises Update; lookups never take it
	cur atomic.Pointer[Assignment] // nil until the first successful Update
}

// New returns a Ring with no assignment yet, or the Config's
// *ValidationError.
func New(cfg Config) (*Ring, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Ring{cfg: cfg}, nil
}

// Config returns the Ring's Config.
func (r *Ring) Config() Config { return r.cfg }

// Update builds the assignment for members (in any order), publishes it and
// returns it. If members is the set the current assignment was built from,
// it returns the current assignment itself without rebuilding. On error
// (see NewAssignment) the current assignment stays in place. Concurrent
// Updates are serialised; the last to run wins.
func (r *Ring) Update(members []string) (*Assignment, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sorted, err := sortMembers(members)
	if err != nil {
		return nil, err
	}
	if cur := r.cur.Load(); cur.sameInput(r.cfg, sorted) {
		return cur, nil
	}
	a, err := NewAssignment(r.cfg, sorted)
	if err != nil {
		return nil, err
	}
	r.cur.Store(a)
	return a, nil
}

// Current returns the published assignment, or nil before the first
// successful Update. The assignment is immutable: a later Update publishes
// a new one and leaves this one intact.
func (r *Ring) Current() *Assignment { return r.cur.Load() }

// Owner returns the owner of partition p in the current assignment. ok is
// false before the first successful Update or if p is out of range. It
// takes no lock and never allocates.
func (r *Ring) Owner(p int) (owner string, ok bool) {
	a := r.cur.Load()
	if a == nil || p < 0 || p >= len(a.owners) {
		return "", false
	}
	return a.members[a.owners[p]], true
}
