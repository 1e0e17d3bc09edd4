package ring

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("node-%d", i+1)
	}
	return out
}

func mustAssign(t testing.TB, cfg Config, members []string) *Assignment {
	t.Helper()
	a, err := NewAssignment(cfg, members)
	if err != nil {
		t.Fatalf("NewAssignment(%+v, %d members): %v", cfg, len(members), err)
	}
	return a
}

// consistentPanics runs consistent itself on the same input as
// NewAssignment would and reports whether it panics.
func consistentPanics(cfg Config, members []string) (panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()
	ms := make([]consistent.Member, len(members))
	for i, m := range members {
		ms[i] = member{key: m + memberKeySep, idx: uint16(i)}
	}
	consistent.New(ms, consistent.Config{
		Hasher: hasher{}, PartitionCount: cfg.Partitions,
		ReplicationFactor: cfg.ReplicationFactor, Load: cfg.Load,
	})
	return false
}

// checkInvariants verifies what every assignment guarantees.
func checkInvariants(t *testing.T, a *Assignment, cfg Config, members []string) {
	t.Helper()
	want := slices.Sorted(slices.Values(members))
	if got := a.Members(); !slices.Equal(got, want) {
		t.Fatalf("Members() = %v, want %v", got, want)
	}
	if a.Partitions() != cfg.Partitions {
		t.Fatalf("Partitions() = %d, want %d", a.Partitions(), cfg.Partitions)
	}
	n := min(len(members), cfg.Partitions) // the members that own partitions
	capacity := a.Capacity()
	wantCap := math.Min(float64(cfg.Partitions), math.Ceil(float64(cfg.Partitions/n)*cfg.Load))
	if len(members) > cfg.Partitions {
		wantCap = 1 // one partition each
	}
	if capacity != int(wantCap) {
		t.Fatalf("Capacity() = %d, want min(P, ceil(floor(P/N)×Load)), or 1 past P members: %v", capacity, wantCap)
	}
	if bound := math.Ceil(cfg.Load * float64(cfg.Partitions) / float64(n)); float64(capacity) > bound {
		t.Fatalf("Capacity() = %d exceeds ceil(Load×P/N) = %v", capacity, bound)
	}
	loads := a.Loads()
	seen := make([]bool, cfg.Partitions)
	total := 0
	for _, m := range want {
		owned := a.Owned(m)
		if len(owned) != loads[m] {
			t.Fatalf("Owned(%s) has %d partitions, Loads says %d", m, len(owned), loads[m])
		}
		if loads[m] > capacity {
			t.Fatalf("%s owns %d partitions, more than the capacity %d", m, loads[m], capacity)
		}
		if !slices.IsSorted(owned) {
			t.Fatalf("Owned(%s) not ascending: %v", m, owned)
		}
		for _, p := range owned {
			if seen[p] {
				t.Fatalf("partition %d owned twice", p)
			}
			seen[p] = true
			if a.Owner(p) != m {
				t.Fatalf("Owner(%d) = %q, Owned(%s) lists it", p, a.Owner(p), m)
			}
		}
		total += loads[m]
	}
	if total != cfg.Partitions {
		t.Fatalf("loads add up to %d, want %d", total, cfg.Partitions)
	}
}

// Every combination builds and keeps the load bound, past P members too,
// where consistent itself panics and P members own one partition each.
func TestNewAssignment_Sizes(t *testing.T) {
	for _, p := range []int{1, 7, 1024, 4096} {
		for n := 1; n <= 64; n++ {
			cfg := DefaultConfig()
			cfg.Partitions = p
			members := names(n)
			a, err := NewAssignment(cfg, members)
			if err != nil {
				t.Fatalf("P=%d N=%d: %v", p, n, err)
			}
			checkInvariants(t, a, cfg, members)
			if n > p {
				if !consistentPanics(cfg, members) {
					t.Fatalf("P=%d N=%d: consistent does not panic, so standbys are not needed", p, n)
				}
				owning := 0
				for _, l := range a.Loads() {
					if l > 1 {
						t.Fatalf("P=%d N=%d: a member owns %d partitions", p, n, l)
					}
					owning += l
				}
				if owning != p {
					t.Fatalf("P=%d N=%d: %d members own partitions, want %d", p, n, owning, p)
				}
			}
		}
	}
}

