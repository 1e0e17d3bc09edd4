package schedule_test

import (
	"fmt"
	"time"

	"github.com/shardcron/shardcron/engine/schedule"
)

func ExampleParse() {
	s, err := schedule.Parse("30 2 * * *", "Europe/Berlin", "backup/db-1")
	if err != nil {
		panic(err)
	}
	// 02:30 does not exist on 2026-03-29 in Berlin: the fire is at 03:00 CEST.
	berlin, _ := time.LoadLocation("Europe/Berlin")
	t := time.Date(2026, 3, 28, 12, 0, 0, 0, time.UTC)
	for range 3 {
		t = s.Next(t)
		fmt.Println(t.Format(time.RFC3339), "=", t.In(berlin).Format("15:04 MST"))
	}
	_, err = schedule.Parse("61 * * * * *", "", "x")
	fmt.Println(err)
	// Output:
	// 2026-03-29T01:00:00Z = 03:00 CEST
	// 2026-03-30T00:30:00Z = 02:30 CEST
	// 2026-03-31T00:30:00Z = 02:30 CEST
	// "61 * * * * *": second 61 out of range 0-59
}

func ExampleResolve() {
	for _, id := range []string{"billing/invoice-42", "a"} {
		r, _ := schedule.Resolve("H H/6 * * *", id)
		fmt.Println(id, "->", r)
	}
	// Output:
	// billing/invoice-42 -> 0 28 1-23/6 * * *
	// a -> 0 44 4-23/6 * * *
}

func ExampleTable_Intern() {
	var tab schedule.Table
	a, _ := tab.Intern("0 * * * *", "Europe/Berlin", "task-1")
	b, _ := tab.Intern("@hourly", "Europe/Berlin", "task-2")
	c, _ := tab.Intern("@hourly", "UTC", "task-3")
	fmt.Println(a == b, a == c, tab.Len())
	fmt.Println(tab.Get(a).Next(time.Date(2026, 7, 1, 10, 30, 0, 0, time.UTC)))
	// Output:
	// true false 2
	// 2026-07-01 11:00:00 +0000 UTC
}
