package schedule

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func utc(y int, mo time.Month, d, h, mi, s int) time.Time {
	return time.Date(y, mo, d, h, mi, s, 0, time.UTC)
}

// fires returns the first n fire times of s after from.
func fires(s Schedule, from time.Time, n int) []time.Time {
	var out []time.Time
	for t := from; len(out) < n; {
		t = s.Next(t)
		if t.IsZero() {
			break
		}
		out = append(out, t)
	}
	return out
}

func TestParse_Forms(t *testing.T) {
	from := utc(2026, time.March, 14, 10, 7, 30) // a Saturday
	tests := []struct {
		spec, zone string
		want       []time.Time
	}{
		{"* * * * *", "", []time.Time{utc(2026, 3, 14, 10, 8, 0), utc(2026, 3, 14, 10, 9, 0)}},
		{"* * * * * *", "", []time.Time{utc(2026, 3, 14, 10, 7, 31), utc(2026, 3, 14, 10, 7, 32)}},
		{"*/20 * * * * *", "UTC", []time.Time{utc(2026, 3, 14, 10, 7, 40), utc(2026, 3, 14, 10, 8, 0)}},
		{"0 */5 * * * *", "UTC", []time.Time{utc(2026, 3, 14, 10, 10, 0), utc(2026, 3, 14, 10, 15, 0)}},
		{"  5   4 * * *  ", "", []time.Time{utc(2026, 3, 15, 4, 5, 0), utc(2026, 3, 16, 4, 5, 0)}},
		{"0 9-17/4 * * mon-fri", "", []time.Time{utc(2026, 3, 16, 9, 0, 0), utc(2026, 3, 16, 13, 0, 0), utc(2026, 3, 16, 17, 0, 0), utc(2026, 3, 17, 9, 0, 0)}},
		{"30 5/6 * * *", "", []time.Time{utc(2026, 3, 14, 11, 30, 0), utc(2026, 3, 14, 17, 30, 0), utc(2026, 3, 14, 23, 30, 0), utc(2026, 3, 15, 5, 30, 0)}},
		{"0 0 1,15 * ?", "", []time.Time{utc(2026, 3, 15, 0, 0, 0), utc(2026, 4, 1, 0, 0, 0)}},
		{"0 0 0 1 JAN *", "", []time.Time{utc(2027, 1, 1, 0, 0, 0)}},
		{"0 12 * * SUN", "", []time.Time{utc(2026, 3, 15, 12, 0, 0), utc(2026, 3, 22, 12, 0, 0)}},
		// Day-of-month and day-of-week both restricted: either matches.
		{"0 0 13 * 1", "", []time.Time{utc(2026, 3, 16, 0, 0, 0), utc(2026, 3, 23, 0, 0, 0), utc(2026, 3, 30, 0, 0, 0), utc(2026, 4, 6, 0, 0, 0), utc(2026, 4, 13, 0, 0, 0)}},
		{"0 0 29 2 *", "", []time.Time{utc(2028, 2, 29, 0, 0, 0), utc(2032, 2, 29, 0, 0, 0)}},
		{"@yearly", "", []time.Time{utc(2027, 1, 1, 0, 0, 0), utc(2028, 1, 1, 0, 0, 0)}},
		{"@annually", "", []time.Time{utc(2027, 1, 1, 0, 0, 0)}},
		{"@monthly", "", []time.Time{utc(2026, 4, 1, 0, 0, 0), utc(2026, 5, 1, 0, 0, 0)}},
		{"@weekly", "", []time.Time{utc(2026, 3, 15, 0, 0, 0), utc(2026, 3, 22, 0, 0, 0)}},
		{"@daily", "", []time.Time{utc(2026, 3, 15, 0, 0, 0), utc(2026, 3, 16, 0, 0, 0)}},
		{"@midnight", "", []time.Time{utc(2026, 3, 15, 0, 0, 0)}},
		{"@hourly", "", []time.Time{utc(2026, 3, 14, 11, 0, 0), utc(2026, 3, 14, 12, 0, 0)}},
		{"@every 1h", "Europe/Berlin", []time.Time{utc(2026, 3, 14, 11, 0, 0), utc(2026, 3, 14, 12, 0, 0)}},
		{"@every 45s", "", []time.Time{utc(2026, 3, 14, 10, 8, 15), utc(2026, 3, 14, 10, 9, 0)}},
		// Zones without daylight saving time.
		{"0 9 * * *", "Asia/Tokyo", []time.Time{utc(2026, 3, 15, 0, 0, 0), utc(2026, 3, 16, 0, 0, 0)}},
		{"0 9 * * *", "Etc/GMT+5", []time.Time{utc(2026, 3, 14, 14, 0, 0), utc(2026, 3, 15, 14, 0, 0)}},
		{"0 9 * * *", "Asia/Kolkata", []time.Time{utc(2026, 3, 15, 3, 30, 0)}},
		{"0 9 * * *", "Europe/Berlin", []time.Time{utc(2026, 3, 15, 8, 0, 0)}},
	}
	for _, tt := range tests {
		t.Run(tt.spec+"@"+tt.zone, func(t *testing.T) {
			s, err := Parse(tt.spec, tt.zone, "id")
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got := fires(s, from, len(tt.want))
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if !got[i].Equal(tt.want[i]) {
					t.Errorf("fire %d: got %v, want %v", i, got[i], tt.want[i])
				}
				if got[i].Location() != time.UTC {
					t.Errorf("fire %d: location %v, want UTC", i, got[i].Location())
				}
			}
		})
	}
}

