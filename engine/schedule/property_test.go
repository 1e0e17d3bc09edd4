package schedule

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

// randomSpec returns a random valid 5- or 6-field spec using every syntax:
// numbers, names, ranges, steps, lists, *, ? and H forms.
func randomSpec(rng *rand.Rand) string {
	var f [6]string
	for i := range f {
		d := &fields[i]
		n := 1 + rng.IntN(3)
		if rng.IntN(2) == 0 {
			n = 1
		}
		var els []string
		for range n {
			els = append(els, randomElement(rng, d))
		}
		f[i] = strings.Join(els, ",")
	}
	// Mostly unrestricted days, or the spec rarely fires in a short window.
	if rng.IntN(3) > 0 {
		f[3] = "*"
	}
	if rng.IntN(3) > 0 {
		f[4] = "*"
	}
	if rng.IntN(3) > 0 {
		f[5] = "?"
	}
	if rng.IntN(2) == 0 {
		return strings.Join(f[1:], " ")
	}
	return strings.Join(f[:], " ")
}

func randomElement(rng *rand.Rand, d *field) string {
	span := d.max - d.min + 1
	val := func() string {
		v := d.min + rng.IntN(span)
		if d.names != nil && rng.IntN(3) == 0 {
			for name, n := range d.names {
				if n == v {
					return strings.ToUpper(name[:1]) + name[1:]
				}
			}
		}
		return fmt.Sprint(v)
	}
	hval := func() (int, int) {
		a := d.hmin + rng.IntN(d.hmax-d.hmin+1)
		b := a + rng.IntN(d.hmax-a+1)
		return a, b
	}
	switch rng.IntN(10) {
	case 0:
		return "*"
	case 1:
		return fmt.Sprintf("*/%d", 1+rng.IntN(span))
	case 2:
		return val()
	case 3:
		a := d.min + rng.IntN(span)
		b := a + rng.IntN(d.max-a+1)
		return fmt.Sprintf("%d-%d", a, b)
	case 4:
		a := d.min + rng.IntN(span)
		b := a + rng.IntN(d.max-a+1)
		return fmt.Sprintf("%d-%d/%d", a, b, 1+rng.IntN(span))
	case 5:
		return fmt.Sprintf("%d/%d", d.min+rng.IntN(span), 1+rng.IntN(span))
	case 6:
		return "H"
	case 7:
		return fmt.Sprintf("H/%d", 1+rng.IntN(d.hmax-d.hmin+1))
	case 8:
		a, b := hval()
		return fmt.Sprintf("H(%d-%d)", a, b)
	default:
		a, b := hval()
		return fmt.Sprintf("H(%d-%d)/%d", a, b, 1+rng.IntN(b-a+1))
	}
}

// robfigDescriptor parses a descriptor with robfig's own parser.
func robfigDescriptor(d string) (*cron.SpecSchedule, error) {
	s, err := cron.ParseStandard(d)
	if err != nil {
		return nil, err
	}
	return s.(*cron.SpecSchedule), nil
}

// TestNext_MatchesRobfigInUTC checks, for random valid specs and times, that
// Next in UTC is strictly increasing and equals robfig's own Next for the
// resolved spec (where robfig finds a fire within its five years).
func TestNext_MatchesRobfigInUTC(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	robfig := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	lo, hi := utc(1890, 1, 1, 0, 0, 0).Unix(), utc(2300, 1, 1, 0, 0, 0).Unix()
	for n := 0; n < 4000; n++ {
		spec := randomSpec(rng)
		id := fmt.Sprint("task-", rng.IntN(1000))
		s, err := Parse(spec, "UTC", id)
		if err != nil {
			if strings.Contains(err.Error(), "never fires") {
				continue
			}
			t.Fatalf("Parse(%q): %v", spec, err)
		}
		resolved, _ := Resolve(spec, id)
		ref, err := robfig.Parse(resolved)
		if err != nil {
			t.Fatalf("robfig refuses resolved %q (from %q): %v", resolved, spec, err)
		}
		ref.(*cron.SpecSchedule).Location = time.UTC
		x := time.Unix(lo+rng.Int64N(hi-lo), rng.Int64N(1e9))
		for range 20 {
			got, want := s.Next(x), ref.Next(x)
			if want.IsZero() {
				break
			}
			if !got.Equal(want) {
				t.Fatalf("%q (%q) Next(%v) = %v, robfig %v", spec, resolved, x, got, want)
			}
			if !got.After(x) {
				t.Fatalf("%q Next(%v) = %v, not after", spec, x, got)
			}
			x = got
		}
	}
}

// TestNext_StrictlyIncreasing checks random specs in zones with clock changes.
func TestNext_StrictlyIncreasing(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	zones := []string{"Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Pacific/Apia", "America/Sao_Paulo"}
	for n := 0; n < 300; n++ {
		spec := randomSpec(rng)
		zone := zones[rng.IntN(len(zones))]
		s, err := Parse(spec, zone, "id")
		if err != nil {
			continue
		}
		x := time.Unix(utc(2005, 1, 1, 0, 0, 0).Unix()+rng.Int64N(30*365*86400), 0)
		for range 50 {
			next := s.Next(x)
			if next.IsZero() || !next.After(x) {
				t.Fatalf("%q in %s: Next(%v) = %v", spec, zone, x, next)
			}
			x = next
		}
	}
}

