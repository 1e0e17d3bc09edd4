package schedule

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

// TestNext_DST checks exactly which instants fire across the clock changes
// of 2026, against the rule of docs/api.md: a wall time in a gap fires once at the
// first instant after the gap, a repeated wall time once at its first
// occurrence, and nothing fires twice.
func TestNext_DST(t *testing.T) {
	tests := []struct {
		name, zone, spec string
		from             time.Time
		want             []time.Time // UTC
	}{
		// Europe/Berlin, spring forward 2026-03-29 02:00 CET -> 03:00 CEST
		// (01:00 UTC): wall times 02:00-02:59 do not exist.
		{"berlin/spring/daily 02:30", "Europe/Berlin", "30 2 * * *", utc(2026, 3, 27, 0, 0, 0), []time.Time{
			utc(2026, 3, 27, 1, 30, 0), // 02:30 CET
			utc(2026, 3, 28, 1, 30, 0), // 02:30 CET
			utc(2026, 3, 29, 1, 0, 0),  // 02:30 does not exist: 03:00 CEST
			utc(2026, 3, 30, 0, 30, 0), // 02:30 CEST
		}},
		{"berlin/spring/quarter hours", "Europe/Berlin", "0,15,30,45 * * * *", utc(2026, 3, 29, 0, 20, 0), []time.Time{
			utc(2026, 3, 29, 0, 30, 0), // 01:30 CET
			utc(2026, 3, 29, 0, 45, 0), // 01:45 CET
			utc(2026, 3, 29, 1, 0, 0),  // 02:00, 02:15, 02:30, 02:45 and 03:00 CEST, once
			utc(2026, 3, 29, 1, 15, 0), // 03:15 CEST
			utc(2026, 3, 29, 1, 30, 0),
		}},
		{"berlin/spring/every minute", "Europe/Berlin", "0 * * * * *", utc(2026, 3, 29, 0, 58, 0), []time.Time{
			utc(2026, 3, 29, 0, 59, 0), // 01:59 CET
			utc(2026, 3, 29, 1, 0, 0),  // the whole gap and 03:00 CEST
			utc(2026, 3, 29, 1, 1, 0),  // 03:01 CEST
		}},
		{"berlin/spring/half hours", "Europe/Berlin", "0 */30 * * * *", utc(2026, 3, 29, 0, 10, 0), []time.Time{
			utc(2026, 3, 29, 0, 30, 0), // 01:30 CET
			utc(2026, 3, 29, 1, 0, 0),  // 02:00, 02:30, 03:00 CEST
			utc(2026, 3, 29, 1, 30, 0), // 03:30 CEST
		}},
		{"berlin/spring/every second", "Europe/Berlin", "* * * * * *", utc(2026, 3, 29, 0, 59, 58), []time.Time{
			utc(2026, 3, 29, 0, 59, 59), // 01:59:59 CET
			utc(2026, 3, 29, 1, 0, 0),   // 02:00:00-02:59:59 and 03:00:00 CEST
			utc(2026, 3, 29, 1, 0, 1),
		}},
		{"berlin/spring/daily 02:00 hourly", "Europe/Berlin", "@hourly", utc(2026, 3, 28, 23, 30, 0), []time.Time{
			utc(2026, 3, 29, 0, 0, 0), // 01:00 CET
			utc(2026, 3, 29, 1, 0, 0), // 02:00 and 03:00
			utc(2026, 3, 29, 2, 0, 0), // 04:00 CEST
		}},
		// Europe/Berlin, fall back 2026-10-25 03:00 CEST -> 02:00 CET
		// (01:00 UTC): wall times 02:00-02:59 occur twice.
		{"berlin/fall/daily 02:30", "Europe/Berlin", "30 2 * * *", utc(2026, 10, 23, 0, 0, 0), []time.Time{
			utc(2026, 10, 23, 0, 30, 0), // 02:30 CEST
			utc(2026, 10, 24, 0, 30, 0), // 02:30 CEST
			utc(2026, 10, 25, 0, 30, 0), // first 02:30 (CEST) only
			utc(2026, 10, 26, 1, 30, 0), // 02:30 CET
		}},
		{"berlin/fall/quarter hours", "Europe/Berlin", "0,15,30,45 * * * *", utc(2026, 10, 24, 23, 40, 0), []time.Time{
			utc(2026, 10, 24, 23, 45, 0), // 01:45 CEST
			utc(2026, 10, 25, 0, 0, 0),   // 02:00 CEST
			utc(2026, 10, 25, 0, 15, 0),
			utc(2026, 10, 25, 0, 30, 0),
			utc(2026, 10, 25, 0, 45, 0), // 02:45 CEST; the CET pass repeats nothing
			utc(2026, 10, 25, 2, 0, 0),  // 03:00 CET
			utc(2026, 10, 25, 2, 15, 0),
		}},
		{"berlin/fall/every minute", "Europe/Berlin", "0 * * * * *", utc(2026, 10, 25, 0, 58, 0), []time.Time{
			utc(2026, 10, 25, 0, 59, 0), // 02:59 CEST
			utc(2026, 10, 25, 2, 0, 0),  // 03:00 CET
			utc(2026, 10, 25, 2, 1, 0),
		}},
		{"berlin/fall/inside the repeated hour", "Europe/Berlin", "0 * * * * *", utc(2026, 10, 25, 1, 30, 0), []time.Time{
			utc(2026, 10, 25, 2, 0, 0), // from 02:30 CET (second pass): 03:00 CET
		}},
		{"berlin/fall/every second inside the repeated hour", "Europe/Berlin", "* * * * * *", utc(2026, 10, 25, 1, 0, 0), []time.Time{
			utc(2026, 10, 25, 2, 0, 0),
			utc(2026, 10, 25, 2, 0, 1),
		}},
		{"berlin/fall/half hours", "Europe/Berlin", "0 */30 * * * *", utc(2026, 10, 24, 23, 10, 0), []time.Time{
			utc(2026, 10, 24, 23, 30, 0), // 01:30 CEST
			utc(2026, 10, 25, 0, 0, 0),   // 02:00 CEST
			utc(2026, 10, 25, 0, 30, 0),  // 02:30 CEST
			utc(2026, 10, 25, 2, 0, 0),   // 03:00 CET
			utc(2026, 10, 25, 2, 30, 0),
		}},
		{"berlin/fall/hourly", "Europe/Berlin", "@hourly", utc(2026, 10, 24, 23, 30, 0), []time.Time{
			utc(2026, 10, 25, 0, 0, 0), // 02:00 CEST
			utc(2026, 10, 25, 2, 0, 0), // 03:00 CET; 02:00 CET repeats
			utc(2026, 10, 25, 3, 0, 0),
		}},
		{"berlin/fall/@every ignores the change", "Europe/Berlin", "@every 30m", utc(2026, 10, 25, 0, 10, 0), []time.Time{
			utc(2026, 10, 25, 0, 30, 0),
			utc(2026, 10, 25, 1, 0, 0),
			utc(2026, 10, 25, 1, 30, 0),
			utc(2026, 10, 25, 2, 0, 0),
		}},
		// America/New_York: 2026-03-08 02:00 EST -> 03:00 EDT (07:00 UTC),
		// 2026-11-01 02:00 EDT -> 01:00 EST (06:00 UTC).
		{"new york/spring", "America/New_York", "30 2 * * *", utc(2026, 3, 7, 0, 0, 0), []time.Time{
			utc(2026, 3, 7, 7, 30, 0), // 02:30 EST
			utc(2026, 3, 8, 7, 0, 0),  // 03:00 EDT
			utc(2026, 3, 9, 6, 30, 0), // 02:30 EDT
		}},
		{"new york/fall", "America/New_York", "30 1 * * *", utc(2026, 10, 31, 0, 0, 0), []time.Time{
			utc(2026, 10, 31, 5, 30, 0), // 01:30 EDT
			utc(2026, 11, 1, 5, 30, 0),  // first 01:30 (EDT)
			utc(2026, 11, 2, 6, 30, 0),  // 01:30 EST
		}},
		{"new york/fall/every 20 minutes", "America/New_York", "*/20 * * * *", utc(2026, 11, 1, 5, 30, 0), []time.Time{
			utc(2026, 11, 1, 5, 40, 0), // 01:40 EDT
			utc(2026, 11, 1, 7, 0, 0),  // 02:00 EST: 01:00-01:40 EST repeat
			utc(2026, 11, 1, 7, 20, 0),
		}},
		// Australia/Sydney: 2026-04-05 03:00 AEDT -> 02:00 AEST (04-04 16:00
		// UTC), 2026-10-04 02:00 AEST -> 03:00 AEDT (10-03 16:00 UTC).
		{"sydney/fall back in april", "Australia/Sydney", "30 2 * * *", utc(2026, 4, 3, 0, 0, 0), []time.Time{
			utc(2026, 4, 3, 15, 30, 0), // 04-04 02:30 AEDT
			utc(2026, 4, 4, 15, 30, 0), // 04-05 first 02:30 (AEDT)
			utc(2026, 4, 5, 16, 30, 0), // 04-06 02:30 AEST
		}},
		{"sydney/spring forward in october", "Australia/Sydney", "30 2 * * *", utc(2026, 10, 2, 0, 0, 0), []time.Time{
			utc(2026, 10, 2, 16, 30, 0), // 10-03 02:30 AEST
			utc(2026, 10, 3, 16, 0, 0),  // 10-04 03:00 AEDT
			utc(2026, 10, 4, 15, 30, 0), // 10-05 02:30 AEDT
		}},
		// Australia/Lord_Howe moves its clocks by 30 minutes:
		// 2026-10-04 02:00 -> 02:30 (+10:30 -> +11, 10-03 15:30 UTC).
		{"lord howe/half-hour shift", "Australia/Lord_Howe", "*/20 2 * * *", utc(2026, 10, 3, 15, 0, 0), []time.Time{
			utc(2026, 10, 3, 15, 30, 0), // 02:00 +10:30... is 15:30 UTC: the gap starts there
			utc(2026, 10, 3, 15, 40, 0), // 02:40 +11
			utc(2026, 10, 4, 15, 0, 0),  // next day 02:00 +11
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.spec, tt.zone, "id")
			if err != nil {
				t.Fatal(err)
			}
			got := fires(s, tt.from, len(tt.want))
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("%q in %s from %v:\n got %v\nwant %v", tt.spec, tt.zone, tt.from, got, tt.want)
			}
		})
	}
}

