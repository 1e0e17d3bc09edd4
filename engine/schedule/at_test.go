package schedule

import (
	"errors"
	"testing"
	"time"
)

func TestAt_FiresOnce(t *testing.T) {
	for _, tt := range []struct {
		spec, zone string
		want       time.Time
	}{
		{"@at 2027-01-01T00:00:00Z", "", utc(2027, 1, 1, 0, 0, 0)},
		{"@at 2027-01-01T09:00:00+09:00", "Europe/Berlin", utc(2027, 1, 1, 0, 0, 0)},
		{"  @at   2027-01-01T09:00:00  ", "Asia/Tokyo", utc(2027, 1, 1, 0, 0, 0)},
		{"@at 2027-01-01T00:00:00", "", utc(2027, 1, 1, 0, 0, 0)},
		// Without an offset, the daylight saving time rule of doc.go: a
		// time in the spring-forward gap fires at the end of the gap, a
		// repeated time at its first occurrence.
		{"@at 2026-03-29T02:30:00", "Europe/Berlin", utc(2026, 3, 29, 1, 0, 0)},
		{"@at 2026-10-25T02:30:00", "Europe/Berlin", utc(2026, 10, 25, 0, 30, 0)},
	} {
		t.Run(tt.spec+"@"+tt.zone, func(t *testing.T) {
			s, err := Parse(tt.spec, tt.zone, "id")
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := s.Next(tt.want.Add(-time.Hour)); !got.Equal(tt.want) || got.Location() != time.UTC {
				t.Errorf("Next an hour before = %v, want %v in UTC", got, tt.want)
			}
			if got := s.Next(tt.want.Add(-time.Nanosecond)); !got.Equal(tt.want) {
				t.Errorf("Next a nanosecond before = %v, want %v", got, tt.want)
			}
			for _, after := range []time.Time{tt.want, tt.want.Add(time.Nanosecond), tt.want.Add(time.Hour)} {
				if got := s.Next(after); !got.IsZero() {
					t.Errorf("Next(%v) = %v, want none: it fires once", after, got)
				}
			}
			at, ok, err := At(tt.spec, tt.zone)
			if err != nil || !ok || !at.Equal(tt.want) {
				t.Errorf("At = %v, %v, %v; want %v, true, nil", at, ok, err, tt.want)
			}
		})
	}
	if _, ok, err := At("@hourly", ""); ok || err != nil {
		t.Errorf("At(@hourly) = %v, %v; want false, nil", ok, err)
	}
}

func TestAt_Errors(t *testing.T) {
	for _, tt := range []struct{ spec, zone, want string }{
		{"@at", "", `"@at": want @at and an RFC 3339 time, e.g. "@at 2027-01-01T00:00:00Z" (without an offset, the time is in the task's time zone)`},
		{"@at 2027-01-01 00:00:00", "", `"@at 2027-01-01 00:00:00": want @at and an RFC 3339 time, e.g. "@at 2027-01-01T00:00:00Z" (without an offset, the time is in the task's time zone)`},
		{"@at tomorrow", "", `"@at tomorrow": "tomorrow" is not an RFC 3339 time: want @at and an RFC 3339 time, e.g. "@at 2027-01-01T00:00:00Z" (without an offset, the time is in the task's time zone)`},
		{"@at 2027-02-30T00:00:00Z", "", `"@at 2027-02-30T00:00:00Z": "2027-02-30T00:00:00Z" is not an RFC 3339 time: want @at and an RFC 3339 time, e.g. "@at 2027-01-01T00:00:00Z" (without an offset, the time is in the task's time zone)`},
		{"@at 2027-01-01T00:00:00.5Z", "", `"@at 2027-01-01T00:00:00.5Z": fires fall on whole seconds: remove the fraction of a second`},
		{"@at 2027-01-01T00:00:00.25", "UTC", `"@at 2027-01-01T00:00:00.25": fires fall on whole seconds: remove the fraction of a second`},
		{"@at 2027-01-01T00:00:00Z", "Mars/Olympus", `unknown time zone "Mars/Olympus" (want an IANA name such as "Europe/Berlin")`},
	} {
		_, err := Parse(tt.spec, tt.zone, "id")
		var se *Error
		if !errors.As(err, &se) || err.Error() != tt.want {
			t.Errorf("Parse(%q, %q) = %v; want *Error %s", tt.spec, tt.zone, err, tt.want)
		}
	}
}

func TestAt_Interned(t *testing.T) {
	var tab Table
	a, err := tab.Intern("@at 2027-01-01T00:00:00Z", "UTC", "a")
	if err != nil {
		t.Fatal(err)
	}
	// The same instant written in another zone's offset is the same schedule.
	b, err := tab.Intern("@at 2027-01-01T01:00:00", "Europe/Berlin", "b")
	if err != nil {
		t.Fatal(err)
	}
	c, err := tab.Intern("@at 2027-01-01T00:00:01Z", "UTC", "c")
	if err != nil {
		t.Fatal(err)
	}
	if a != b || a == c {
		t.Errorf("handles %d %d %d: want the first two equal, the third different", a, b, c)
	}
	if r, err := Resolve("@at 2027-01-01T00:00:00Z", "x"); err != nil || r != "@at 2027-01-01T00:00:00Z" {
		t.Errorf("Resolve = %q, %v", r, err)
	}
}
