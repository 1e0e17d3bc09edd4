package schedule

import (
	"math"
	"time"
)

// cronSchedule is a cron expression in a time zone.
//
// robfig/cron evaluated in a zone with daylight saving time skips wall-clock
// times that do not exist, which the contract forbids. So the search runs on
// the naive wall clock instead (the zone's local time read as if it were UTC,
// where every wall time exists exactly once and no clock ever changes), and
// Next maps each candidate wall time back to an instant itself: a time in a
// gap to the end of the gap, a repeated time to its first occurrence.
type cronSchedule struct {
	bits cronBits
	z    *zone
}

func (s *cronSchedule) Next(t time.Time) time.Time {
	// Fires fall on whole seconds, so the first candidate after t is the
	// second after t's floor, whatever t's nanoseconds.
	sec := t.Unix()
	if sec < minSec {
		sec = minSec
	}
	if sec >= maxSec {
		return time.Time{}
	}
	z := s.z
	if sec >= z.fixedFrom {
		// No clock change from t on: wall = instant + offset, one to one.
		c, ok := s.bits.next(sec + z.fixedOff)
		if !ok {
			return time.Time{}
		}
		return unixUTC(c - z.fixedOff)
	}

	p := z.periodAt(sec)
	w := sec + p.off // the wall clock at t
	// After a fall back, t may be in the second pass through a repeated
	// range of wall times; each of those fired at its first occurrence, so
	// the search resumes where the repetition ends. Periods that ended more
	// than maxShift before t cannot repeat t's wall time. (Past the table,
	// Go's periods may overlap around a year end; one that has not ended by
	// t repeats nothing.)
	for q := p; q.start != math.MinInt64 && sec-q.start < maxShift; {
		q = z.periodAt(q.start - 1)
		if q.end <= sec && q.wallStart() <= w && q.wallEnd()-1 > w {
			w = q.wallEnd() - 1
		}
	}
	// Each candidate normally maps into t's period and is the answer; the
	// loop only repeats where an earlier occurrence of a candidate precedes
	// t, which the adjustment above already rules out for real zones.
	for range 1 << 16 {
		c, ok := s.bits.next(w)
		if !ok {
			return time.Time{}
		}
		i := c - p.off
		if i < p.start || i >= p.end {
			i = z.instant(c)
		}
		if i > sec {
			if i > maxSec {
				return time.Time{}
			}
			return unixUTC(i)
		}
		w = c
	}
	return time.Time{}
}
