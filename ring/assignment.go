package ring

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// Assignment is the owner of every partition for one member set under one
// Config. It is immutable once built, so any number of goroutines may read
// it without synchronisation.
type Assignment struct {
	cfg     Config
	members []string // sorted, distinct
	owners  []uint16 // owners[p] indexes members; P <= MaxPartitions
	loads   []int    // loads[i]: partitions owned by members[i]
}

// NewAssignment computes the owner of each of cfg.Partitions partitions
// among members. The order of members does not matter; the slice is not
// modified or retained.
//
// With more members than partitions, the P members of lowest xxhash own
// one partition each and the others stand by with none (active): a member
// that joins ranked past those P moves nothing, and one of them that
// leaves is replaced by a standby. (Going from P to P+1 members moves
// more: the bound falls from consistent's to one partition a member.)
//
// It returns a *ValidationError if cfg is invalid or if members is empty,
// larger than MaxPartitions, or contains an empty name or the same name
// twice.
func NewAssignment(cfg Config, members []string) (*Assignment, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sorted, err := sortMembers(members)
	if err != nil {
		return nil, err
	}
	act := active(sorted, cfg.Partitions)
	if err := checkRoom(cfg, len(act)); err != nil {
		return nil, err
	}
	dcfg := cfg
	if len(act) < len(sorted) {
		dcfg.Load = 1 // one partition each: P members and P partitions
	}
	owners, err := distribute(dcfg, act)
	if err != nil {
		return nil, err
	}
	if len(act) < len(sorted) {
		for p, o := range owners {
			i, _ := slices.BinarySearch(sorted, act[o])
			owners[p] = uint16(i)
		}
	}
	a := &Assignment{cfg: cfg, members: sorted, owners: owners, loads: make([]int, len(sorted))}
	for _, o := range owners {
		a.loads[o]++
	}
	return a, nil
}

// sortMembers returns a sorted copy of members, refusing an empty set, more
// members than an owner index holds, empty names and duplicates.
func sortMembers(members []string) ([]string, error) {
	switch {
	case len(members) == 0:
		return nil, &ValidationError{"members", "empty member set"}
	case len(members) > MaxPartitions:
		return nil, &ValidationError{"members", fmt.Sprintf("%d members, at most %d", len(members), MaxPartitions)}
	}
	sorted := slices.Clone(members)
	slices.Sort(sorted)
	if sorted[0] == "" {
		return nil, &ValidationError{"members", "empty member name"}
	}
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, &ValidationError{"members", fmt.Sprintf("duplicate member %q", sorted[i])}
		}
	}
	return sorted, nil
}

