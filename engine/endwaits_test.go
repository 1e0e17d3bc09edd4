package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// After a crash or a fence the next owner takes the marks of ended paused
// tasks (flagEndWaits) from the session's watermark key: from its value,
// or from the value it names as its base, which a value names only when
// its marks are the base's (marks that changed make a value that carries
// them all). A value written by a node of the version before the marks
// has none. The marks go with a revision of their own, taken whatever
// the watermark, even one the acquire's resume point is past.
func TestEngine_ResumeAfterACrashTakesTheSessionsEndWaits(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e, cli := resumingEngine(t, base)
	ctx := context.Background()
	key := e.keys.watermark("node-a", "s1")
	named := func(w time.Time) {
		t.Helper()
		b, _ := json.Marshal(checkpoint{Node: "node-a", Session: "s1", Watermark: w})
		putKey(t, cli, e.keys.checkpoint(0), string(b))
	}
	check := func(what string, want endWaits) {
		t.Helper()
		res, err := e.resume(ctx, 0, newDeadMarks())
		if err != nil {
			t.Fatal(err)
		}
		got := res.ends
		if got.Applied != want.Applied || !slices.Equal(got.IDs, want.IDs) {
			t.Errorf("%s: resumed with the marks %+v, want %+v", what, got, want)
		}
	}
	w := base.Add(10 * time.Second).UnixNano()
	a := appliedRevs{armed: map[int]int64{}}
	for p := range 8 {
		a.armed[p] = int64(40 + p)
	}
	write := func(ends map[int]endWaits) (whole bool) {
		t.Helper()
		v, whole := a.value(w, nil, carriedLists{ends: ends}, "s1")
		if rev := putKey(t, cli, key, v); whole {
			a.wrote(rev, carriedLists{ends: ends})
		}
		return whole
	}
	named(base)
	ends := map[int]endWaits{0: {Applied: 40, IDs: []string{"x", "y"}}}
	if !write(ends) {
		t.Fatal("the first value names a base")
	}
	check("in the value", ends[0])
	a.armed[1]++
	if write(ends) {
		t.Fatal("a value whose marks are its base's carries them all again")
	}
	check("in the base", ends[0])
	if !write(nil) {
		t.Fatal("a value whose marks changed names a base")
	}
	check("gone", endWaits{})

	write(ends)
	named(base.Add(time.Minute)) // the acquire's resume point, which the dispatch never reached
	check("behind the checkpoint", ends[0])

	named(base)
	putKey(t, cli, key, `{"at":"2026-03-01T12:00:10Z","applied":{"0":40}}`)
	check("a value of the version before", endWaits{})
}

// A watermark value carries at most maxEndWaits marks, of at most
// maxEndWaitBytes of ids, as a checkpoint's end_waits are bounded: the
// partitions' in order, a partition's ids in order, up to what fits.
// Marks with no revision to judge them by are not carried: a successor
// would drop them.
func TestEndWaitMarks_AValueCarriesABoundedList(t *testing.T) {
	ids := func(n int, pad string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%s%05d", pad, i)
		}
		return out
	}
	count := func(v map[int]endWaits) (n, size int) {
		for _, e := range v {
			n += len(e.IDs)
		}
		return n, jsonSize(v)
	}
	var m endWaitMarks
	m.publish(map[int]endWaits{0: {Applied: 0, IDs: []string{"unjudged"}}, 1: {Applied: 7, IDs: ids(maxEndWaits-10, "")}, 2: {Applied: 8, IDs: ids(20, "")}})
	got := m.carried()
	if n, _ := count(got); n != maxEndWaits || len(got[1].IDs) != maxEndWaits-10 || len(got[2].IDs) != 10 || got[0].IDs != nil {
		t.Errorf("carried %d marks (partition 0: %d, 1: %d, 2: %d), want %d: none of 0, all of 1, 10 of 2",
			n, len(got[0].IDs), len(got[1].IDs), len(got[2].IDs), maxEndWaits)
	}
	m.publish(map[int]endWaits{1: {}, 2: {Applied: 8, IDs: ids(maxEndWaits, strings.Repeat("<", 250))}})
	got = m.carried()
	if n, size := count(got); n == 0 || size > maxEndWaitBytes+100 || got[1].IDs != nil {
		t.Errorf("carried %d long escaped ids in %d bytes, partition 1's %d; want some, within %d bytes, none of 1",
			n, size, len(got[1].IDs), maxEndWaitBytes)
	}
	m.publish(map[int]endWaits{2: {}})
	if got := m.carried(); got != nil {
		t.Errorf("carried %v once the marks were gone, want none", got)
	}
}