// The capacity check is exact: for valid Configs it refuses a member count
// if and only if consistent would panic on it.
func TestCheckRoom_MatchesConsistent(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 800 {
		cfg := Config{
			Partitions:        1 + rng.IntN(64),
			ReplicationFactor: 2 + rng.IntN(4),
			Load:              1 + rng.Float64()*2,
		}
		if rng.IntN(8) == 0 {
			cfg.Load = math.Nextafter(1, 2)
		}
		n := 1 + rng.IntN(80)
		if rng.IntN(2) == 0 { // around the boundary N = P
			n = max(1, cfg.Partitions-2+rng.IntN(5))
		}
		members := names(n)
		refused := checkRoom(cfg, n) != nil
		if panics := consistentPanics(cfg, members); refused != panics {
			t.Fatalf("%+v N=%d: checkRoom refuses=%v, consistent panics=%v", cfg, n, refused, panics)
		}
		if refused != (n > cfg.Partitions) {
			t.Fatalf("%+v N=%d: refused=%v, want N > P", cfg, n, refused)
		}
	}
}

// Invalid inputs that make consistent v0.10.0 panic are refused with an
// error (more members than partitions, which make it panic too, are valid:
// TestNewAssignment_Sizes).
func TestNewAssignment_PanicCombinations(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		members int
		field   string // the ValidationError's
	}{
		{"load 1 and N does not divide P", Config{7, 20, 1.0}, 2, "Load"},
		{"load below 1", Config{1024, 20, 0.5}, 3, "Load"},
		{"negative load", Config{1024, 20, -1}, 3, "Load"},
		{"one ring point for one member", Config{1024, 1, 1.25}, 1, "ReplicationFactor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			members := names(tt.members)
			if !consistentPanics(tt.cfg, members) {
				t.Fatalf("consistent does not panic on %+v with %d members", tt.cfg, tt.members)
			}
			_, err := NewAssignment(tt.cfg, members)
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != tt.field {
				t.Fatalf("err = %v, want a ValidationError on %s", err, tt.field)
			}
		})
	}
}

// With one ring point per member whether consistent panics depends on the
// hashes, even with room to spare: the reason ReplicationFactor 1 is refused.
func TestReplicationFactorOne_PanicsDespiteRoom(t *testing.T) {
	found := false
	for p := 2; p <= 64 && !found; p++ {
		for n := 2; n <= p && !found; n++ {
			cfg := Config{Partitions: p, ReplicationFactor: 1, Load: 1.25}
			if checkRoom(cfg, n) == nil && consistentPanics(cfg, names(n)) {
				t.Logf("P=%d N=%d R=1: capacity %d×%d >= P, consistent still panics", p, n, n, cfg.capacity(n))
				found = true
			}
		}
	}
	if !found {
		t.Fatal("no R=1 panic found with room to spare; the ReplicationFactor >= 2 rule may be stale")
	}
}

// distribute turns a panic from consistent into ErrNoRoom even when the
// up-front check is bypassed.
func TestDistribute_RecoversPanic(t *testing.T) {
	owners, err := distribute(Config{Partitions: 3, ReplicationFactor: 20, Load: 1.25}, names(5))
	if !errors.Is(err, ErrNoRoom) || owners != nil {
		t.Fatalf("distribute = %v, %v; want nil, ErrNoRoom", owners, err)
	}
}