// active returns the members that own partitions, sorted: all of sorted
// when they are at most p, else the p of lowest xxhash of their names.
// consistent cannot place fewer partitions than members (its bound,
// floor(P/N) × Load, is 0), and a choice by hash, unlike one by name,
// moves nothing when a member that ranks after the p joins.
func active(sorted []string, p int) []string {
	if len(sorted) <= p {
		return sorted
	}
	byHash := slices.Clone(sorted)
	slices.SortFunc(byHash, func(a, b string) int {
		if c := cmp.Compare(xxhash.Sum64String(a), xxhash.Sum64String(b)); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	byHash = byHash[:p]
	slices.Sort(byHash)
	return byHash
}

// checkRoom refuses the member counts for which consistent would panic.
// consistent places partitions one by one, each on the first ring point at
// or after its hash whose member holds fewer than capacity(n) partitions,
// so it panics exactly when n × capacity(n) < P (given a valid Config: with
// at least two points per member, every member with room is reachable).
// With Load > 1 that happens only when n > P, where floor(P/n) = 0.
func checkRoom(cfg Config, n int) error {
	if c := cfg.capacity(n); n*c < cfg.Partitions {
		return fmt.Errorf("%w: %d members, %d partitions, at most %d partitions per member: use more partitions or fewer members",
			ErrNoRoom, n, cfg.Partitions, c)
	}
	return nil
}

// distribute runs consistent over the sorted members and copies the owner
// of every partition out of it. consistent is a third-party border: should
// it panic despite checkRoom, the panic becomes an error.
func distribute(cfg Config, sorted []string) (owners []uint16, err error) {
	defer func() {
		if r := recover(); r != nil {
			owners = nil
			if s, ok := r.(string); ok && strings.Contains(s, "not enough room") {
				err = fmt.Errorf("%w: consistent panicked with %d members, %d partitions, replication factor %d, load %v",
					ErrNoRoom, len(sorted), cfg.Partitions, cfg.ReplicationFactor, cfg.Load)
				return
			}
			err = fmt.Errorf("ring: consistent panicked: %v", r)
		}
	}()
	ms := make([]consistent.Member, len(sorted))
	for i, name := range sorted {
		ms[i] = member{key: name + memberKeySep, idx: uint16(i)}
	}
	c := consistent.New(ms, consistent.Config{
		Hasher:            hasher{},
		PartitionCount:    cfg.Partitions,
		ReplicationFactor: cfg.ReplicationFactor,
		Load:              cfg.Load,
	})
	owners = make([]uint16, cfg.Partitions)
	for p := range owners {
		m, ok := c.GetPartitionOwner(p).(member)
		if !ok {
			return nil, fmt.Errorf("ring: consistent left partition %d without an owner", p)
		}
		owners[p] = m.idx
	}
	return owners, nil
}

// memberKeySep ends every member's key on the hash ring. consistent names
// the ring points of a member fmt.Sprintf("%s%d", key, i), so with bare
// names "node-1" point 10 and "node-11" point 0 are the same string, and
// one of the two members silently loses half of its 20 points. With a
// non-digit suffix the last '#' of a point's name always ends the member's
// key, so distinct members never share a point name.
const memberKeySep = "#"

// member is what consistent holds for one member: its ring key and its
// index in the sorted member list, so an owner maps back without a lookup.
type member struct {
	key string
	idx uint16
}

func (m member) String() string { return m.key }

// hasher hashes ring points and partition numbers for consistent.
type hasher struct{}

func (hasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// Config returns the Config the assignment was built with.
func (a *Assignment) Config() Config { return a.cfg }

// Partitions returns P, the number of partitions.
func (a *Assignment) Partitions() int { return len(a.owners) }

// Capacity returns the most partitions any member may own:
// min(P, ceil(floor(P/N) × Load)), or 1 with more members than partitions.
// Every entry of Loads is at most Capacity.
func (a *Assignment) Capacity() int {
	if len(a.members) > a.cfg.Partitions {
		return 1
	}
	return a.cfg.capacity(len(a.members))
}

// Owner returns the member that owns partition p, or "" if p is not in
// [0, Partitions()). It never allocates.
func (a *Assignment) Owner(p int) string {
	if p < 0 || p >= len(a.owners) {
		return ""
	}
	return a.members[a.owners[p]]
}

// Owned returns the partitions owned by member in ascending order, in a new
// slice; nil if member is not in the assignment.
func (a *Assignment) Owned(member string) []int {
	i := a.index(member)
	if i < 0 {
		return nil
	}
	out := make([]int, 0, a.loads[i])
	for p, o := range a.owners {
		if int(o) == i {
			out = append(out, p)
		}
	}
	return out
}

// Members returns the member names in ascending order, in a new slice.
func (a *Assignment) Members() []string { return slices.Clone(a.members) }

// Loads returns the number of partitions each member owns, in a new map.
// Every member is present; the values add up to Partitions().
func (a *Assignment) Loads() map[string]int {
	out := make(map[string]int, len(a.members))
	for i, m := range a.members {
		out[m] = a.loads[i]
	}
	return out
}

// index returns the position of member in a.members, or -1.
func (a *Assignment) index(member string) int {
	if a == nil {
		return -1
	}
	i, ok := slices.BinarySearch(a.members, member)
	if !ok {
		return -1
	}
	return i
}

// sameInput reports whether a was built from the same Config and member set.
func (a *Assignment) sameInput(cfg Config, sorted []string) bool {
	return a != nil && a.cfg == cfg && slices.Equal(a.members, sorted)
}

// Diff returns, in ascending order, the partitions member owns in next but
// not in prev (gained) and those it owns in prev but not in next (lost).
// A nil prev or next owns nothing, so Diff(nil, a, m) is everything m owns
// in a. Partitions are compared by number; a partition beyond one side's
// Partitions() counts as not owned there.
func Diff(prev, next *Assignment, member string) (gained, lost []int) {
	pi, ni := prev.index(member), next.index(member)
	n := 0
	if prev != nil {
		n = len(prev.owners)
	}
	if next != nil {
		n = max(n, len(next.owners))
	}
	for p := range n {
		had := pi >= 0 && p < len(prev.owners) && int(prev.owners[p]) == pi
		has := ni >= 0 && p < len(next.owners) && int(next.owners[p]) == ni
		switch {
		case has && !had:
			gained = append(gained, p)
		case had && !has:
			lost = append(lost, p)
		}
	}
	return gained, lost
}