func TestParse_Errors(t *testing.T) {
	tests := []struct {
		spec, zone string
		want       string // the whole message
		zoneErr    bool
	}{
		{"", "", `"": empty schedule: want 5 or 6 cron fields or a descriptor such as @hourly`, false},
		{"   ", "", `"   ": empty schedule: want 5 or 6 cron fields or a descriptor such as @hourly`, false},
		{"* * * *", "", `"* * * *": want 5 fields (minute hour day-of-month month day-of-week) or 6 (second first), found 4`, false},
		{"* * * * * * *", "", `"* * * * * * *": want 5 fields (minute hour day-of-month month day-of-week) or 6 (second first), found 7`, false},
		{"61 * * * * *", "", `"61 * * * * *": second 61 out of range 0-59`, false},
		{"60 * * * *", "", `"60 * * * *": minute 60 out of range 0-59`, false},
		{"0 24 * * *", "", `"0 24 * * *": hour 24 out of range 0-23`, false},
		{"0 0 0 * *", "", `"0 0 0 * *": day-of-month 0 out of range 1-31`, false},
		{"0 0 * 13 *", "", `"0 0 * 13 *": month 13 out of range 1-12`, false},
		{"0 0 * * 7", "", `"0 0 * * 7": day-of-week 7 out of range 0-6 (Sunday is 0 or sun)`, false},
		{"0 0 1 1 * 2030", "", `"0 0 1 1 * 2030": day-of-week 2030 out of range 0-6 (a schedule has no year field: bound its fires with not_before and not_after, or use @at)`, false},
		{"0 0 * * 99999999999999999999", "", `"0 0 * * 99999999999999999999": day-of-week 99999999999999999999 out of range 0-6`, false},
		{"x * * * *", "", `"x * * * *": minute "x" is not a number`, false},
		{"0 0 * foo *", "", `"0 0 * foo *": month "foo" is not a number or a month name (jan-dec)`, false},
		{"0 0 * * funday", "", `"0 0 * * funday": day-of-week "funday" is not a number or a day name (sun-sat)`, false},
		{"-5 * * * *", "", `"-5 * * * *": minute "-5": missing number`, false},
		{"*-5 * * * *", "", `"*-5 * * * *": minute "*" is not a number`, false},
		{"5- * * * *", "", `"5- * * * *": minute "5-": missing number`, false},
		{"1,,2 * * * *", "", `"1,,2 * * * *": minute "1,,2" has an empty list element`, false},
		{", * * * *", "", `", * * * *": minute "," has an empty list element`, false},
		{"*/0 * * * *", "", `"*/0 * * * *": minute */0: step must be at least 1`, false},
		{"*/x * * * *", "", `"*/x * * * *": minute */x: step "x" is not a number`, false},
		{"*/5/2 * * * *", "", `"*/5/2 * * * *": minute */5/2: step "5/2" is not a number`, false},
		{"*/90 * * * *", "", `"*/90 * * * *": minute */90: step 90 is larger than the 60 values it steps through (for intervals use @every, e.g. @every 90m)`, false},
		{"0 22-2 * * *", "", `"0 22-2 * * *": hour 22-2: range starts after it ends (ranges do not wrap around: write 22-23,0-2)`, false},
		{"0 0 30 2 *", "", `"0 0 30 2 *": never fires: day-of-month 30 does not exist in February`, false},
		{"0 0 31 4 *", "", `"0 0 31 4 *": never fires: day-of-month 31 does not exist in April`, false},
		{"0 0 31 2,4,6 *", "", `"0 0 31 2,4,6 *": never fires: day-of-month 31 does not exist in February, April or June`, false},
		{"0 0 0 30,31 feb ?", "", `"0 0 0 30,31 feb ?": never fires: day-of-month 30,31 does not exist in February`, false},
		{"TZ=Europe/Berlin 0 * * * *", "", `"TZ=Europe/Berlin 0 * * * *": time zone prefixes are not supported: remove the prefix and put the zone in the timezone field`, false},
		{"CRON_TZ=UTC 0 * * * *", "", `"CRON_TZ=UTC 0 * * * *": time zone prefixes are not supported: remove the prefix and put the zone in the timezone field`, false},
		{"TZ=", "", `"TZ=": time zone prefixes are not supported: remove the prefix and put the zone in the timezone field`, false},
		{" TZ=x", "", `" TZ=x": time zone prefixes are not supported: remove the prefix and put the zone in the timezone field`, false},
		{"@every 500ms", "", `"@every 500ms": interval must be whole seconds and at least 1s`, false},
		{"@every 1.5s", "", `"@every 1.5s": interval must be whole seconds and at least 1s`, false},
		{"@every 0s", "", `"@every 0s": interval must be whole seconds and at least 1s`, false},
		{"@every -5s", "", `"@every -5s": interval must be whole seconds and at least 1s`, false},
		{"@every 5", "", `"@every 5": interval "5" is not a duration such as 30s or 1h30m`, false},
		{"@every", "", `"@every": want @every <duration>, e.g. @every 30s`, false},
		{"@every 1s 2s", "", `"@every 1s 2s": want @every <duration>, e.g. @every 30s`, false},
		{"@reboot", "", `"@reboot": unknown descriptor "@reboot" (want @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, @every <duration> or @at <RFC 3339 time>)`, false},
		{"@Daily", "", `"@Daily": unknown descriptor "@Daily" (want @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, @every <duration> or @at <RFC 3339 time>)`, false},
		{"@daily 5", "", `"@daily 5": @daily takes no arguments`, false},
		{"H(0-70) * * * *", "", `"H(0-70) * * * *": minute 70 out of range 0-59`, false},
		{"0 0 H(1-31) * *", "", `"0 0 H(1-31) * *": day-of-month H(1-31): the range of H must lie within 1-28`, false},
		{"H(30-10) * * * *", "", `"H(30-10) * * * *": minute H(30-10): range starts after it ends`, false},
		{"H(0-29 * * * *", "", `"H(0-29 * * * *": minute H(0-29: missing ) (want H, H/n, H(a-b) or H(a-b)/n)`, false},
		{"H(5) * * * *", "", `"H(5) * * * *": minute H(5): want a range in H(a-b), e.g. H(0-29)`, false},
		{"H/0 * * * *", "", `"H/0 * * * *": minute H/0: step must be at least 1`, false},
		{"H(0-9)/11 * * * *", "", `"H(0-9)/11 * * * *": minute H(0-9)/11: step 11 is larger than the 10 values it steps through (for intervals use @every, e.g. @every 90m)`, false},
		{"Hx * * * *", "", `"Hx * * * *": minute "Hx": want H, H/n, H(a-b) or H(a-b)/n`, false},
		{"H-5 * * * *", "", `"H-5 * * * *": minute "H-5": want H, H/n, H(a-b) or H(a-b)/n`, false},
		{"h * * * *", "", `"h * * * *": minute "h" is not a number`, false},
		{"* * * * *", "Mars/Olympus", `unknown time zone "Mars/Olympus" (want an IANA name such as "Europe/Berlin")`, true},
		{"@every 1m", "Mars/Olympus", `unknown time zone "Mars/Olympus" (want an IANA name such as "Europe/Berlin")`, true},
		{"* * * * *", "Local", `time zone "Local" differs between machines: use an IANA name such as "Europe/Berlin"`, true},
		{"* * * * *", "localtime", `time zone "localtime" differs between machines: use an IANA name such as "Europe/Berlin"`, true},
		{"* * * * *", "posixrules", `time zone "posixrules" differs between machines: use an IANA name such as "Europe/Berlin"`, true},
		{"* * * * *", "posix/Europe/Berlin", `time zone "posix/Europe/Berlin" is a copy some machines have: use "Europe/Berlin"`, true},
		{"* * * * *", "right/Europe/Berlin", `time zone "right/Europe/Berlin" counts leap seconds, which some machines' tz databases lack and cron times do not: use "Europe/Berlin"`, true},
		{"* * * * *", "../../etc/passwd", `unknown time zone "../../etc/passwd" (want an IANA name such as "Europe/Berlin")`, true},
		{"* * * * *", "europe/berlin", `unknown time zone "europe/berlin" (want an IANA name such as "Europe/Berlin")`, true},
		{strings.Repeat("1", 200), "", `"` + strings.Repeat("1", 100) + `"...: want 5 fields (minute hour day-of-month month day-of-week) or 6 (second first), found 1`, false},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			s, err := Parse(tt.spec, tt.zone, "id")
			if err == nil {
				t.Fatalf("Parse(%q, %q) = %v, want an error", tt.spec, tt.zone, s)
			}
			var se *Error
			if !errors.As(err, &se) {
				t.Fatalf("error %v (%T) is not a *Error", err, err)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got %s\nwant %s", err, tt.want)
			}
			if se.Zone != tt.zoneErr {
				t.Errorf("Zone = %v, want %v", se.Zone, tt.zoneErr)
			}
			wantInput := tt.spec
			if tt.zoneErr {
				wantInput = tt.zone
			}
			if se.Input != wantInput {
				t.Errorf("Input = %q, want %q", se.Input, wantInput)
			}
		})
	}
}

