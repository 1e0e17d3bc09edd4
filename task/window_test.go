package task

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/shardcron/shardcron/engine/schedule"
)

func TestDecodeTask_Window(t *testing.T) {
	base := `"id": "w", "executor": {"type": "noop"}`
	for _, tt := range []struct {
		name, fields string
		err          string // "" when valid
	}{
		{"window", `"schedule": "@hourly", "not_before": "2027-01-01T00:00:00Z", "not_after": "2027-02-01T00:00:00+01:00"`, ""},
		{"max_fires", `"schedule": "@hourly", "max_fires": 3, "delete_after_fire": true`, ""},
		{"one-shot", `"schedule": "@at 2027-01-01T00:00:00Z", "delete_after_fire": true`, ""},
		{"one-shot in its window", `"schedule": "@at 2027-01-01T00:00:00Z", "not_before": "2027-01-01T00:00:00Z", "not_after": "2027-01-02T00:00:00Z"`, ""},
		{"not_after before not_before", `"schedule": "@hourly", "not_before": "2027-01-01T00:00:00Z", "not_after": "2026-01-01T00:00:00Z"`,
			"not_after: 2026-01-01T00:00:00Z is not after not_before 2027-01-01T00:00:00Z"},
		{"equal bounds", `"schedule": "@hourly", "not_before": "2027-01-01T00:00:00Z", "not_after": "2027-01-01T00:00:00Z"`,
			"not_after: 2027-01-01T00:00:00Z is not after not_before 2027-01-01T00:00:00Z"},
		{"no time in the window", `"schedule": "0 0 1 1 *", "not_before": "2027-01-02T00:00:00Z", "not_after": "2027-12-31T00:00:00Z"`,
			"not_after: the schedule has no time between not_before and not_after: the task would never fire"},
		{"one-shot outside its window", `"schedule": "@at 2026-01-01T00:00:00Z", "not_before": "2027-01-01T00:00:00Z"`,
			"schedule: 2026-01-01T00:00:00Z is outside not_before and not_after: the task would never fire"},
		{"not a time", `"schedule": "@hourly", "not_before": "tomorrow"`, `not_before: "tomorrow" is not an RFC 3339 time such as "2027-01-01T00:00:00Z"`},
		{"not a string", `"schedule": "@hourly", "not_after": 12`, `not_after: want an RFC 3339 time such as "2027-01-01T00:00:00Z", got 12`},
		// The zero time read as no bound: a not_after of year 1 fired for
		// ever, a not_before of year 1 counted max_fires from created_at.
		{"not_after the zero time", `"schedule": "@hourly", "not_after": "0001-01-01T00:00:00Z"`,
			`not_after: "0001-01-01T00:00:00Z" is the zero time, which reads as no time: leave the field out for none`},
		{"not_before the zero time", `"schedule": "@hourly", "not_before": "0001-01-01T01:00:00+01:00", "max_fires": 3`,
			`not_before: "0001-01-01T01:00:00+01:00" is the zero time, which reads as no time: leave the field out for none`},
		{"max_fires 0", `"schedule": "@hourly", "max_fires": 0`, "max_fires: 0 is not within 1-10000 (leave it out for no limit)"},
		{"max_fires negative", `"schedule": "@hourly", "max_fires": -2`, "max_fires: -2 is not within 1-10000 (leave it out for no limit)"},
		{"max_fires too many", `"schedule": "@hourly", "max_fires": 10001`, "max_fires: 10001 is not within 1-10000 (leave it out for no limit)"},
		{"max_fires not a number", `"schedule": "@hourly", "max_fires": "3"`, `max_fires: want a whole number, got a string`},
		{"max_fires of a one-shot", `"schedule": "@at 2027-01-01T00:00:00Z", "max_fires": 1`, "max_fires: an @at schedule fires once: leave max_fires out"},
		{"delete_after_fire without an end", `"schedule": "@hourly", "delete_after_fire": true`,
			"delete_after_fire: the task never ends: use an @at schedule, not_after or max_fires"},
		{"typo", `"schedule": "@hourly", "not_befor": "2027-01-01T00:00:00Z"`, `not_befor: unknown field (did you mean "not_before"?)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeTask([]byte("{" + base + ", " + tt.fields + "}"))
			if tt.err == "" {
				if err != nil {
					t.Fatalf("DecodeTask: %v", err)
				}
				again, err := DecodeTask(mustJSON(t, got))
				if err != nil || !again.NotBefore.Equal(got.NotBefore) || !again.NotAfter.Equal(got.NotAfter) ||
					again.NotAfter != got.NotAfter || again.MaxFires != got.MaxFires || again.DeleteAfterFire != got.DeleteAfterFire {
					t.Errorf("round trip: %+v, %v; want %+v", again, err, got)
				}
				return
			}
			if err == nil || err.Error() != tt.err {
				t.Errorf("DecodeTask error = %v\nwant %s", err, tt.err)
			}
		})
	}
}

func TestTask_Window(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	now := at("2027-03-01T10:20:30Z")
	created := at("2027-02-01T00:00:30Z")
	for _, tt := range []struct {
		name string
		t    Task
		want Window
	}{
		{"unbounded", Task{Schedule: "@hourly"}, Window{}},
		{"not_before and not_after", Task{Schedule: "@hourly", NotBefore: at("2027-01-01T00:00:00Z"), NotAfter: at("2027-02-01T00:00:00Z")},
			Window{From: at("2027-01-01T00:00:00Z"), To: at("2027-02-01T00:00:00Z"), End: EndedNotAfter}},
		{"max_fires from not_before, inclusive", Task{Schedule: "@hourly", NotBefore: at("2027-01-01T00:00:00Z"), MaxFires: 3, CreatedAt: created},
			Window{From: at("2027-01-01T00:00:00Z"), To: at("2027-01-01T02:00:00Z"), End: EndedMaxFires}},
		{"max_fires from created_at", Task{Schedule: "0 0 * * * *", MaxFires: 2, CreatedAt: created},
			Window{From: created, To: at("2027-02-01T02:00:00Z"), End: EndedMaxFires}},
		{"max_fires of @every from created_at", Task{Schedule: "@every 10s", MaxFires: 4, CreatedAt: created},
			Window{From: created, To: at("2027-02-01T00:01:00Z"), End: EndedMaxFires}}, // :30 counts: at or after
		{"max_fires of a new task from the anchor", Task{Schedule: "@every 1m", MaxFires: 1},
			Window{From: now, To: at("2027-03-01T10:21:00Z"), End: EndedMaxFires}},
		{"not_after before the count's end", Task{Schedule: "@hourly", MaxFires: 100, NotAfter: at("2027-02-01T05:00:00Z"), CreatedAt: created},
			Window{From: created, To: at("2027-02-01T05:00:00Z"), End: EndedNotAfter}},
		{"count before not_after", Task{Schedule: "@hourly", MaxFires: 2, NotAfter: at("2027-02-01T05:00:00Z"), CreatedAt: created},
			Window{From: created, To: at("2027-02-01T02:00:00Z"), End: EndedMaxFires}},
		{"@at", Task{Schedule: "@at 2027-06-01T12:00:00", Timezone: "Europe/Berlin"},
			Window{From: at("2027-06-01T10:00:00Z"), To: at("2027-06-01T10:00:00Z"), End: EndedAt}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := schedule.Parse(tt.t.Schedule, tt.t.Timezone, "id")
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.t.Window(s, now); got != tt.want {
				t.Errorf("Window = %+v\nwant %+v", got, tt.want)
			}
		})
	}
	w := Window{From: at("2027-01-01T00:00:00Z"), To: at("2027-01-02T00:00:00Z")}
	for _, c := range []struct {
		at   string
		want bool
	}{{"2026-12-31T23:59:59Z", false}, {"2027-01-01T00:00:00Z", true}, {"2027-01-02T00:00:00Z", true}, {"2027-01-02T00:00:01Z", false}} {
		if got := w.Contains(at(c.at)); got != c.want {
			t.Errorf("Contains(%s) = %v, want %v", c.at, got, c.want)
		}
	}
}

func TestNthFire_PastTheEnd(t *testing.T) {
	s, err := schedule.Parse("@at 2027-01-01T00:00:00Z", "", "x")
	if err != nil {
		t.Fatal(err)
	}
	if got := nthFire(s, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), 2); !got.IsZero() {
		t.Errorf("second fire of a one-shot = %v, want none", got)
	}
	e, _ := schedule.Parse("@every 1h", "", "x")
	if got := nthFire(e, time.Date(9999, 12, 31, 20, 0, 0, 0, time.UTC), 10); !got.IsZero() {
		t.Errorf("fire past year 9999 = %v, want none", got)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BenchmarkNthFire is the cost of max_fires when an owner loads a task:
// the end of the count at the largest max_fires.
func BenchmarkNthFire(b *testing.B) {
	from := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, spec := range []string{"*/5 * * * * *", "@every 5s"} {
		s, err := schedule.Parse(spec, "Europe/Berlin", "x")
		if err != nil {
			b.Fatal(err)
		}
		b.Run("n=10000/spec="+spec, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if nthFire(s, from, MaxFiresLimit).IsZero() {
					b.Fatal("no end")
				}
			}
		})
	}
}