func TestNewAssignment_InvalidInput(t *testing.T) {
	def := DefaultConfig()
	tests := []struct {
		name    string
		cfg     Config
		members []string
		field   string
	}{
		{"zero partitions", Config{0, 20, 1.25}, []string{"a"}, "Partitions"},
		{"negative partitions", Config{-1, 20, 1.25}, []string{"a"}, "Partitions"},
		{"too many partitions", Config{MaxPartitions + 1, 20, 1.25}, []string{"a"}, "Partitions"},
		{"zero replication", Config{1024, 0, 1.25}, []string{"a"}, "ReplicationFactor"},
		{"replication one", Config{1024, 1, 1.25}, []string{"a"}, "ReplicationFactor"},
		{"replication too high", Config{1024, MaxReplicationFactor + 1, 1.25}, []string{"a"}, "ReplicationFactor"},
		{"load one", Config{1024, 20, 1}, []string{"a"}, "Load"},
		{"load zero", Config{1024, 20, 0}, []string{"a"}, "Load"},
		{"load NaN", Config{1024, 20, math.NaN()}, []string{"a"}, "Load"},
		{"load +Inf", Config{1024, 20, math.Inf(1)}, []string{"a"}, "Load"},
		{"nil members", def, nil, "members"},
		{"empty members", def, []string{}, "members"},
		{"empty name", def, []string{"a", ""}, "members"},
		{"duplicate", def, []string{"b", "a", "b"}, "members"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := NewAssignment(tt.cfg, tt.members)
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != tt.field || a != nil {
				t.Fatalf("NewAssignment = %v, %v; want a ValidationError on %s", a, err, tt.field)
			}
			if !strings.HasPrefix(err.Error(), "ring: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestConfig_ValidateDefaults(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (Config{MaxPartitions, 2, math.Nextafter(1, 2)}).Validate(); err != nil {
		t.Fatal(err)
	}
	// A huge but finite Load disables the bound; it must not overflow.
	huge := Config{7, MaxReplicationFactor, math.MaxFloat64}
	a := mustAssign(t, huge, names(7))
	checkInvariants(t, a, huge, names(7))
	if a.Capacity() != 7 {
		t.Fatalf("Capacity() = %d with an unbounded load, want P", a.Capacity())
	}
}

// The bound each member's load obeys is consistent's own:
// ceil(floor(P/N) × Load), across load factors and ring densities.
func TestNewAssignment_Balance(t *testing.T) {
	for _, cfg := range []Config{
		DefaultConfig(),
		{1024, 20, 1.05},
		{1024, 20, 2},
		{1024, 2, 1.25},
		{4096, 100, 1.25},
		{7, 20, 1.25},
	} {
		for _, n := range []int{1, 2, 3, 5, 10, 33, 64} {
			if n > cfg.Partitions {
				continue
			}
			a := mustAssign(t, cfg, names(n))
			checkInvariants(t, a, cfg, names(n))
			lo, hi := cfg.Partitions, 0
			for _, l := range a.Loads() {
				lo, hi = min(lo, l), max(hi, l)
			}
			t.Logf("P=%d R=%d Load=%v N=%d: loads %d..%d, capacity %d, mean %.1f",
				cfg.Partitions, cfg.ReplicationFactor, cfg.Load, n, lo, hi, a.Capacity(), float64(cfg.Partitions)/float64(n))
		}
	}
}

// Every node computes the same owners whatever order it lists members in.
func TestNewAssignment_Deterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 5, 17, 64} {
		for _, cfg := range []Config{DefaultConfig(), {4096, 20, 1.25}, {7, 3, 1.1}} {
			if n > cfg.Partitions {
				continue
			}
			// From 11 members on the names include node-1 and node-11,
			// whose bare ring point names would collide.
			members := names(n)
			ref := mustAssign(t, cfg, members)
			for range 10 {
				shuffled := slices.Clone(members)
				rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				a := mustAssign(t, cfg, shuffled)
				for p := range cfg.Partitions {
					if a.Owner(p) != ref.Owner(p) {
						t.Fatalf("N=%d %+v order %v: partition %d owned by %s, by %s in sorted order",
							n, cfg, shuffled, p, a.Owner(p), ref.Owner(p))
					}
				}
			}
		}
	}
}