// TestParse_RobfigPanics feeds the inputs that make robfig/cron v3.0.1 panic.
func TestParse_RobfigPanics(t *testing.T) {
	for _, spec := range []string{"TZ=", "TZ=0", "CRON_TZ=", "CRON_TZ=Europe/Berlin", "TZ=Europe/Berlin"} {
		if _, err := Parse(spec, "UTC", "id"); err == nil {
			t.Errorf("Parse(%q) succeeded", spec)
		}
	}
}

func TestParse_NeverFiresAccepted(t *testing.T) {
	// Rare but possible: accepted, and Next finds them.
	tests := []struct {
		spec string
		from time.Time
		want time.Time
	}{
		{"0 0 29 2 *", utc(2026, 1, 1, 0, 0, 0), utc(2028, 2, 29, 0, 0, 0)},
		// 2100 is not a leap year: eight years without a fire, more than
		// robfig searches in one call.
		{"0 0 29 2 *", utc(2096, 3, 1, 0, 0, 0), utc(2104, 2, 29, 0, 0, 0)},
		{"0 0 0 31 1-2 *", utc(2026, 2, 1, 0, 0, 0), utc(2027, 1, 31, 0, 0, 0)},
		// Day-of-week ORs in: Mondays in February.
		{"0 0 30 2 mon", utc(2026, 1, 1, 0, 0, 0), utc(2026, 2, 2, 0, 0, 0)},
	}
	for _, tt := range tests {
		s, err := Parse(tt.spec, "", "id")
		if err != nil {
			t.Fatalf("Parse(%q): %v", tt.spec, err)
		}
		if got := s.Next(tt.from); !got.Equal(tt.want) {
			t.Errorf("%q.Next(%v) = %v, want %v", tt.spec, tt.from, got, tt.want)
		}
	}
}

