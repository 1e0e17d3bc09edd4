package tuning

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/shardcron/shardcron/engine"
)

func TestCheck(t *testing.T) {
	ok := Values{Partitions: 1024, Replication: 20, Workers: 1, Queue: 1, Load: 1.25, Tick: time.Millisecond, LeaseTTL: 10 * time.Second}
	if errs := Check(ok); len(errs) != 0 {
		t.Fatalf("the defaults refused: %v", errs)
	}
	for _, tc := range []struct {
		change func(*Values)
		flag   string
	}{
		{func(v *Values) { v.Partitions = 0 }, "partitions"},
		{func(v *Values) { v.Partitions = 32769 }, "partitions"},
		{func(v *Values) { v.Replication = 1 }, "replication"},
		{func(v *Values) { v.Replication = 257 }, "replication"},
		{func(v *Values) { v.Workers = 0 }, "workers"},
		{func(v *Values) { v.Workers = engine.MaxWorkers + 1 }, "workers"},
		{func(v *Values) { v.Queue = -1 }, "queue"},
		{func(v *Values) { v.Queue = engine.MaxQueue + 1 }, "queue"},
		{func(v *Values) { v.Load = 1 }, "load"},
		{func(v *Values) { v.Load = math.NaN() }, "load"},
		{func(v *Values) { v.Load = math.Inf(1) }, "load"},
		{func(v *Values) { v.Tick = 99 * time.Microsecond }, "tick"},
		{func(v *Values) { v.Tick = MaxTick + 1 }, "tick"},
		{func(v *Values) { v.LeaseTTL = time.Second }, "lease-ttl"},
		{func(v *Values) { v.LeaseTTL = 2500 * time.Millisecond }, "lease-ttl"},
	} {
		v := ok
		tc.change(&v)
		var flags []string
		for _, e := range Check(v) {
			flags = append(flags, e.Flag)
		}
		if !slices.Equal(flags, []string{tc.flag}) {
			t.Errorf("%+v: refused %v, want only %s", v, flags, tc.flag)
		}
	}
}