// TestNext_DSTReference compares Next with a brute-force reference of the
// DST rule, for random specs around real clock changes, including odd ones:
// 30-minute shifts, a skipped day (Samoa 2011), midnight gaps (Sao Paulo),
// a 2h shift (Antarctica/Troll).
func TestNext_DSTReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	zones := []struct {
		name  string
		years []int
	}{
		{"Europe/Berlin", []int{2026, 1980}},
		{"America/New_York", []int{2026}},
		{"Australia/Sydney", []int{2026}},
		{"Australia/Lord_Howe", []int{2026}},
		{"America/Sao_Paulo", []int{2018}},
		{"Pacific/Apia", []int{2011}},
		{"Antarctica/Troll", []int{2026}},
		{"America/St_Johns", []int{2026}},
		{"Africa/Casablanca", []int{2026}},
		{"Europe/Dublin", []int{2026}}, // negative DST in the tz database
		{"Asia/Tokyo", []int{1950}},
	}
	specs := []string{"* * * * * *", "*/7 * * * * *", "0 * * * * *", "30 2 * * *", "0 0 * * *", "*/15 * * * *", "59 * * * *", "0 1-3 * * *"}
	for range 40 {
		specs = append(specs, randomSpec(rng))
	}
	for _, zc := range zones {
		z, err := loadZone(zc.name)
		if err != nil {
			t.Fatal(err)
		}
		for _, year := range zc.years {
			for _, tr := range transitions(z.loc, year) {
				for _, spec := range specs {
					checkAgainstReference(t, spec, z, tr-3*3600, tr+3*3600, rng)
				}
			}
		}
	}
}

