package schedule

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestTable_Intern(t *testing.T) {
	var tab Table // the zero value is ready
	if tab.Len() != 0 || tab.Get(0) != nil || tab.Get(1) != nil {
		t.Fatal("empty table is not empty")
	}
	intern := func(spec, zone, id string) Handle {
		t.Helper()
		h, err := tab.Intern(spec, zone, id)
		if err != nil {
			t.Fatalf("Intern(%q, %q): %v", spec, zone, err)
		}
		if h == 0 {
			t.Fatalf("Intern(%q, %q) issued handle 0", spec, zone)
		}
		return h
	}
	hourly := intern("0 * * * *", "", "a")
	for _, spec := range []string{"0 * * * *", "0 0 * * * *", "@hourly", "  0   0 * * * *", "0 0 0-23 * * *"} {
		if h := intern(spec, "UTC", "b"); h != hourly {
			t.Errorf("%q: handle %d, want %d (same schedule)", spec, h, hourly)
		}
	}
	berlin := intern("@hourly", "Europe/Berlin", "a")
	if berlin == hourly {
		t.Error("same spec in another zone shares a handle")
	}
	every := intern("@every 1m", "UTC", "a")
	if h := intern("@every 60s", "Asia/Tokyo", "b"); h != every {
		t.Errorf("@every in another zone: handle %d, want %d (zones do not matter)", h, every)
	}
	if got, want := tab.Len(), 3; got != want {
		t.Errorf("Len = %d, want %d", got, want)
	}
	// Errors add nothing.
	for _, c := range [][2]string{{"61 * * * * *", "UTC"}, {"* * * * *", "Mars/Olympus"}, {"@every 1m", "Mars/Olympus"}} {
		var se *Error
		if _, err := tab.Intern(c[0], c[1], "a"); !errors.As(err, &se) {
			t.Errorf("Intern(%q, %q) = %v, want a *Error", c[0], c[1], err)
		}
	}
	if got := tab.Len(); got != 3 {
		t.Errorf("Len after errors = %d, want 3", got)
	}
	// Get returns the schedule itself.
	from := utc(2026, 7, 1, 10, 30, 0)
	if got := tab.Get(berlin).Next(from); !got.Equal(utc(2026, 7, 1, 11, 0, 0)) {
		t.Errorf("Get(berlin).Next = %v", got)
	}
	if tab.Get(Handle(tab.Len()+1)) != nil || tab.Get(1<<31) != nil {
		t.Error("Get of an unissued handle is not nil")
	}
}

func TestTable_HSpecsShare(t *testing.T) {
	tab := NewTable()
	handles := map[Handle]bool{}
	for i := range 10_000 {
		h, err := tab.Intern("H * * * *", "Europe/Berlin", fmt.Sprint("task-", i))
		if err != nil {
			t.Fatal(err)
		}
		handles[h] = true
	}
	if tab.Len() != 60 || len(handles) != 60 {
		t.Errorf("10000 ids with H * * * *: %d schedules, %d handles, want 60", tab.Len(), len(handles))
	}
}

func TestTable_ManySchedules(t *testing.T) {
	tab := NewTable()
	const n = 3*chunkSize + 7 // several chunks
	hs := make([]Handle, n)
	for i := range hs {
		h, err := tab.Intern(fmt.Sprintf("@every %ds", i+1), "", "id")
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = h
	}
	if tab.Len() != n {
		t.Fatalf("Len = %d, want %d", tab.Len(), n)
	}
	for i, h := range hs {
		want := time.Unix(int64(i+1), 0)
		if got := tab.Get(h).Next(time.Unix(0, 0)); !got.Equal(want) {
			t.Fatalf("handle %d: Next(0) = %v, want %v", h, got, want)
		}
	}
}

// TestTable_Concurrent interns and reads from many goroutines (run with -race).
func TestTable_Concurrent(t *testing.T) {
	tab := NewTable()
	const workers, per = 8, 2000
	results := make([][]Handle, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				spec := fmt.Sprintf("@every %ds", 1+i%1500)
				h, err := tab.Intern(spec, "", "id")
				if err != nil {
					t.Error(err)
					return
				}
				if tab.Get(h) == nil {
					t.Errorf("Get(%d) = nil right after Intern", h)
					return
				}
				results[w] = append(results[w], h)
			}
		}()
	}
	wg.Wait()
	for w := 1; w < workers; w++ {
		for i := range results[w] {
			if results[w][i] != results[0][i] {
				t.Fatalf("worker %d, spec %d: handle %d, worker 0 got %d", w, i, results[w][i], results[0][i])
			}
		}
	}
	if tab.Len() != 1500 {
		t.Errorf("Len = %d, want 1500", tab.Len())
	}
}

// A zone Parse refuses as some hosts' only (portable) is still interned
// where the host has it: a task written before the refusal keeps firing.
func TestTable_InternsAZoneParseRefuses(t *testing.T) {
	const zone = "posix/Europe/Berlin"
	if _, err := time.LoadLocation(zone); err != nil {
		t.Skipf("this host has no %s: %v", zone, err)
	}
	if _, err := Parse("0 * * * *", zone, "id"); err == nil {
		t.Errorf("Parse took %q", zone)
	}
	if _, err := NewTable().Intern("0 * * * *", zone, "id"); err != nil {
		t.Errorf("Intern(%q): %v", zone, err)
	}
}
