package schedule

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/robfig/cron/v3"
)

// Schedule computes the fire times of a parsed schedule.
type Schedule interface {
	// Next returns the first fire time strictly after t, in UTC and without a
	// monotonic clock reading, or the zero time when there is none (only past
	// year 9999). It is safe for concurrent use and does not allocate.
	Next(t time.Time) time.Time
}

// Error reports a schedule or time zone that cannot be used. Its message
// quotes the input and says what to fix.
type Error struct {
	// Zone is true when the time zone, not the schedule, is at fault.
	Zone bool
	// Input is the schedule, or with Zone the time zone name, as given.
	Input string
	// Reason says what is wrong. For a schedule it does not repeat the input
	// (Error prefixes it); for a time zone it is the whole message.
	Reason string
}

// Error returns `"<schedule>": <reason>` for a schedule, e.g.
// `"61 * * * * *": second 61 out of range 0-59`, or the reason alone for a
// time zone, e.g. `unknown time zone "Mars/Olympus"`.
func (e *Error) Error() string {
	if e.Zone {
		return e.Reason
	}
	return quote(e.Input) + ": " + e.Reason
}

// quote quotes s for an error message, shortened so that a 64 KiB input does
// not make a 64 KiB message.
func quote(s string) string {
	const max = 100
	if len(s) <= max {
		return strconv.Quote(s)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "..."
}

// The range of times Next works in: before year 1 the calendar arithmetic is
// not meaningful, and after year 9999 there is nothing to schedule.
var (
	minSec = time.Date(1, time.January, 1, 0, 0, 0, 0, time.UTC).Unix()
	maxSec = time.Date(9999, time.December, 31, 23, 59, 59, 0, time.UTC).Unix()
)

// Parse parses spec in the time zone zone ("" = UTC) for the task taskID,
// which H fields hash. It returns a *Error for invalid input. Parse does not
// intern: use a Table to share schedules between tasks.
func Parse(spec, zone, taskID string) (Schedule, error) {
	if err := portable(zone); err != nil {
		return nil, err
	}
	s, _, err := parse(spec, zone, taskID)
	return s, err
}

// Resolve returns spec with every H replaced by its value for taskID,
// descriptors other than @every expanded and 5-field specs given their
// leading second, e.g. "H/15 * * * *" -> "0 7-59/15 * * * *",
// "@hourly" -> "0 0 * * * *", "@every 90s" -> "@every 1m30s". Equal results
// mean equal schedules (in the same zone). It returns a *Error for an invalid
// spec; it does not check that the spec ever fires.
func Resolve(spec, taskID string) (string, error) {
	p, err := parseSpec(spec, taskID)
	if err != nil {
		return "", err
	}
	return p.resolved, nil
}

// key identifies a schedule for interning: two specs with the same key fire
// at the same times.
type key struct {
	bits  [6]uint64 // robfig's field bit sets, star bits of the day fields included
	every int64     // @every interval in seconds, 0 for cron
	zone  string    // zone name, "" for @every and @at (which the zone no longer affects)
	once  bool      // an @at schedule, firing once at the instant at
	at    int64     // @at instant in unix seconds
}

// parse parses spec and zone into a schedule and its interning key.
func parse(spec, zone, taskID string) (Schedule, key, error) {
	if s := strings.TrimSpace(spec); isAt(s) {
		sec, err := parseAt(spec, s, zone)
		if err != nil {
			return nil, key{}, err
		}
		return &at{sec: sec}, key{once: true, at: sec}, nil
	}
	p, err := parseSpec(spec, taskID)
	if err != nil {
		return nil, key{}, err
	}
	z, err := loadZone(zone)
	if err != nil {
		return nil, key{}, err
	}
	if p.every > 0 {
		return &every{d: p.every}, key{every: p.every}, nil
	}
	cs, err := robfigParse(p.resolved)
	if err != nil {
		return nil, key{}, &Error{Input: spec, Reason: err.Error()}
	}
	if reason := neverFires(cs, p.fields[3]); reason != "" {
		return nil, key{}, &Error{Input: spec, Reason: reason}
	}
	s := &cronSchedule{bits: newCronBits(cs), z: z}
	// Belt and braces: neverFires is exact for robfig's semantics, but a
	// schedule that finds no fire from a fixed point must never be accepted.
	if s.Next(time.Unix(0, 0)).IsZero() {
		return nil, key{}, &Error{Input: spec, Reason: "never fires"}
	}
	// The star bit changes meaning only in day-of-month and day-of-week
	// (AND or OR); elsewhere "*" and "0-23" are the same schedule.
	return s, key{
		bits: [6]uint64{cs.Second &^ starBit, cs.Minute &^ starBit, cs.Hour &^ starBit, cs.Dom, cs.Month &^ starBit, cs.Dow},
		zone: z.name,
	}, nil
}

// robfigParser parses the resolved 6-field form that parseSpec produces;
// descriptors and the 5-field form never reach it.
var robfigParser = cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)