// The owners for a given Config and member set must not change between
// releases, or nodes running different versions would disagree.
func TestNewAssignment_Golden(t *testing.T) {
	a := mustAssign(t, Config{16, 20, 1.25}, []string{"c", "a", "b"})
	want := []string{"c", "a", "c", "a", "a", "a", "a", "b", "b", "a", "c", "a", "b", "c", "b", "b"}
	for p, w := range want {
		if got := a.Owner(p); got != w {
			t.Errorf("Owner(%d) = %q, want %q", p, got, w)
		}
	}
	big := mustAssign(t, DefaultConfig(), names(10))
	buf := make([]byte, 0, 2*big.Partitions())
	for _, o := range big.owners {
		buf = append(buf, byte(o), byte(o>>8))
	}
	const wantSum = 0xa007fc1e6f5d3c97
	if got := xxhash.Sum64(buf); got != wantSum {
		t.Errorf("owners of the default config over node-1..node-10 hash to %#x, want %#x", got, uint64(wantSum))
	}
	wantLoads := map[string]int{"node-1": 128, "node-10": 128, "node-2": 115, "node-3": 99, "node-4": 97,
		"node-5": 64, "node-6": 105, "node-7": 77, "node-8": 128, "node-9": 83}
	if got := big.Loads(); !maps.Equal(got, wantLoads) {
		t.Errorf("Loads() = %v, want %v", got, wantLoads)
	}
}

// consistent names ring points name+index; bare names such as node-1 and
// node-11 would share points. The keys NewAssignment gives consistent never
// do.
func TestMemberKeys_DistinctRingPoints(t *testing.T) {
	members := names(64)
	const r = 20
	bare, keyed := map[string]bool{}, map[string]bool{}
	bareDup := 0
	for _, m := range members {
		for i := range r {
			k := fmt.Sprintf("%s%d", m, i)
			if bare[k] {
				bareDup++
			}
			bare[k] = true
			k = fmt.Sprintf("%s%d", m+memberKeySep, i)
			if keyed[k] {
				t.Fatalf("ring point %q shared", k)
			}
			keyed[k] = true
		}
	}
	if bareDup == 0 {
		t.Fatal("expected bare names to share ring points")
	}
	t.Logf("bare names would share %d of %d ring points", bareDup, len(members)*r)
}

// movedBetween counts the partitions whose owner differs.
func movedBetween(a, b *Assignment) int {
	moved := 0
	for p := range a.Partitions() {
		if a.Owner(p) != b.Owner(p) {
			moved++
		}
	}
	return moved
}

// One member joining or leaving moves about P/N partitions while members
// hold many partitions each. The per-member bound is
// ceil(floor(P/N) × Load), so when N crosses a point where floor(P/N) drops
// the bound falls by more than one step and overflow cascades along the
// ring: the bound asserted is 2.5 × P/N for N <= P/32 and 4 × P/N above
// (measured at P=1024: 3.1 × P/N when N goes from 60 to 61, and 11 × P/N
// from 113 to 114, outside this test's range).
func TestNewAssignment_Movement(t *testing.T) {
	for _, p := range []int{1024, 4096} {
		cfg := DefaultConfig()
		cfg.Partitions = p
		worst := map[bool]float64{} // by N <= P/32
		for n := 4; n <= 64; n++ {
			if p == 4096 && n%4 != 0 && n > 8 {
				continue // keep the test quick; P=1024 covers every N
			}
			before := mustAssign(t, cfg, names(n))
			joined := mustAssign(t, cfg, names(n+1)) // node-(n+1) joins
			leaver := fmt.Sprintf("node-%d", n/2)
			left := mustAssign(t, cfg, slices.DeleteFunc(names(n), func(s string) bool { return s == leaver }))

			perMember := float64(p) / float64(n)
			limit := 4.0
			if n <= p/32 {
				limit = 2.5
			}
			for _, c := range []struct {
				event string
				after *Assignment
				own   int // partitions the newcomer gained or the leaver had
			}{
				{"join", joined, len(joined.Owned(fmt.Sprintf("node-%d", n+1)))},
				{"leave", left, len(before.Owned(leaver))},
			} {
				moved := movedBetween(before, c.after)
				ratio := float64(moved) / perMember
				worst[n <= p/32] = max(worst[n <= p/32], ratio)
				if n&(n-1) == 0 || ratio > 2.5 {
					t.Logf("P=%d N=%d %s: moved %d (%.2f × P/N; newcomer's or leaver's share %d), capacity %d -> %d",
						p, n, c.event, moved, ratio, c.own, before.Capacity(), c.after.Capacity())
				}
				if ratio > limit {
					t.Errorf("P=%d N=%d %s: %d partitions moved, %.2f × P/N, limit %.1f", p, n, c.event, moved, ratio, limit)
				}
			}
		}
		t.Logf("P=%d worst moved/(P/N): %.2f for N <= P/32, %.2f above", p, worst[true], worst[false])
	}
}

