package schedule

import (
	"math/bits"

	"github.com/robfig/cron/v3"
)

// cronBits is a parsed cron spec as robfig's bit sets: bit v set when value v
// matches. Next searches them directly rather than calling robfig's
// SpecSchedule.Next, which steps one second or minute at a time through
// time.Time values (1.7-3.3 µs per fire) and gives up after five years; this
// search jumps with bit operations on integers (tens of ns) and matches
// robfig's results exactly (TestNext_MatchesRobfigInUTC).
type cronBits struct {
	sec, min, hour, dom, month, dow uint64 // star bits cleared
	// robfig's rule: when either day field is * (or ?), a day must match
	// both; otherwise either.
	dayAnd bool
}

func newCronBits(cs *cron.SpecSchedule) cronBits {
	return cronBits{
		sec: cs.Second &^ starBit, min: cs.Minute &^ starBit, hour: cs.Hour &^ starBit,
		dom: cs.Dom &^ starBit, month: cs.Month &^ starBit, dow: cs.Dow &^ starBit,
		dayAnd: cs.Dom&starBit != 0 || cs.Dow&starBit != 0,
	}
}

// nextBit returns the smallest v in [from, max] whose bit is set, or -1.
func nextBit(set uint64, from, max int) int {
	if from > max {
		return -1
	}
	m := set & (^uint64(0) << uint(from)) & (^uint64(0) >> uint(63-max))
	if m == 0 {
		return -1
	}
	return bits.TrailingZeros64(m)
}

// maxGapYears bounds the search: a spec that fires at all fires at least
// every eight years (February 29th across 2100).
const maxGapYears = 9

// next returns the first second after w (naive wall clock, seconds since
// the epoch read as UTC) that matches, or false when there is none within
// maxGapYears (which parse rules out for accepted specs) or before maxSec.
func (b *cronBits) next(w int64) (int64, bool) {
	if w >= maxSec {
		return 0, false
	}
	t := w + 1
	days := floorDiv(t, 86400)
	rem := int(t - days*86400)
	h, mi, s := rem/3600, rem%3600/60, rem%60
	y, mo, d := civil(days)
	limit := y + maxGapYears
	for y <= limit {
		if b.month&(1<<uint(mo)) == 0 {
			if mo = nextBit(b.month, mo+1, 12); mo < 0 {
				y, mo = y+1, nextBit(b.month, 1, 12)
			}
			d, h, mi, s = 1, 0, 0, 0
			continue
		}
		if d > daysInMonth(y, mo) {
			d, h, mi, s = 1, 0, 0, 0
			if mo++; mo > 12 {
				y, mo = y+1, 1
			}
			continue
		}
		if !b.dayMatches(y, mo, d) {
			d, h, mi, s = d+1, 0, 0, 0
			continue
		}
		if b.hour&(1<<uint(h)) == 0 {
			if h = nextBit(b.hour, h+1, 23); h < 0 {
				d, h, mi, s = d+1, 0, 0, 0
				continue
			}
			mi, s = 0, 0
		}
		if b.min&(1<<uint(mi)) == 0 {
			if mi = nextBit(b.min, mi+1, 59); mi < 0 {
				h, mi, s = h+1, 0, 0
				if h > 23 {
					d, h = d+1, 0
				}
				continue
			}
			s = 0
		}
		if b.sec&(1<<uint(s)) == 0 {
			if s = nextBit(b.sec, s+1, 59); s < 0 {
				mi, s = mi+1, 0
				if mi > 59 {
					h, mi = h+1, 0
					if h > 23 {
						d, h = d+1, 0
					}
				}
				continue
			}
		}
		c := daysFromCivil(y, mo, d)*86400 + int64(h*3600+mi*60+s)
		return c, c <= maxSec
	}
	return 0, false
}

func (b *cronBits) dayMatches(y, mo, d int) bool {
	domOK := b.dom&(1<<uint(d)) != 0
	dowOK := b.dow&(1<<uint(weekday(daysFromCivil(y, mo, d)))) != 0
	if b.dayAnd {
		return domOK && dowOK
	}
	return domOK || dowOK
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// weekday returns 0 (Sunday) to 6 for a day counted from 1970-01-01, a
// Thursday.
func weekday(days int64) int {
	return int((days%7 + 11) % 7)
}

func isLeap(y int) bool { return y%4 == 0 && (y%100 != 0 || y%400 == 0) }

func daysInMonth(y, mo int) int {
	if mo == 2 && !isLeap(y) {
		return 28
	}
	return daysIn[mo]
}

// daysFromCivil and civil convert between proleptic Gregorian dates and days
// since 1970-01-01 (H. Hinnant's algorithms).
func daysFromCivil(y, m, d int) int64 {
	if m <= 2 {
		y--
	}
	era := floorDiv(int64(y), 400)
	yoe := int64(y) - era*400
	mp := int64(m + 9)
	if m > 2 {
		mp = int64(m - 3)
	}
	doy := (153*mp+2)/5 + int64(d) - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

func civil(days int64) (y, m, d int) {
	z := days + 719468
	era := floorDiv(z, 146097)
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = int(doy - (153*mp+2)/5 + 1)
	m = int(mp + 3)
	if mp >= 10 {
		m = int(mp - 9)
	}
	y = int(yoe + era*400)
	if m <= 2 {
		y++
	}
	return y, m, d
}