// TestParse_HGolden pins the values H resolves to: they are part of the
// contract, and every node and every future version must compute them.
func TestParse_HGolden(t *testing.T) {
	tests := []struct{ id, spec, want string }{
		{"billing/invoice-42", "H * * * *", "0 28 * * * *"},
		{"billing/invoice-42", "H H H H H H", "56 28 1 24 9 2"},
		{"billing/invoice-42", "H/15 * * * *", "0 13-59/15 * * * *"},
		{"billing/invoice-42", "H(0-29)/10 H(9-17) * * *", "0 8-29/10 16 * * *"},
		{"billing/invoice-42", "H/20 H/6 H/7 H/3 H/2", "0 8-59/20 1-23/6 3-28/7 3-12/3 0-6/2"},
		{"billing/invoice-42", "H(0-29),H(30-59) * * * *", "0 28,58 * * * *"},
		{"a", "H * * * *", "0 44 * * * *"},
		{"a", "H H H H H H", "34 44 10 21 12 2"},
		{"a", "H/15 * * * *", "0 14-59/15 * * * *"},
		{"a", "H(0-29)/10 H(9-17) * * *", "0 4-29/10 10 * * *"},
		{"a", "H/20 H/6 H/7 H/3 H/2", "0 4-59/20 4-23/6 7-28/7 3-12/3 1-6/2"},
		{"", "H * * * *", "0 15 * * * *"},
		{"", "H H H H H H", "29 15 9 16 12 3"},
		{"", "H/15 * * * *", "0 0-59/15 * * * *"},
		{"task-000001", "H * * * *", "0 45 * * * *"},
		{"task-000001", "H H H H H H", "38 45 8 2 9 2"},
		{"task-000001", "H(0-29)/10 H(9-17) * * *", "0 5-29/10 11 * * *"},
		{"日本/タスク", "H * * * *", "0 42 * * * *"},
		{"日本/タスク", "H H H H H H", "47 42 4 18 9 5"},
		{"日本/タスク", "H/20 H/6 H/7 H/3 H/2", "0 2-59/20 4-23/6 4-28/7 3-12/3 0-6/2"},
		// The 5- and 6-field forms hash the same field positions.
		{"billing/invoice-42", "0 H * * * *", "0 28 * * * *"},
	}
	for _, tt := range tests {
		got, err := Resolve(tt.spec, tt.id)
		if err != nil || got != tt.want {
			t.Errorf("Resolve(%q, %q) = %q, %v, want %q", tt.spec, tt.id, got, err, tt.want)
		}
	}
	// The hash itself, so a change of hash input is caught even where the
	// modular values above happen to survive it.
	wantH := [6]uint64{0xaafd5f942d02c510, 0x9c9cfa33ad60bfc8, 0x1ab4c5dbc240d449, 0x923037abb8c51577, 0x9cbf9eb604febae0, 0xda5b270142fc42a0}
	for i, want := range wantH {
		if got := hashField("billing/invoice-42", i); got != want {
			t.Errorf("hashField(field %d) = %#x, want %#x", i, got, want)
		}
	}
}

// TestParse_HSpread checks that H spreads ids evenly and stays in range.
func TestParse_HSpread(t *testing.T) {
	const n = 60_000
	var perMinute [60]int
	for i := range n {
		id := fmt.Sprintf("tenant-%d/task-%d", i%97, i)
		r, err := Resolve("H H(1-20) * * *", id)
		if err != nil {
			t.Fatal(err)
		}
		var sec, minute, hour int
		if _, err := fmt.Sscanf(r, "%d %d %d * * *", &sec, &minute, &hour); err != nil {
			t.Fatalf("%q: %v", r, err)
		}
		if hour < 1 || hour > 20 {
			t.Fatalf("%q: hour %d out of H(1-20)", r, hour)
		}
		perMinute[minute]++
	}
	// Each minute expects 1000; a fair hash stays well within ±20%.
	for m, c := range perMinute {
		if c < 800 || c > 1200 {
			t.Errorf("minute %d: %d ids, want about %d", m, c, n/60)
		}
	}
}

func TestCivil_MatchesTime(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	check := func(days int64) {
		y, m, d := civil(days)
		want := time.Unix(days*86400, 0).UTC()
		if y != want.Year() || m != int(want.Month()) || d != want.Day() {
			t.Fatalf("civil(%d) = %d-%d-%d, want %v", days, y, m, d, want)
		}
		if got := daysFromCivil(y, m, d); got != days {
			t.Fatalf("daysFromCivil(%d-%d-%d) = %d, want %d", y, m, d, got, days)
		}
		if got := weekday(days); got != int(want.Weekday()) {
			t.Fatalf("weekday(%d) = %d, want %d", days, got, want.Weekday())
		}
		if got := daysInMonth(y, m); got != time.Date(y, time.Month(m)+1, 0, 0, 0, 0, 0, time.UTC).Day() {
			t.Fatalf("daysInMonth(%d, %d) = %d", y, m, got)
		}
	}
	for days := int64(-800_000); days < 3_000_000; days += 1 + rng.Int64N(50) {
		check(days)
	}
}
