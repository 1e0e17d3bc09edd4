package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/shardcron/shardcron/engine/schedule"
)

// FuzzParseSchedule checks that parsing never panics, and that a schedule
// that parses has a strictly increasing Next, in UTC on whole seconds, equal
// to robfig's in UTC. An @at schedule fires at most once.
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
		{"@at 2027-01-01T00:00:00Z", "", "once", 1_798_761_599},
		{"@at 2026-03-29T02:30:00", "Europe/Berlin", "gap", 1_774_745_000},
		{"@at 9999-12-31T23:59:59+14:00", "", "far", 253_402_200_000},
		{"@at 2027-01-01T00:00:00.5Z", "", "frac", 0},
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
		if once, ok, err := schedule.At(spec, zone); ok {
			if err != nil {
				t.Fatalf("Parse accepted %q but At refuses it: %v", spec, err)
			}
			if next := s.Next(x); !next.IsZero() && (!next.Equal(once) || !s.Next(next).IsZero()) {
				t.Fatalf("%q in %q: Next(%v) = %v, then %v; want %v once", spec, zone, x, next, s.Next(next), once)
			}
		}
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
