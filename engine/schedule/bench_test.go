package schedule

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkNext measures Next stepping through consecutive fire times, so
// each call does the work of a real reschedule.
func BenchmarkNext(b *testing.B) {
	specs := []struct{ name, spec string }{
		{"every-second", "* * * * * *"},
		{"every-5m", "0 */5 * * * *"},
		{"daily-02:30", "30 2 * * *"},
		{"weekdays", "0 9-17 * * mon-fri"},
		{"@every-30s", "@every 30s"},
	}
	for _, zone := range []string{"UTC", "Europe/Berlin"} {
		for _, sc := range specs {
			b.Run(fmt.Sprintf("zone=%s/spec=%s", zone, sc.name), func(b *testing.B) {
				s, err := Parse(sc.spec, zone, "bench")
				if err != nil {
					b.Fatal(err)
				}
				start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
				x := start
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					x = s.Next(x)
					if x.Year() > 2030 {
						x = start
					}
				}
			})
		}
	}
}

func BenchmarkParse(b *testing.B) {
	for _, c := range []struct{ name, spec, zone string }{
		{"cron/zone=UTC", "0 */5 * * * *", "UTC"},
		{"cron-H/zone=Europe/Berlin", "H H/15 * * mon-fri", "Europe/Berlin"},
		{"every", "@every 30s", "UTC"},
	} {
		b.Run(c.name, func(b *testing.B) {
			if _, err := Parse(c.spec, c.zone, "id"); err != nil { // load the zone once
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := Parse(c.spec, c.zone, "id"); err != nil {
					b.Fatal(err, i)
				}
			}
		})
	}
}

// BenchmarkIntern measures interning a spec already in the table, the common
// case when loading a million tasks.
func BenchmarkIntern(b *testing.B) {
	tab := NewTable()
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprint("tenant/task-", i)
		if _, err := tab.Intern("H */5 * * *", "Europe/Berlin", ids[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := tab.Intern("H */5 * * *", "Europe/Berlin", ids[i%len(ids)]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTableGet(b *testing.B) {
	tab := NewTable()
	var hs []Handle
	for i := range 5000 {
		h, err := tab.Intern(fmt.Sprintf("@every %ds", i+1), "", "id")
		if err != nil {
			b.Fatal(err)
		}
		hs = append(hs, h)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var n int
	for i := range b.N {
		if tab.Get(hs[i%len(hs)]) != nil {
			n++
		}
	}
	if n != b.N {
		b.Fatal("missing schedule")
	}
}
