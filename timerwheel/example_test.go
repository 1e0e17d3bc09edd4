package timerwheel_test

import (
	"fmt"
	"time"

	"github.com/shardcron/shardcron/timerwheel"
)

// The owner of a wheel sleeps until NextDeadline, then hands out what
// Advance delivers in bounded batches.
func ExampleWheel() {
	start := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC).UnixNano()
	w, err := timerwheel.New(time.Millisecond, start)
	if err != nil {
		panic(err)
	}
	w.Schedule(1, start+int64(2*time.Second))
	w.Schedule(2, start+int64(time.Second))
	w.Schedule(3, start+int64(time.Second))
	w.Cancel(3)

	batch := make([]timerwheel.Expired, 0, 64)
	for w.Len() > 0 {
		now, _ := w.NextDeadline() // a real owner sleeps until then
		batch = w.Advance(now, cap(batch), batch[:0])
		for _, e := range batch {
			fmt.Printf("timer %d due %s\n", e.ID, time.Unix(0, e.At).UTC().Format(time.TimeOnly))
		}
	}
	// Output:
	// timer 2 due 12:00:01
	// timer 1 due 12:00:02
}