// TestNext_PastTheTable checks years after the precomputed table (2200),
// where periods come from Go's TZ-rule evaluation, whose bounds are only
// approximate around year ends (a leap year's last period ends a day early).
func TestNext_PastTheTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, name := range []string{"Europe/Berlin", "Australia/Sydney", "America/New_York"} {
		z, err := loadZone(name)
		if err != nil {
			t.Fatal(err)
		}
		var windows []int64
		for _, y := range []int{2204, 2205, 2208} {
			windows = append(windows, utc(y, 12, 31, 12, 0, 0).Unix(), utc(y+1, 1, 1, 0, 0, 0).Unix(), utc(y+1, 1, 1, 12, 0, 0).Unix())
			windows = append(windows, transitions(z.loc, y)...)
		}
		for _, w := range windows {
			for _, spec := range []string{"*/10 * * * * *", "0 * * * * *", "30 2 * * *", "0 0 * * *"} {
				checkAgainstReference(t, spec, z, w-2*3600, w+2*3600, rng)
			}
		}
	}
}

// TestNext_DSTAllZones runs the reference check for a few specs on every
// clock change of 2026 in every zone of the system's zone1970.tab.
func TestNext_DSTAllZones(t *testing.T) {
	names := systemZones(t)
	rng := rand.New(rand.NewPCG(3, 4))
	n := 0
	for _, name := range names {
		z, err := loadZone(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, tr := range transitions(z.loc, 2026) {
			n++
			for _, spec := range []string{"0 * * * * *", "30 2 * * *", "*/15 * * * *", "0 0 * * *"} {
				checkAgainstReference(t, spec, z, tr-3*3600, tr+3*3600, rng)
			}
		}
	}
	t.Logf("%d zones, %d clock changes in 2026", len(names), n)
}

// TestZone_TableMatchesLocation checks the precomputed periods against the
// Location, for every zone, inside and outside the table's years.
func TestZone_TableMatchesLocation(t *testing.T) {
	names := append(systemZones(t), "UTC", "Etc/GMT+5", "Pacific/Apia")
	rng := rand.New(rand.NewPCG(5, 6))
	lo, hi := utc(1850, 1, 1, 0, 0, 0).Unix(), utc(2300, 1, 1, 0, 0, 0).Unix()
	for _, name := range names {
		z, err := loadZone(name)
		if err != nil {
			t.Fatal(err)
		}
		for range 300 {
			x := lo + rng.Int64N(hi-lo)
			p := z.periodAt(x)
			_, off := time.Unix(x, 0).In(z.loc).Zone()
			if p.start > x || x >= p.end || p.off != int64(off) {
				t.Fatalf("%s: periodAt(%v) = [%d, %d) offset %d, want offset %d", name, time.Unix(x, 0).UTC(), p.start, p.end, p.off, off)
			}
		}
	}
}

func systemZones(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("/usr/share/zoneinfo/zone1970.tab")
	if err != nil {
		t.Skipf("no system zone list: %v", err)
	}
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		if f := strings.Split(line, "\t"); len(f) >= 3 {
			names = append(names, f[2])
		}
	}
	return names
}