func TestDiff(t *testing.T) {
	cfg := DefaultConfig()
	a := mustAssign(t, cfg, names(4))
	b := mustAssign(t, cfg, names(5))
	c := mustAssign(t, cfg, names(3))
	pairs := []struct{ prev, next *Assignment }{{nil, a}, {a, nil}, {a, b}, {b, a}, {b, c}, {a, a}, {nil, nil}}
	for _, pr := range pairs {
		for _, m := range append(names(6), "") {
			gained, lost := Diff(pr.prev, pr.next, m)
			var wantGained, wantLost []int
			for p := range cfg.Partitions {
				had := pr.prev != nil && pr.prev.Owner(p) == m
				has := pr.next != nil && pr.next.Owner(p) == m
				if has && !had {
					wantGained = append(wantGained, p)
				}
				if had && !has {
					wantLost = append(wantLost, p)
				}
			}
			if !slices.Equal(gained, wantGained) || !slices.Equal(lost, wantLost) {
				t.Fatalf("Diff(%s): gained %v lost %v, want %v %v", m, gained, lost, wantGained, wantLost)
			}
			// Applying the diff to what m owned gives what it owns now.
			var owned []int
			if pr.prev != nil {
				owned = pr.prev.Owned(m)
			}
			owned = slices.DeleteFunc(owned, func(p int) bool { return slices.Contains(lost, p) })
			owned = append(owned, gained...)
			slices.Sort(owned)
			var now []int
			if pr.next != nil {
				now = pr.next.Owned(m)
			}
			if len(owned) != len(now) || (len(now) > 0 && !slices.Equal(owned, now)) {
				t.Fatalf("Diff(%s) applied gives %v, want %v", m, owned, now)
			}
		}
	}
	if g, _ := Diff(nil, a, "node-1"); !slices.Equal(g, a.Owned("node-1")) {
		t.Fatalf("Diff(nil, a) gained %v, want everything owned %v", g, a.Owned("node-1"))
	}
}

// A partition beyond one side's range counts as not owned there.
func TestDiff_DifferentPartitionCounts(t *testing.T) {
	small := mustAssign(t, Config{7, 20, 1.25}, []string{"a"})
	large := mustAssign(t, Config{9, 20, 1.25}, []string{"a"})
	gained, lost := Diff(small, large, "a")
	if !slices.Equal(gained, []int{7, 8}) || lost != nil {
		t.Fatalf("Diff = %v, %v; want [7 8], []", gained, lost)
	}
}