func TestEvery_EpochAnchored(t *testing.T) {
	tests := []struct {
		spec     string
		from     time.Time
		want     time.Time
		wantZone string
	}{
		{"@every 1s", time.Unix(100, 0), time.Unix(101, 0), ""},
		{"@every 1s", time.Unix(100, 999_999_999), time.Unix(101, 0), ""},
		{"@every 7s", time.Unix(0, 0), time.Unix(7, 0), ""},
		{"@every 7s", time.Unix(6, 999_999_999), time.Unix(7, 0), ""},
		{"@every 7s", time.Unix(7, 0), time.Unix(14, 0), ""},
		{"@every 7s", time.Unix(-1, 0), time.Unix(0, 0), ""},
		{"@every 7s", time.Unix(-7, 0), time.Unix(0, 0), ""},
		{"@every 7s", time.Unix(-8, 0), time.Unix(-7, 0), ""},
		{"@every 90s", utc(2026, 1, 1, 0, 0, 10), utc(2026, 1, 1, 0, 1, 30), ""},
		{"@every 1h30m", utc(2026, 1, 1, 0, 0, 0), utc(2026, 1, 1, 1, 30, 0), ""},
		// The zone does not move an @every schedule: 1h fires on the UTC hour
		// even in a zone with a 30-minute offset.
		{"@every 1h", utc(2026, 1, 1, 0, 10, 0), utc(2026, 1, 1, 1, 0, 0), "Asia/Kolkata"},
		// 7 days since the epoch, a Thursday.
		{"@every 168h", utc(2026, 1, 1, 0, 0, 0), utc(2026, 1, 8, 0, 0, 0), ""},
	}
	for _, tt := range tests {
		s, err := Parse(tt.spec, tt.wantZone, "id")
		if err != nil {
			t.Fatalf("Parse(%q): %v", tt.spec, err)
		}
		got := s.Next(tt.from)
		if !got.Equal(tt.want) || got.Location() != time.UTC {
			t.Errorf("%q.Next(%v) = %v, want %v UTC", tt.spec, tt.from, got, tt.want)
		}
	}
}

