package schedule

import (
	"math"
	"strings"
	"sync"
	"time"
	_ "time/tzdata" // zones resolve the same on hosts without a tz database
)

// zone is a loaded time zone with its offsets precomputed, so that Next maps
// wall-clock times to instants without time.Location lookups (each of which
// may parse the zone's TZ rule string).
type zone struct {
	name string
	loc  *time.Location

	// From fixedFrom on (unix seconds) the offset is fixedOff forever:
	// math.MinInt64 for zones without transitions (UTC, Etc/GMT+5),
	// math.MaxInt64 for zones that keep changing (daylight saving time).
	fixedFrom int64
	fixedOff  int64

	// Periods of constant offset: period k starts at starts[k] (math.MinInt64
	// for the beginning of time) with offset offs[k] and ends where k+1
	// starts, the last one at tableEnd (math.MaxInt64: never). They cover the
	// years tableFrom-tableTo; outside them, periodAt asks the Location.
	starts   []int64
	offs     []int32
	tableEnd int64
}

// The years for which zone tables are precomputed: about 600 periods and
// 7 KB for a zone with daylight saving time, computed once per process.
const tableFrom, tableTo = 1900, 2200

// period is a span of instants [start, end) with one UTC offset, in seconds.
type period struct {
	start, end int64 // math.MinInt64 / math.MaxInt64 when unbounded
	off        int64
}

// zones memoizes loadZone for valid names only, so it is bounded by the
// number of zones in the tz database. Zones are immutable once stored.
var zones sync.Map // zone name -> *zone

// portable returns a *Error for a zone name that some hosts' tz databases
// hold and the copy in the binary lacks: a node on a host without it
// refuses the task, and right/ zones count leap seconds, which cron
// times do not. Parse refuses them; a Table still interns them, so that a
// task written before keeps firing where its host has them.
func portable(name string) error {
	if name == "localtime" || name == "posixrules" {
		return &Error{Zone: true, Input: name,
			Reason: "time zone " + quote(name) + ` differs between machines: use an IANA name such as "Europe/Berlin"`}
	}
	if rest, ok := strings.CutPrefix(name, "posix/"); ok {
		return &Error{Zone: true, Input: name,
			Reason: "time zone " + quote(name) + " is a copy some machines have: use " + quote(rest)}
	}
	if rest, ok := strings.CutPrefix(name, "right/"); ok {
		return &Error{Zone: true, Input: name,
			Reason: "time zone " + quote(name) + " counts leap seconds, which some machines' tz databases lack and cron times do not: use " + quote(rest)}
	}
	return nil
}

// loadZone returns the zone named name ("" is UTC) or a *Error.
func loadZone(name string) (*zone, error) {
	if name == "" {
		name = "UTC"
	}
	if z, ok := zones.Load(name); ok {
		return z.(*zone), nil
	}
	if name == "Local" {
		return nil, &Error{Zone: true, Input: name,
			Reason: `time zone "Local" differs between machines: use an IANA name such as "Europe/Berlin"`}
	}
	if len(name) > 128 {
		return nil, &Error{Zone: true, Input: name, Reason: "unknown time zone " + quote(name)}
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, &Error{Zone: true, Input: name,
			Reason: "unknown time zone " + quote(name) + ` (want an IANA name such as "Europe/Berlin")`}
	}
	z := newZone(name, loc)
	actual, _ := zones.LoadOrStore(name, z)
	return actual.(*zone), nil
}

func newZone(name string, loc *time.Location) *zone {
	z := &zone{name: name, loc: loc, fixedFrom: math.MaxInt64}
	hi := time.Date(tableTo, time.January, 1, 0, 0, 0, 0, time.UTC).Unix()
	x := time.Date(tableFrom, time.January, 1, 0, 0, 0, 0, time.UTC).Unix()
	for {
		p := z.lookup(x)
		// Merge periods that differ only in name or DST flag: only the
		// offset matters here.
		if n := len(z.offs); n == 0 || int64(z.offs[n-1]) != p.off {
			z.starts = append(z.starts, p.start)
			z.offs = append(z.offs, int32(p.off))
		}
		if p.end >= hi {
			z.tableEnd = p.end
			break
		}
		x = p.end
	}
	if z.tableEnd == math.MaxInt64 {
		n := len(z.starts) - 1
		z.fixedFrom, z.fixedOff = z.starts[n], int64(z.offs[n])
	}
	return z
}

// lookup asks the Location for the period containing instant x.
func (z *zone) lookup(x int64) period {
	t := time.Unix(x, 0).In(z.loc)
	_, off := t.Zone()
	start, end := t.ZoneBounds()
	p := period{start: math.MinInt64, end: math.MaxInt64, off: int64(off)}
	if !start.IsZero() {
		p.start = start.Unix()
	}
	if !end.IsZero() {
		p.end = end.Unix()
	}
	// Past its explicit transitions, Go derives periods from the zone's TZ
	// rule, and then ends a year's last period 365 days after the year
	// starts, so in a leap year the last day lies after the period said to
	// contain it. No rule changes clocks on December 31st: the offset holds
	// into the next year, whose periods overlap this one harmlessly.
	if p.end <= x {
		p.end = x + 86400
	}
	return p
}

// periodAt returns the period containing instant x.
func (z *zone) periodAt(x int64) period {
	n := len(z.starts)
	if x < z.starts[0] || x >= z.tableEnd {
		return z.lookup(x)
	}
	lo, hi := 0, n // starts[lo] <= x < starts[hi] (starts[n] = tableEnd)
	for hi-lo > 1 {
		m := int(uint(lo+hi) >> 1)
		if z.starts[m] <= x {
			lo = m
		} else {
			hi = m
		}
	}
	end := z.tableEnd
	if lo+1 < n {
		end = z.starts[lo+1]
	}
	return period{start: z.starts[lo], end: end, off: int64(z.offs[lo])}
}

// instant maps wall-clock time w (seconds, the zone's local time read as if
// it were UTC) to an instant: the first instant whose wall clock reads w,
// or, when w falls in a gap (spring forward), the first instant after the
// gap.
func (z *zone) instant(w int64) int64 {
	// Walk the periods in order from one that starts before any instant
	// whose wall clock can read w.
	q := z.periodAt(w - maxShift)
	for range 64 {
		i := w - q.off
		if i < q.start {
			return q.start // w lies in the gap before q
		}
		if i < q.end {
			return i
		}
		q = z.periodAt(q.end)
	}
	return w - q.off // unreachable: no zone changes its offset 64 times in two days
}

// wallStart returns the wall-clock reading at the start of q; math.MinInt64
// when q starts at the beginning of time.
func (q period) wallStart() int64 {
	if q.start == math.MinInt64 {
		return math.MinInt64
	}
	return q.start + q.off
}

// wallEnd returns the wall-clock reading at the end of q (exclusive);
// math.MaxInt64 when q never ends.
func (q period) wallEnd() int64 {
	if q.end == math.MaxInt64 {
		return math.MaxInt64
	}
	return q.end + q.off
}
