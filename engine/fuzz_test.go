package engine

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/shardcron/shardcron/engine/schedule"
)

// FuzzParseSchedule checks that parsing never panics, and that a schedule
// that parses has a strictly increasing Next, in UTC on whole seconds, equal
// to robfig's in UTC.
func FuzzParseSchedule(f *testing.F) {
	for _, s := range []struct {
		spec, zone, id string
		at             int64
	}{
		{"* * * * *", "", "a", 1_780_000_000},
		{"0 */5 * * * *", "Europe/Berlin", "billing/invoice-42", 1_774_746_000},
		{"30 2 * * *", "Europe/Berlin", "x", 1_792_884_000},
		{"H H(0-29)/10 * * mon-fri", "America/New_York", "task-1", 1_772_900_000},
		{"0 0 29 2 *", "Australia/Sydney", "leap", 4_000_000_000},
		{"@every 90s", "UTC", "e", -5},
		{"@hourly", "Pacific/Apia", "apia", 1_325_000_000},
		{"TZ=Europe/Berlin * * * * *", "", "tz", 0},
		{"CRON_TZ=", "", "tz", 0},
		{"0 0 30 2 *", "", "never", 0},
		{"*/7 1-5,10 1,15 */2 ?", "Australia/Lord_Howe", "lh", 1_791_000_000},
		{"H/0 * * * *", "", "", 0},
		{"59 59 23 31 12 6", "Asia/Kolkata", "end", 253_402_300_000},
	} {
		f.Add(s.spec, s.zone, s.id, s.at)
	}
	robfig := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)
	f.Fuzz(func(t *testing.T, spec, zone, id string, at int64) {
		s, err := schedule.Parse(spec, zone, id)
		if err != nil {
			if _, ok := err.(*schedule.Error); !ok {
				t.Fatalf("Parse error %v is a %T, not a *schedule.Error", err, err)
			}
			return
		}
		// The same spec through the robfig parser, as a reference in UTC.
		var ref cron.Schedule
		if zone == "" || zone == "UTC" {
			resolved, err := schedule.Resolve(spec, id)
			if err != nil {
				t.Fatalf("Parse accepted %q but Resolve refuses it: %v", spec, err)
			}
			if !strings.HasPrefix(resolved, "@") {
				if ref, err = robfig.Parse(resolved); err != nil {
					t.Fatalf("robfig refuses the resolved spec %q: %v", resolved, err)
				}
				ref.(*cron.SpecSchedule).Location = time.UTC
			}
		}
		x := time.Unix(at, int64(uint64(at)%1e9))
		for range 10 {
			next := s.Next(x)
			if next.IsZero() {
				return
			}
			if !next.After(x) {
				t.Fatalf("%q in %q: Next(%v) = %v, not after", spec, zone, x, next)
			}
			if next.Location() != time.UTC || next.Nanosecond() != 0 || next != next.Round(0) {
				t.Fatalf("%q in %q: Next(%v) = %v, want a whole UTC second", spec, zone, x, next)
			}
			if ref != nil && x.Year() > 0 && x.Year() < 9000 {
				if want := ref.Next(x); !want.IsZero() && !want.Equal(next) {
					t.Fatalf("%q: Next(%v) = %v, robfig %v", spec, x, next, want)
				}
			}
			x = next
		}
	})
}

// FuzzDecodeTask checks that decoding never panics, and that a decoded task
// is valid, re-encodes and re-decodes to an equal task.
func FuzzDecodeTask(f *testing.F) {
	f.Add([]byte(apiExample))
	for _, s := range []string{
		`{"id": "a", "schedule": "@hourly", "executor": {"type": "noop"}}`,
		`{"id": "a", "schedule": "H * * * *", "executor": {"type": "exec", "command": ["ls", "-l"], "env": {"A": "b"}}, "labels": {}}`,
		`{"id": "a<b>&", "schedule": "* * * * *", "executor": {"type": "handler", "name": "h", "payload": {"html": "<b>\u2028", "n": 1e3}}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "handler", "name": "h", "payload": null}, "partition": 3, "state": {"fires": 1}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "https://x/y", "headers": {}}, "retry": {"max_attempts": 100, "backoff": "2h"}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"}, "timeout": "0s"}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"}} trailing`,
		`{"id": "\ud800", "schedule": "* * * * *", "executor": {"type": "noop"}}`,
		`[]`, `null`, `{}`, `{"id": "a", "id": "b", "schedule": "* * * * *", "executor": {"type": "noop"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		task, err := DecodeTask(data)
		if err != nil {
			if _, ok := err.(*ValidationError); !ok {
				t.Fatalf("error %v is a %T, not a *ValidationError", err, err)
			}
			return
		}
		again := *task
		if err := again.Validate(); err != nil || !reflect.DeepEqual(&again, task) {
			t.Fatalf("Validate of a decoded task: %v, changed it: %v", err, !reflect.DeepEqual(&again, task))
		}
		enc, err := json.Marshal(task)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		if len(enc) > MaxTaskSize {
			return // escaping (<, >, & as \u003c) can grow a task past the limit
		}
		back, err := DecodeTask(enc)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", enc, err)
		}
		if !reflect.DeepEqual(back, task) {
			t.Fatalf("round trip changed the task:\n got %+v\nwant %+v", back, task)
		}
	})
}
