package tuning

import (
	"fmt"
	"math"
	"time"

	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/ring"
)

// MaxTick is the coarsest tick: the engine's bound, or its watermark
// interval, which no flag sets and which must not be shorter than the tick.
var MaxTick = min(engine.MaxTick, engine.DefaultConfig("").WatermarkInterval)

// Values are the shared flags' values, defaults already applied.
type Values struct {
	Partitions, Replication, Workers, Queue int
	Load                                    float64
	Tick, LeaseTTL                          time.Duration
}

// A FlagError is a value out of its range.
type FlagError struct {
	Flag string // the flag's name, without dashes
	Msg  string // what is wrong, with the value given
}

// Check returns one FlagError for each value out of its range, in the
// order of Values' fields.
func Check(v Values) []FlagError {
	var errs []FlagError
	bad := func(flag, format string, args ...any) {
		errs = append(errs, FlagError{Flag: flag, Msg: fmt.Sprintf(format, args...)})
	}
	if v.Partitions < 1 || v.Partitions > engine.MaxPartitions {
		bad("partitions", "must be between 1 and %d, got %d", engine.MaxPartitions, v.Partitions)
	}
	if v.Replication < 2 || v.Replication > ring.MaxReplicationFactor {
		bad("replication", "must be between 2 and %d, got %d", ring.MaxReplicationFactor, v.Replication)
	}
	if v.Workers < 1 || v.Workers > engine.MaxWorkers {
		bad("workers", "must be between 1 and %d, got %d", engine.MaxWorkers, v.Workers)
	}
	if v.Queue < 1 || v.Queue > engine.MaxQueue {
		bad("queue", "must be between 1 and %d, got %d", engine.MaxQueue, v.Queue)
	}
	if !(v.Load > 1) || math.IsInf(v.Load, 1) {
		bad("load", "must be a finite number above 1, got %v", v.Load)
	}
	if v.Tick < engine.MinTick || v.Tick > MaxTick {
		bad("tick", "must be between %v and %v, got %v", engine.MinTick, MaxTick, v.Tick)
	}
	if v.LeaseTTL < membership.MinTTL || v.LeaseTTL%time.Second != 0 {
		bad("lease-ttl", "must be a whole number of seconds, at least %v (etcd leases count whole seconds), got %v",
			membership.MinTTL, v.LeaseTTL)
	}
	return errs
}
