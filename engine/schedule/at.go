package schedule

import (
	"strings"
	"time"
)

// "@at <time>" is a one-shot schedule: it fires once, at an RFC 3339
// time. A time with an offset ("2027-01-01T00:00:00Z",
// "2027-01-01T09:00:00+09:00") is that instant; a time without one
// ("2027-01-01T09:00:00") is a wall-clock time of the task's time zone,
// mapped to an instant by the daylight saving time rule of doc.go (a time
// in a gap fires at the end of the gap, a repeated time at its first
// occurrence). Fires fall on whole seconds, so fractions are refused.

// atLayoutLocal is RFC 3339 without the offset.
const atLayoutLocal = "2006-01-02T15:04:05"

// at fires once, at sec (unix seconds).
type at struct {
	sec int64
}

func (a *at) Next(t time.Time) time.Time {
	if t.Unix() >= a.sec {
		return time.Time{}
	}
	return unixUTC(a.sec)
}

// At returns the instant of an "@at" spec in zone ("" is UTC), and whether
// spec is one. It returns a *Error for an @at spec that cannot be used, or
// an unknown zone.
func At(spec, zone string) (time.Time, bool, error) {
	s := strings.TrimSpace(spec)
	if !isAt(s) {
		return time.Time{}, false, nil
	}
	sec, err := parseAt(spec, s, zone)
	if err != nil {
		return time.Time{}, true, err
	}
	return unixUTC(sec), true, nil
}

// isAt reports whether the trimmed spec s is an @at schedule.
func isAt(s string) bool {
	fs := strings.Fields(s)
	return len(fs) > 0 && fs[0] == "@at"
}

// parseAt parses the trimmed @at spec s in zone into unix seconds.
func parseAt(spec, s, zoneName string) (int64, error) {
	const want = `want @at and an RFC 3339 time, e.g. "@at 2027-01-01T00:00:00Z" (without an offset, the time is in the task's time zone)`
	fs := strings.Fields(s)
	if len(fs) != 2 {
		return 0, &Error{Input: spec, Reason: want}
	}
	text := fs[1]
	z, err := loadZone(zoneName)
	if err != nil {
		return 0, err
	}
	if t, err := time.Parse(time.RFC3339Nano, text); err == nil {
		if t.Nanosecond() != 0 {
			return 0, &Error{Input: spec, Reason: "fires fall on whole seconds: remove the fraction of a second"}
		}
		return t.Unix(), nil
	}
	w, err := time.Parse(atLayoutLocal+".999999999", text)
	if err != nil {
		return 0, &Error{Input: spec, Reason: quote(text) + " is not an RFC 3339 time: " + want}
	}
	if w.Nanosecond() != 0 {
		return 0, &Error{Input: spec, Reason: "fires fall on whole seconds: remove the fraction of a second"}
	}
	return z.instant(w.Unix()), nil
}