func TestAssignment_Accessors(t *testing.T) {
	in := []string{"b", "c", "a"}
	a := mustAssign(t, DefaultConfig(), in)
	if !slices.Equal(in, []string{"b", "c", "a"}) {
		t.Fatalf("NewAssignment modified its input: %v", in)
	}
	ms := a.Members()
	ms[0] = "zzz"
	if a.Members()[0] != "a" {
		t.Fatal("Members() exposes the assignment's slice")
	}
	for _, p := range []int{-1, a.Partitions(), a.Partitions() + 100} {
		if got := a.Owner(p); got != "" {
			t.Fatalf("Owner(%d) = %q, want \"\"", p, got)
		}
	}
	if got := a.Owned("nobody"); got != nil {
		t.Fatalf("Owned(nobody) = %v, want nil", got)
	}
	if a.Config() != DefaultConfig() {
		t.Fatalf("Config() = %+v", a.Config())
	}
	if n := testing.AllocsPerRun(100, func() { _ = a.Owner(5) }); n != 0 {
		t.Fatalf("Owner allocates %v times", n)
	}
}

// FuzzNewAssignment: whatever the input, NewAssignment returns an error or
// an assignment that keeps every invariant; it never panics.
func FuzzNewAssignment(f *testing.F) {
	f.Add(1024, 20, 1.25, "a,b,c")
	f.Add(7, 20, 1.25, "1,2,3,4,5,6,7,8")
	f.Add(7, 1, 1.0, "x")
	f.Add(16, 2, 1.01, "node-1,node-11,node-111")
	f.Add(3, 2, 1e300, "a,,b")
	f.Add(3, 2, 1e300, "a,b")
	f.Fuzz(func(t *testing.T, p, r int, load float64, list string) {
		if p > 4096 || r > 64 || len(list) > 2000 {
			t.Skip("keep each run small")
		}
		cfg := Config{Partitions: p, ReplicationFactor: r, Load: load}
		members := strings.Split(list, ",")
		a, err := NewAssignment(cfg, members)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) && !errors.Is(err, ErrNoRoom) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		checkInvariants(t, a, cfg, members)
	})
}

// With more members than partitions the members of lowest hash own them:
// a member that leaves is replaced by a standby, and one that joins ranked
// past the owners moves nothing.
func TestNewAssignment_Standbys(t *testing.T) {
	cfg := Config{Partitions: 2, ReplicationFactor: 20, Load: 1.25}
	members := names(5)
	a, err := NewAssignment(cfg, members)
	if err != nil {
		t.Fatal(err)
	}
	owners := []string{a.Owner(0), a.Owner(1)}
	if owners[0] == owners[1] {
		t.Fatalf("one member owns both partitions: %v", owners)
	}
	for _, m := range members {
		if l := a.Loads()[m]; l == 0 && xxhash.Sum64String(m) < max(xxhash.Sum64String(owners[0]), xxhash.Sum64String(owners[1])) {
			t.Fatalf("%s stands by, but its hash ranks before an owner's", m)
		}
	}
	left := slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == owners[0] })
	b, err := NewAssignment(cfg, left)
	if err != nil {
		t.Fatal(err)
	}
	if b.Owner(0) == "" || b.Owner(1) == "" || b.Owner(0) == owners[0] || b.Owner(1) == owners[0] {
		t.Fatalf("after %s left: owners %q, %q", owners[0], b.Owner(0), b.Owner(1))
	}
	if got := b.Loads()[owners[1]]; got != 1 {
		t.Fatalf("%s, still a member, owns %d partitions, want 1", owners[1], got)
	}
	for i := 0; ; i++ { // a joiner whose hash ranks after both owners'
		j := fmt.Sprintf("joiner-%d", i)
		if xxhash.Sum64String(j) < max(xxhash.Sum64String(owners[0]), xxhash.Sum64String(owners[1])) {
			continue
		}
		c, err := NewAssignment(cfg, append(slices.Clone(members), j))
		if err != nil || c.Owner(0) != owners[0] || c.Owner(1) != owners[1] {
			t.Fatalf("%s joined: owners %q, %q (%v), want %v", j, c.Owner(0), c.Owner(1), err, owners)
		}
		break
	}
}
