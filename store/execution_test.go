package store

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestRecord_EncodeDecode(t *testing.T) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 123456789, time.UTC)
	tests := []struct {
		name string
		e    Execution
	}{
		{"zero", Execution{}},
		{"ok", Execution{ScheduledAt: at, StartedAt: at.Add(time.Millisecond), FinishedAt: at.Add(time.Second), Attempt: 1, Node: "n1", Status: StatusOK}},
		{"error", Execution{ScheduledAt: at, StartedAt: at, FinishedAt: at, Attempt: 5, Node: "n", Status: StatusFailed, Error: "HTTP 503: unavailable"}},
		{"started before scheduled", Execution{ScheduledAt: at, StartedAt: at.Add(-time.Hour), Attempt: 1, Status: StatusMisfired}},
		{"only finished", Execution{FinishedAt: at, Status: StatusCanceled}},
		{"custom status", Execution{ScheduledAt: at, Status: "paused?"}},
		{"empty status", Execution{ScheduledAt: at}},
		{"negative attempt", Execution{Attempt: -7, Status: StatusSkipped}},
		{"big attempt", Execution{Attempt: math.MaxInt32 + 10, Status: StatusTimeout}},
		{"far times", Execution{ScheduledAt: time.Unix(0, math.MinInt64+1), FinishedAt: time.Unix(0, math.MaxInt64), Status: StatusOK}},
		{"long error", Execution{Status: StatusFailed, Error: string(bytes.Repeat([]byte("x"), 100000))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := appendRecord(nil, &tt.e)
			if len(b) > recordSize(&tt.e) {
				t.Errorf("encoded %d bytes, recordSize says at most %d", len(b), recordSize(&tt.e))
			}
			var got Execution
			got.TaskID = "kept"
			if err := decodeRecord(b, &got); err != nil {
				t.Fatal(err)
			}
			want := tt.e
			want.TaskID = "kept"
			if !got.ScheduledAt.Equal(want.ScheduledAt) || !got.StartedAt.Equal(want.StartedAt) || !got.FinishedAt.Equal(want.FinishedAt) {
				t.Errorf("times = %v %v %v, want %v %v %v", got.ScheduledAt, got.StartedAt, got.FinishedAt, want.ScheduledAt, want.StartedAt, want.FinishedAt)
			}
			got.ScheduledAt, got.StartedAt, got.FinishedAt = want.ScheduledAt, want.StartedAt, want.FinishedAt
			if got != want {
				t.Errorf("decoded %+v, want %+v", got, want)
			}
			// Truncations and trailing bytes are errors, not panics.
			for i := range b {
				if decodeRecord(b[:i], &got) == nil {
					t.Errorf("prefix of %d/%d bytes decoded", i, len(b))
				}
			}
			if decodeRecord(append(b, 0), &got) == nil {
				t.Error("trailing byte accepted")
			}
		})
	}
}

func TestRecord_Compact(t *testing.T) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	e := Execution{TaskID: "0123456789abcdef", ScheduledAt: at, StartedAt: at.Add(3 * time.Millisecond),
		FinishedAt: at.Add(40 * time.Millisecond), Attempt: 1, Node: "node-1", Status: StatusOK}
	v := appendRecord(nil, &e)
	k := appendHistoryKey(nil, e.TaskID, e.ScheduledAt, e.Attempt, 1)
	if len(v) > 32 || len(k) > 40 {
		t.Errorf("a typical record takes a %d-byte key and a %d-byte value, want at most 40 and 32", len(k), len(v))
	}
}

// FuzzDecodeRecord: decoding never panics, and what decodes re-encodes to
// something that decodes to the same record.
func FuzzDecodeRecord(f *testing.F) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, e := range []Execution{
		{},
		{ScheduledAt: at, StartedAt: at, FinishedAt: at, Attempt: 2, Node: "n", Status: StatusFailed, Error: "boom"},
		{Status: "custom", Attempt: -1},
	} {
		f.Add(appendRecord(nil, &e))
	}
	f.Add([]byte{1, 0xff})
	f.Add([]byte{1, 8, 0x80, 0x80, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		var e Execution
		if decodeRecord(b, &e) != nil {
			return
		}
		var again Execution
		if err := decodeRecord(appendRecord(nil, &e), &again); err != nil {
			t.Fatalf("re-encoding of %+v: %v", e, err)
		}
		if !again.ScheduledAt.Equal(e.ScheduledAt) || again.Attempt != e.Attempt || again.Status != e.Status ||
			again.Node != e.Node || again.Error != e.Error {
			t.Fatalf("round trip %+v -> %+v", e, again)
		}
	})
}

// TestHistoryKey_Order: byte order of keys is newest first by scheduled
// millisecond, then attempt, then sequence, for negative times too.
func TestHistoryKey_Order(t *testing.T) {
	type k struct {
		ms      int64
		attempt int
		seq     uint64
	}
	rng := rand.New(rand.NewPCG(3, 4))
	msValues := []int64{math.MinInt64 / 2, -1000, -1, 0, 1, 999, 1_900_000_000_000, math.MaxInt64 / 2}
	var ks []k
	for range 2000 {
		ks = append(ks, k{msValues[rng.IntN(len(msValues))], rng.IntN(4) - 1, rng.Uint64N(3) + math.MaxUint64 - 1})
	}
	enc := func(x k) []byte { return appendHistoryKey(nil, "task", time.UnixMilli(x.ms), x.attempt, x.seq) }
	byKey := slices.Clone(ks)
	slices.SortStableFunc(byKey, func(a, b k) int { return bytes.Compare(enc(a), enc(b)) })
	byTuple := slices.Clone(ks)
	slices.SortStableFunc(byTuple, func(a, b k) int {
		switch {
		case a.ms != b.ms:
			return cmpDesc(a.ms, b.ms)
		case clampAttempt(a.attempt) != clampAttempt(b.attempt):
			return cmpDesc(clampAttempt(a.attempt), clampAttempt(b.attempt))
		}
		return cmpDesc(a.seq, b.seq)
	})
	for i := range byKey {
		if enc(byKey[i]) == nil || !bytes.Equal(enc(byKey[i]), enc(byTuple[i])) {
			t.Fatalf("position %d: key order %+v, tuple order %+v", i, byKey[i], byTuple[i])
		}
	}
	if p := historyPrefix("task"); !bytes.HasPrefix(enc(ks[0]), p) || len(enc(ks[0])) != len(p)+historySuffixLen {
		t.Error("key does not extend its prefix by historySuffixLen")
	}
}

func cmpDesc[T int64 | uint32 | uint64](a, b T) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}
