package task

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestValidate_Chains(t *testing.T) {
	for _, tc := range []struct {
		name      string
		onSuccess []string
		onFailure []string
		want      string // "" for valid
	}{
		{"none", nil, nil, ""},
		{"both lists", []string{"b"}, []string{"c", "b"}, ""},
		{"itself", []string{"a"}, nil, `on_success[0]: "a" is the task itself`},
		{"twice", nil, []string{"b", "b"}, `on_failure[1]: "b" is listed twice`},
		{"empty id", []string{""}, nil, "on_success[0]: "},
		{"too many", make([]string, MaxChainTargets+1), nil, "on_success: 17 targets, more than the limit of 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := &Task{ID: "a", Schedule: "@hourly", Executor: Executor{Type: ExecutorNoop}, OnSuccess: tc.onSuccess, OnFailure: tc.onFailure}
			err := tk.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Fatalf("error %v, want one starting with %q", err, tc.want)
			}
		})
	}
	if _, err := DecodeTask([]byte(`{"id":"a","schedule":"@hourly","executor":{"type":"noop"},"on_success":["b",1]}`)); err == nil ||
		!strings.Contains(err.Error(), "on_success[1]: want a string, got 1") {
		t.Errorf("a number in on_success: %v", err)
	}
}

func TestBackfillTimes_Limits(t *testing.T) {
	tk := &Task{ID: "a", Schedule: "0 * * * * *", Executor: Executor{Type: ExecutorNoop}}
	if err := tk.Validate(); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 3, 12, 0, 30, 0, time.UTC)
	at := func(m int) time.Time { return time.Date(2026, 12, 3, 11, m, 0, 0, time.UTC) }
	times, err := BackfillTimes(tk, at(10), at(14), now, 0)
	if err != nil || len(times) != 5 || !times[0].Equal(at(10)) || !times[4].Equal(at(14)) {
		t.Fatalf("times %v, %v: want 11:10 to 11:14, both ends in", times, err)
	}
	for _, tc := range []struct {
		from, to    time.Time
		concurrency int
		want        string
	}{
		{time.Time{}, at(1), 0, "from: required"},
		{at(1), time.Time{}, 0, "to: required"},
		{at(2), at(1), 0, "to: 2026-12-03T11:01:00Z is not after from"},
		{at(1), now.Add(time.Second), 0, "is in the future"},
		{at(1), at(2), 33, "concurrency: 33 is not within 1-32"},
		{at(1).Add(time.Second), at(1).Add(30 * time.Second), 0, "from: the schedule"},
		{now.AddDate(0, 0, -7), now, 0, "more than 10000 scheduled times"},
	} {
		if _, err := BackfillTimes(tk, tc.from, tc.to, now, tc.concurrency); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("BackfillTimes(%s, %s, %d): %v, want %q", tc.from, tc.to, tc.concurrency, err, tc.want)
		}
	}
}

// A backfill runs only times the task would have fired: not_before,
// not_after, max_fires and an @at time bound its times as they bound the
// task's fires.
func TestBackfillTimes_StayInTheTaskWindow(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 30, 0, time.UTC)
	at := func(m int) time.Time { return time.Date(2026, 12, 3, 11, m, 0, 0, time.UTC) }
	valid := func(tk *Task) *Task {
		t.Helper()
		tk.Executor = Executor{Type: ExecutorNoop}
		if err := tk.Validate(); err != nil {
			t.Fatal(err)
		}
		return tk
	}
	for _, tc := range []struct {
		name        string
		tk          *Task
		first, last time.Time
		n           int
	}{
		{"not_before and not_after", valid(&Task{ID: "w", Schedule: "0 * * * * *", NotBefore: at(12), NotAfter: at(15)}), at(12), at(15), 4},
		{"max_fires from not_before", valid(&Task{ID: "m", Schedule: "0 * * * * *", NotBefore: at(11), MaxFires: 2}), at(11), at(12), 2},
		{"max_fires from created_at", valid(&Task{ID: "c", Schedule: "0 * * * * *", MaxFires: 3, CreatedAt: at(13).Add(time.Second)}), at(14), at(16), 3},
		{"@at", valid(&Task{ID: "a", Schedule: "@at 2026-12-03T11:13:00Z"}), at(13), at(13), 1},
	} {
		times, err := BackfillTimes(tc.tk, at(10), at(20), now, 0)
		if err != nil || len(times) != tc.n || !times[0].Equal(tc.first) || !times[len(times)-1].Equal(tc.last) {
			t.Errorf("%s: times %v, %v; want %d from %s to %s", tc.name, secsOf(times), err, tc.n, tc.first.Format(time.TimeOnly), tc.last.Format(time.TimeOnly))
		}
	}
	tk := valid(&Task{ID: "w", Schedule: "0 * * * * *", NotBefore: at(30), NotAfter: at(40)})
	if _, err := BackfillTimes(tk, at(10), at(20), now, 0); err == nil ||
		!strings.Contains(err.Error(), "from: the task's window (not_before, not_after, max_fires or @at: from 2026-12-03T11:30:00Z to 2026-12-03T11:40:00Z) leaves no scheduled time in [2026-12-03T11:10:00Z, 2026-12-03T11:20:00Z]") {
		t.Errorf("a range outside the window: %v", err)
	}
	// A window bounded on one side is a window all the same.
	tk = valid(&Task{ID: "w", Schedule: "0 * * * * *", NotBefore: at(30)})
	if _, err := BackfillTimes(tk, at(10), at(20), now, 0); err == nil || !strings.Contains(err.Error(), "from: the task's window") {
		t.Errorf("a range before not_before alone: %v", err)
	}
}

// secsOf formats times as clock times, for messages.
func secsOf(ts []time.Time) []string {
	out := make([]string, len(ts))
	for i, at := range ts {
		out[i] = at.Format(time.TimeOnly)
	}
	return out
}

func TestOverride_Check(t *testing.T) {
	handler := &Task{ID: "h", Executor: Executor{Type: ExecutorHandler, Name: "x"}}
	web := &Task{ID: "w", Executor: Executor{Type: ExecutorHTTP, URL: "http://127.0.0.1/"}}
	body := "b"
	big := strings.Repeat("x", MaxOverrideSize+1)
	for _, tc := range []struct {
		t    *Task
		o    Override
		want string
	}{
		{handler, Override{Payload: json.RawMessage(` { "a" : 1 } `)}, ""},
		{web, Override{Body: &body}, ""},
		{handler, Override{Body: &body}, "body: task \"h\" runs a handler executor"},
		{web, Override{Payload: json.RawMessage(`1`)}, "payload: task \"w\" runs a http executor"},
		{handler, Override{Payload: json.RawMessage(`{`)}, "payload: not a JSON value"},
		{web, Override{Body: &big}, "body: 16385 bytes"},
	} {
		err := tc.o.Check(tc.t)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Check(%s, %+v): %v, want %q", tc.t.ID, tc.o, err, tc.want)
		}
	}
	o := Override{Payload: json.RawMessage(` { "a" : 1 } `)}
	if err := o.Check(handler); err != nil || string(o.Payload) != `{"a":1}` {
		t.Errorf("payload not compacted: %s, %v", o.Payload, err)
	}
	if err := CheckPauseNote("line\tone\nline two"); err != nil {
		t.Errorf("a note with a tab and a newline: %v", err)
	}
	if err := CheckPauseNote("bell\a"); err == nil {
		t.Error("a control character in a note was accepted")
	}
}
