package ring

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

func TestNew_InvalidConfig(t *testing.T) {
	r, err := New(Config{Partitions: 0, ReplicationFactor: 20, Load: 1.25})
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Field != "Partitions" || r != nil {
		t.Fatalf("New = %v, %v; want a ValidationError on Partitions", r, err)
	}
}

func TestRing_Update(t *testing.T) {
	r, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if r.Current() != nil {
		t.Fatal("Current() before Update is not nil")
	}
	if o, ok := r.Owner(0); ok || o != "" {
		t.Fatalf("Owner(0) before Update = %q, %v", o, ok)
	}

	a, err := r.Update([]string{"b", "a", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Current() != a {
		t.Fatal("Current() is not the assignment Update returned")
	}
	want := mustAssign(t, DefaultConfig(), []string{"a", "b", "c"})
	for p := range want.Partitions() {
		if o, ok := r.Owner(p); !ok || o != want.Owner(p) {
			t.Fatalf("Owner(%d) = %q, %v; want %q", p, o, ok, want.Owner(p))
		}
	}
	for _, p := range []int{-1, want.Partitions()} {
		if o, ok := r.Owner(p); ok || o != "" {
			t.Fatalf("Owner(%d) = %q, %v; want out of range", p, o, ok)
		}
	}

	// The same set in another order is not rebuilt.
	same, err := r.Update([]string{"c", "b", "a"})
	if err != nil || same != a {
		t.Fatalf("Update(same set) = %p, %v; want the current %p", same, err, a)
	}

	// A failed Update leaves the current assignment in place.
	for _, bad := range [][]string{nil, {"a", "a"}, {""}} {
		if got, err := r.Update(bad); err == nil || got != nil {
			t.Fatalf("Update(%q) = %v, %v; want an error", bad, got, err)
		}
		if r.Current() != a {
			t.Fatalf("Update(%q) failed but replaced the assignment", bad)
		}
	}
	small, _ := New(Config{Partitions: 2, ReplicationFactor: 20, Load: 1.25})
	if s, err := small.Update([]string{"a", "b", "c"}); err != nil || s.Owner(0) == "" || s.Owner(1) == "" {
		t.Fatalf("Update(3 members, 2 partitions) = %v, want an owner for each partition", err)
	}

	b, err := r.Update([]string{"a", "b", "c", "d"})
	if err != nil || b == a || r.Current() != b {
		t.Fatalf("Update(new set) = %p, %v; current %p", b, err, r.Current())
	}
	// The old snapshot is untouched.
	if !slices.Equal(a.Members(), []string{"a", "b", "c"}) {
		t.Fatalf("old assignment changed: %v", a.Members())
	}
}

func TestRing_OwnerNoAlloc(t *testing.T) {
	r, _ := New(DefaultConfig())
	if _, err := r.Update(names(5)); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = r.Owner(17) }); n != 0 {
		t.Fatalf("Owner allocates %v times", n)
	}
}

// Lookups run concurrently with Updates from two goroutines (run with
// -race); every lookup sees one complete assignment or the other.
func TestRing_ConcurrentUpdateAndOwner(t *testing.T) {
	r, _ := New(DefaultConfig())
	setA, setB := names(3), names(7)
	a, _ := r.Update(setA)
	b := mustAssign(t, DefaultConfig(), setB)

	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for range 4 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				p := i % a.Partitions()
				o, ok := r.Owner(p)
				if !ok || (o != a.Owner(p) && o != b.Owner(p)) {
					errs <- o
					return
				}
				if cur := r.Current(); cur.Owner(p) != a.Owner(p) && cur.Owner(p) != b.Owner(p) {
					errs <- cur.Owner(p)
					return
				}
			}
		})
	}
	var updaters sync.WaitGroup
	for u := range 2 {
		updaters.Go(func() {
			for i := range 50 {
				set := setA
				if (i+u)%2 == 0 {
					set = setB
				}
				if _, err := r.Update(set); err != nil {
					t.Error(err)
				}
			}
		})
	}
	updaters.Wait()
	stop.Store(true)
	wg.Wait()
	close(errs)
	for o := range errs {
		t.Errorf("lookup returned %q, owner in neither assignment", o)
	}
}
