package ring

import (
	"fmt"
	"math"
)

// Defaults of Config (DefaultConfig) and the largest values accepted.
const (
	DefaultPartitions        = 1024
	DefaultReplicationFactor = 20
	DefaultLoad              = 1.25

	// MaxPartitions bounds P so that a member index fits in 16 bits per
	// partition.
	MaxPartitions = 1 << 16

	// MaxReplicationFactor bounds the ring points per member, which
	// dominate the cost of a rebuild (see Config.ReplicationFactor).
	MaxReplicationFactor = 256
)

// Config parameterises the assignment. Every node of a cluster must use the
// same Config: a different value of any field gives different owners.
type Config struct {
	// Partitions is P, the number of partitions task ids are hashed into.
	// Default 1024, at most MaxPartitions. It is fixed for the life of a
	// cluster, since changing it moves almost every task. More partitions
	// balance finer and move less work per membership change, but cost more
	// etcd keys, locks and watches per node and a slower rebuild. P also
	// bounds the cluster: at most P members, and a membership change moves
	// about P/N partitions only while N <= P/32 (see the package doc).
	Partitions int

	// ReplicationFactor is the number of points (virtual nodes) each member
	// has on the hash ring. Default 20, between 2 and MaxReplicationFactor.
	// More points spread partitions more evenly before the load bound
	// applies, so fewer partitions are pushed on to the next member, but a
	// rebuild costs more: consistent re-sorts all N × ReplicationFactor
	// points for each member it adds, O(N² × ReplicationFactor × log), about
	// 10 ms for 100 members at 20 points. 1 is refused: when consistent
	// v0.10.0 looks for a member with room it walks every ring point but
	// one, so with a single point per member the one it skips can be the
	// only member with room left, and whether that happens depends on the
	// hashes.
	ReplicationFactor int

	// Load is the bounded-load factor: a member owns at most
	// ceil(floor(P/N) × Load) partitions. Default 1.25; must be finite and
	// above 1 (at 1 or below the partitions do not fit whenever N does not
	// divide P). Closer to 1 balances tighter but moves more partitions on
	// each membership change, because overflow cascades along the ring.
	Load float64
}

// DefaultConfig returns 1024 partitions, 20 points per member and a load
// factor of 1.25.
func DefaultConfig() Config {
	return Config{
		Partitions:        DefaultPartitions,
		ReplicationFactor: DefaultReplicationFactor,
		Load:              DefaultLoad,
	}
}

// Validate returns a *ValidationError naming the first invalid field, or
// nil. A valid Config builds an assignment for every set of 1 to Partitions
// distinct, non-empty member names.
func (c Config) Validate() error {
	switch {
	case c.Partitions < 1 || c.Partitions > MaxPartitions:
		return &ValidationError{"Partitions", fmt.Sprintf("%d out of range 1-%d", c.Partitions, MaxPartitions)}
	case c.ReplicationFactor < 2 || c.ReplicationFactor > MaxReplicationFactor:
		return &ValidationError{"ReplicationFactor", fmt.Sprintf("%d out of range 2-%d", c.ReplicationFactor, MaxReplicationFactor)}
	case !(c.Load > 1) || math.IsInf(c.Load, 1):
		return &ValidationError{"Load", fmt.Sprintf("%v: must be a finite number above 1", c.Load)}
	}
	return nil
}

// capacity is the most partitions one of n members may own: consistent's
// averageLoad, computed the same way (integer division, then float64) so
// that the bound we check is exactly the one it enforces, capped at P
// (which also keeps a huge Load from overflowing the conversion to int).
func (c Config) capacity(n int) int {
	if n < 1 {
		return 0
	}
	f := math.Ceil(float64(c.Partitions/n) * c.Load)
	if f >= float64(c.Partitions) {
		return c.Partitions
	}
	return int(f)
}
