package engine

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/shardcron/shardcron/engine/schedule"
)

// latestBefore against walking every fire, for cron and @every schedules.
func TestLatestBefore_MatchesWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	base := time.Date(2026, 3, 28, 23, 0, 0, 0, time.UTC).UnixNano()
	for _, spec := range []string{"* * * * * *", "*/7 * * * * *", "0 */5 * * * *", "30 2 * * *", "@every 13s", "0 0 29 2 *"} {
		h, err := schedule.Parse(spec, "Europe/Berlin", "id")
		if err != nil {
			t.Fatal(err)
		}
		for range 50 {
			from := base + rng.Int64N(int64(48*time.Hour))
			to := from + rng.Int64N(int64(6*time.Hour))
			want := int64(0)
			for f := next(h, from-1); f != 0 && f <= to; f = next(h, f) {
				want = f
			}
			if got := latestBefore(h, from, to); got != want {
				t.Fatalf("%q in [%v, %v]: got %v, want %v", spec, time.Unix(0, from).UTC(), time.Unix(0, to).UTC(),
					time.Unix(0, got).UTC(), time.Unix(0, want).UTC())
			}
		}
	}
}