// transitions returns the instants in year where loc's UTC offset changes,
// found by scanning and bisecting with Time.Zone only.
func transitions(loc *time.Location, year int) []int64 {
	off := func(x int64) int {
		_, o := time.Unix(x, 0).In(loc).Zone()
		return o
	}
	var out []int64
	start, end := utc(year, 1, 1, 0, 0, 0).Unix(), utc(year+1, 1, 1, 0, 0, 0).Unix()
	const step = 3600 * 6
	for x := start; x < end; x += step {
		if off(x) == off(x+step) {
			continue
		}
		lo, hi := x, x+step // off(lo) != off(hi)
		for hi-lo > 1 {
			m := (lo + hi) / 2
			if off(m) == off(lo) {
				lo = m
			} else {
				hi = m
			}
		}
		out = append(out, hi)
	}
	return out
}

// checkAgainstReference compares the fires of spec in z over the instants
// (from, to] with the reference, and Next from random points in between.
func checkAgainstReference(t *testing.T, spec string, z *zone, from, to int64, rng *rand.Rand) {
	t.Helper()
	s, err := Parse(spec, z.name, "ref")
	if err != nil {
		t.Fatalf("Parse(%q): %v", spec, err)
	}
	want := referenceFires(t, spec, z.loc, from, to)
	var got []int64
	for x := time.Unix(from, 0); ; {
		x = s.Next(x)
		if x.IsZero() || x.Unix() > to {
			break
		}
		got = append(got, x.Unix())
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		i := 0 // show the fires around the first difference
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		lo := max(i-2, 0)
		t.Fatalf("%q in %s over (%v, %v], from fire %d on:\n got %v\nwant %v", spec, z.name,
			time.Unix(from, 0).UTC(), time.Unix(to, 0).UTC(), lo,
			fmtUnix(got[lo:min(i+3, len(got))]), fmtUnix(want[lo:min(i+3, len(want))]))
	}
	for range 20 {
		x := from + rng.Int64N(to-from)
		nsec := rng.Int64N(2) * rng.Int64N(1e9)
		next := s.Next(time.Unix(x, nsec))
		i := sort.Search(len(want), func(i int) bool { return want[i] > x })
		if i == len(want) {
			continue // the next fire lies beyond the window
		}
		if next.Unix() != want[i] {
			t.Fatalf("%q in %s: Next(%v) = %v, want %v", spec, z.name, time.Unix(x, nsec).UTC(), next, time.Unix(want[i], 0).UTC())
		}
	}
}