// robfigParse parses a resolved spec with robfig/cron, turning a panic into an
// error. parseSpec has validated every field, so an error here is a bug in
// that validation, reported rather than hidden.
func robfigParse(resolved string) (cs *cron.SpecSchedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			cs, err = nil, fmt.Errorf("rejected by the cron parser (panic: %v)", r)
		}
	}()
	s, err := robfigParser.Parse(resolved)
	if err != nil {
		return nil, fmt.Errorf("rejected by the cron parser: %v", err)
	}
	cs, ok := s.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("rejected by the cron parser: unexpected schedule type %T", s)
	}
	return cs, nil
}

// starBit is robfig's marker for a field written * or ?, which decides
// whether day-of-month and day-of-week combine with AND or OR.
const starBit = 1 << 63

// daysIn is the largest day of each month in any year (February 29).
var daysIn = [13]int{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}

// neverFires returns why cs can never fire, or "" when it can. With robfig's
// semantics only day-of-month can make a spec impossible: every other field
// has at least one value once parsed, and a restricted day-of-week either
// combines by OR with day-of-month or (with * in day-of-month) matches every
// week. domText is the day-of-month field as resolved, for the message.
func neverFires(cs *cron.SpecSchedule, domText string) string {
	domStar, dowStar := cs.Dom&starBit != 0, cs.Dow&starBit != 0
	if domStar || !dowStar {
		return "" // every day matches day-of-month, or day-of-week ORs in
	}
	var months []string
	for m := 1; m <= 12; m++ {
		if cs.Month&(1<<m) == 0 {
			continue
		}
		for d := 1; d <= daysIn[m]; d++ {
			if cs.Dom&(1<<d) != 0 {
				return ""
			}
		}
		months = append(months, time.Month(m).String())
	}
	if len(months) == 0 {
		return "never fires: no month" // unreachable: every field has a value
	}
	in := months[0]
	if n := len(months); n > 1 {
		in = strings.Join(months[:n-1], ", ") + " or " + months[n-1]
	}
	return fmt.Sprintf("never fires: day-of-month %s does not exist in %s", domText, in)
}

// unixUTC returns the instant sec as a UTC time without monotonic reading.
func unixUTC(sec int64) time.Time {
	return time.Unix(sec, 0).UTC()
}

// every fires at the whole multiples of d seconds since the Unix epoch.
type every struct {
	d int64 // seconds, >= 1
}

// Period returns d: callers that need many fire times at once (a misfire
// catch-up) compute them instead of calling Next for each.
func (e *every) Period() time.Duration { return time.Duration(e.d) * time.Second }

func (e *every) Next(t time.Time) time.Time {
	sec := t.Unix() // floor: the nanoseconds of t are non-negative
	if sec < minSec {
		sec = minSec
	}
	if sec >= maxSec {
		return time.Time{}
	}
	k := sec / e.d
	if sec%e.d < 0 {
		k-- // floor division for instants before 1970
	}
	n := (k + 1) * e.d // no overflow: |sec| < 2^38 and d < 2^34
	if n > maxSec {
		return time.Time{}
	}
	return unixUTC(n)
}

// maxShift bounds the distance between an instant and its wall-clock
// reading: UTC offsets in the tz database stay within ±16h (local mean times
// included), so ±26h is safe.
const maxShift = 26 * 3600
