package store

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/shardcron/shardcron/task"
)

func TestRecord_EncodeDecode(t *testing.T) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 123456789, time.UTC)
	tests := []struct {
		name string
		e    task.Execution
	}{
		{"zero", task.Execution{}},
		{"ok", task.Execution{ScheduledAt: at, StartedAt: at.Add(time.Millisecond), FinishedAt: at.Add(time.Second), Attempt: 1, Node: "n1", Status: task.ExecutionOK}},
		{"error", task.Execution{ScheduledAt: at, StartedAt: at, FinishedAt: at, Attempt: 5, Node: "n", Status: task.ExecutionFailed, Error: "HTTP 503: unavailable"}},
		{"started before scheduled", task.Execution{ScheduledAt: at, StartedAt: at.Add(-time.Hour), Attempt: 1, Status: task.ExecutionMisfired}},
		{"only finished", task.Execution{FinishedAt: at, Status: task.ExecutionCanceled}},
		{"custom status", task.Execution{ScheduledAt: at, Status: "paused?"}},
		{"empty status", task.Execution{ScheduledAt: at}},
		{"negative attempt", task.Execution{Attempt: -7, Status: task.ExecutionSkipped}},
		{"big attempt", task.Execution{Attempt: math.MaxInt32 + 10, Status: task.ExecutionTimeout}},
		{"far times", task.Execution{ScheduledAt: time.Unix(0, math.MinInt64+1), FinishedAt: time.Unix(0, math.MaxInt64), Status: task.ExecutionOK}},
		{"long error", task.Execution{Status: task.ExecutionFailed, Error: string(bytes.Repeat([]byte("x"), 100000))}},
		{"output", task.Execution{ScheduledAt: at, Attempt: 1, Node: "n", Status: task.ExecutionFailed, Error: "exit status 1", Output: "line 1\nline 2\n"}},
		{"output, no error", task.Execution{ScheduledAt: at, Status: task.ExecutionOK, Output: string(bytes.Repeat([]byte("o"), 4096))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := appendRecord(nil, &tt.e)
			if len(b) > recordSize(&tt.e) {
				t.Errorf("encoded %d bytes, recordSize says at most %d", len(b), recordSize(&tt.e))
			}
			var got task.Execution
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
	e := task.Execution{TaskID: "0123456789abcdef", ScheduledAt: at, StartedAt: at.Add(3 * time.Millisecond),
		FinishedAt: at.Add(40 * time.Millisecond), Attempt: 1, Node: "node-1", Status: task.ExecutionOK}
	v := appendRecord(nil, &e)
	k := appendSlotKey(nil, e.TaskID, classSuccess, 9)
	if len(v) > 32 || len(k) > 24 {
		t.Errorf("a typical record takes a %d-byte key and a %d-byte value (plus 8 of sequence), want at most 24 and 32", len(k), len(v))
	}
}

// FuzzDecodeRecord: decoding never panics, and what decodes re-encodes to
// something that decodes to the same record.
func FuzzDecodeRecord(f *testing.F) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, e := range []task.Execution{
		{},
		{ScheduledAt: at, StartedAt: at, FinishedAt: at, Attempt: 2, Node: "n", Status: task.ExecutionFailed, Error: "boom"},
		{Status: "custom", Attempt: -1},
		{ScheduledAt: at, Status: task.ExecutionOK, Output: "captured"},
	} {
		f.Add(appendRecord(nil, &e))
	}
	f.Add([]byte{1, 0xff})
	f.Add([]byte{1, 8, 0x80, 0x80, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		var e task.Execution
		if decodeRecord(b, &e) != nil {
			return
		}
		var again task.Execution
		if err := decodeRecord(appendRecord(nil, &e), &again); err != nil {
			t.Fatalf("re-encoding of %+v: %v", e, err)
		}
		if !again.ScheduledAt.Equal(e.ScheduledAt) || again.Attempt != e.Attempt || again.Status != e.Status ||
			again.Node != e.Node || again.Error != e.Error {
			t.Fatalf("round trip %+v -> %+v", e, again)
		}
	})
}

// TestSlotKey: a slot key extends its task's prefix by historySuffixLen,
// and no two (class, slot) pairs share a key.
func TestSlotKey(t *testing.T) {
	p := historyPrefix("task")
	seen := map[string]bool{}
	for c := range numClasses {
		for slot := range uint8(MaxHistoryLimit) {
			k := appendSlotKey(nil, "task", c, slot)
			if !bytes.HasPrefix(k, p) || len(k) != len(p)+historySuffixLen || seen[string(k)] {
				t.Fatalf("class %d slot %d: key %x (prefix %x)", c, slot, k, p)
			}
			seen[string(k)] = true
		}
	}
}