func fmtUnix(xs []int64) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = time.Unix(x, 0).UTC().Format("01-02 15:04:05")
	}
	return out
}

// referenceFires lists the instants in (from, to] at which spec fires in loc
// under the DST rule, by brute force: every wall-clock second near the
// window that matches the spec is mapped to the first instant whose wall
// clock reads it, or to the end of the gap it falls in.
func referenceFires(t *testing.T, spec string, loc *time.Location, from, to int64) []int64 {
	t.Helper()
	resolved, err := Resolve(spec, "ref")
	if err != nil {
		t.Fatal(err)
	}
	cs, err := robfigParse(resolved)
	if err != nil {
		t.Fatal(err)
	}
	wall := func(x int64) int64 {
		_, o := time.Unix(x, 0).In(loc).Zone()
		return x + int64(o)
	}
	// Offsets in use near the window, and its clock changes.
	offsets := map[int64]bool{}
	for x := from - 2*86400; x <= to+2*86400; x += 900 {
		offsets[wall(x)-x] = true
	}
	var changes []int64
	for y := time.Unix(from, 0).UTC().Year() - 1; y <= time.Unix(to, 0).UTC().Year()+1; y++ {
		changes = append(changes, transitions(loc, y)...)
	}
	toInstant := func(w int64) int64 {
		best, found := int64(0), false
		for o := range offsets {
			if i := w - o; wall(i) == w && (!found || i < best) {
				best, found = i, true
			}
		}
		if found {
			return best
		}
		for _, c := range changes { // w lies in a gap: the change that skips it
			if wall(c-1) < w && w < wall(c) {
				return c
			}
		}
		t.Fatalf("reference: wall time %v maps to nothing", time.Unix(w, 0).UTC())
		return 0
	}
	// The wall times that can map into the window: those read in it, and
	// those skipped by a gap ending in it.
	wmin, wmax := wall(from), wall(to)
	probe := func(x int64) { wmin, wmax = min(wmin, wall(x)), max(wmax, wall(x)) }
	for x := from; x <= to; x += 900 {
		probe(x)
	}
	for _, c := range changes {
		if c > from && c <= to {
			probe(c - 1)
			probe(c)
		}
	}
	step := int64(1)
	if cs.Second == 1 { // second 0 only: minutes suffice
		step = 60
		wmin -= wmin % 60
	}
	seen := map[int64]bool{}
	var out []int64
	for w := wmin - 60; w <= wmax+60; w += step {
		if !matches(cs, time.Unix(w, 0).UTC()) {
			continue
		}
		if i := toInstant(w); i > from && i <= to && !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a] < out[b] })
	return out
}

// matches reports whether naive wall time w matches cs, from its bit sets.
func matches(cs *cron.SpecSchedule, w time.Time) bool {
	bit := func(set uint64, v int) bool { return set&(1<<uint(v)) != 0 }
	if !bit(cs.Second, w.Second()) || !bit(cs.Minute, w.Minute()) || !bit(cs.Hour, w.Hour()) || !bit(cs.Month, int(w.Month())) {
		return false
	}
	dom, dow := bit(cs.Dom, w.Day()), bit(cs.Dow, int(w.Weekday()))
	if cs.Dom&starBit != 0 || cs.Dow&starBit != 0 {
		return dom && dow
	}
	return dom || dow
}