func TestNext_NoMonotonicReading(t *testing.T) {
	for _, spec := range []string{"* * * * * *", "@every 1s"} {
		for _, zone := range []string{"UTC", "Europe/Berlin"} {
			s, err := Parse(spec, zone, "id")
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now() // carries a monotonic reading
			next := s.Next(now)
			if next != next.Round(0) {
				t.Errorf("%q in %s: Next(now) carries a monotonic reading", spec, zone)
			}
			if next.Location() != time.UTC {
				t.Errorf("%q in %s: location %v", spec, zone, next.Location())
			}
		}
	}
}

func TestNext_Bounds(t *testing.T) {
	for _, spec := range []string{"* * * * * *", "@every 1s", "0 0 29 2 *", "0 0 0 1 1 *"} {
		for _, zone := range []string{"UTC", "Europe/Berlin"} {
			s, err := Parse(spec, zone, "id")
			if err != nil {
				t.Fatal(err)
			}
			for _, from := range []time.Time{utc(9999, 12, 31, 23, 59, 59), time.Unix(1<<62, 0), {}} {
				if got := s.Next(from); !got.IsZero() && !got.After(from) {
					t.Errorf("%q in %s: Next(%v) = %v, not after", spec, zone, from, got)
				}
			}
			if got := s.Next(time.Unix(1<<62, 0)); !got.IsZero() {
				t.Errorf("%q in %s: Next(far future) = %v, want zero", spec, zone, got)
			}
			if got := s.Next(time.Unix(-1<<62, 0)); got.IsZero() {
				t.Errorf("%q in %s: Next(far past) = zero", spec, zone)
			}
		}
	}
}

func TestResolve(t *testing.T) {
	tests := []struct{ spec, want string }{
		{"* * * * *", "0 * * * * *"},
		{" 1  2 3 4 5 ", "0 1 2 3 4 5"},
		{"*/5 * * * * *", "*/5 * * * * *"},
		{"@hourly", "0 0 * * * *"},
		{"@weekly", "0 0 0 * * 0"},
		{"@every 90s", "@every 1m30s"},
		{"@every 3600s", "@every 1h0m0s"},
		{"H * * * *", "0 28 * * * *"},
		{"0 H * * mon,H", "0 0 1 * * mon,2"},
	}
	for _, tt := range tests {
		got, err := Resolve(tt.spec, "billing/invoice-42")
		if err != nil || got != tt.want {
			t.Errorf("Resolve(%q) = %q, %v, want %q", tt.spec, got, err, tt.want)
		}
	}
	if _, err := Resolve("61 * * * * *", "id"); err == nil {
		t.Error("Resolve accepted an invalid spec")
	}
}

// TestParse_DescriptorsMatchRobfig checks that the descriptors expand to what
// robfig's own descriptors compute.
func TestParse_DescriptorsMatchRobfig(t *testing.T) {
	for d, fields := range descriptors {
		ours, err := robfigParse(fields)
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := robfigDescriptor(d)
		if err != nil {
			t.Fatal(err)
		}
		if ours.Second != theirs.Second || ours.Minute != theirs.Minute || ours.Hour != theirs.Hour ||
			ours.Dom != theirs.Dom || ours.Month != theirs.Month || ours.Dow != theirs.Dow {
			t.Errorf("%s: %+v, robfig %+v", d, ours, theirs)
		}
	}
}
