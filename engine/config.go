package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/ring"
)

// DefaultPrefix is the etcd key prefix of a cluster.
const DefaultPrefix = membership.DefaultPrefix

// MaxPartitions bounds Config.Partitions, below the ring's own bound: one
// node of 65536 partitions, stopped while it acquired them, did not exit
// in 90 s, its watches' cancellations stuck in the etcd client (5 600
// goroutines); at 32768 a first start was ready in 41 s, and a stop took
// 2 s while it acquired and 3 s after.
const MaxPartitions = 32768

// MaxReleaseRunWait bounds Config.ReleaseRunWait: past it, a release of
// partitions with a long run in them would stand them still for longer
// than a node's lease.
const MaxReleaseRunWait = 10 * time.Second

// MaxDrainTimeout bounds Config.DrainTimeout: a stop that may wait longer
// than a day for its runs is a typo (30h for 30s), taken without a word
// until a stop waited on it.
const MaxDrainTimeout = 24 * time.Hour

// MaxWorkers, MaxQueue and MaxStage bound Config.Workers, Queue and Stage.
// Each is paid for at New, before any fire: unbounded, a typo (a million
// workers, a billion fires queued) killed the node with "runtime: out of
// memory" once etcd was up, and could starve its machine first. At the
// bounds a node was still up: 65536 workers (each a goroutine from the
// start) took 850 MB of RSS, a queue of 16 M (72 bytes a slot, allocated
// whole) 1.2 GB of address space; a stage costs a slot of its completions'
// channel per 64 fires at New, and its fires only once a tick holds them.
const (
	MaxWorkers = 1 << 16
	MaxQueue   = 1 << 24
	MaxStage   = 1 << 26
)

// MinTick and MaxTick bound Config.Tick.
const (
	MinTick = 100 * time.Microsecond
	MaxTick = time.Second
)

// Config configures an Engine. Zero fields take the defaults of
// DefaultConfig; Validate reports what is out of range.
type Config struct {
	// NodeID names this node in the cluster; unique among live nodes.
	// Required.
	NodeID string
	// APIAddr is the address other nodes and clients reach this node's API
	// at, published in its membership record.
	APIAddr string
	// Version is the software version, published in the membership record.
	Version string
	// Prefix is the etcd key prefix; several clusters can share one etcd.
	// Default "/shardcron".
	Prefix string

	// IndexClient, when set, is the etcd client the registry reads its
	// index ranges through (registry.WithIndexClient: list pages and
	// filtered exports), one dialled with registry.IndexDialOptions. nil:
	// the engine's client. It must outlive the engine.
	IndexClient *clientv3.Client

	// Partitions is P, fixed when the cluster is created (1 to
	// MaxPartitions, default 1024). More partitions balance better and move
	// less per membership change; each costs a lock and a watch on its
	// owner.
	Partitions int
	// ReplicationFactor is the ring's virtual nodes per member (default 20).
	ReplicationFactor int
	// Load bounds a member's partitions to Load × the average (default
	// 1.25): lower balances better, higher moves fewer partitions.
	Load float64

	// Workers is the number of executions that run at once (default 256).
	Workers int
	// Queue is how many fires may wait for a worker (default 65536). When
	// it is full, dispatch waits: the bounded lead then pauses the node
	// rather than letting fires pile up.
	Queue int
	// BatchSize is the most fires the dispatch loop takes from the wheel
	// at once (default 4096), but for a staged tick, which goes out as one
	// batch of up to Stage fires; the fencing deadline and the lead are
	// checked before each batch.
	BatchSize int
	// Stage is the most fires of one tick the dispatch loop builds while
	// it waits for the tick, to hand them to the workers whole when it is
	// due (stage.go; default 1048576). A staged tick may exceed Queue:
	// dispatch then waits until the workers have taken it below Queue.
	// What a stage needs is made ready while no tick is near, sized to the
	// largest tick up to Stage, and kept: about 140 bytes a fire (the jobs,
	// the wheel's view of the tick, the Advance's slice, the completions'
	// batches), some 140 MB for a node whose ticks hold 1 M fires.
	Stage int

	// LeaseTTL is the session lease (default 10s): the failover time after
	// a crash. KeepAliveInterval (default TTL/3) and FenceMargin (default
	// TTL/5) are passed to membership, whose Config documents them.
	LeaseTTL          time.Duration
	KeepAliveInterval time.Duration
	FenceMargin       time.Duration

	// Tick is the timing wheel's resolution (default 1ms): fires are late
	// by less than one tick.
	Tick time.Duration
	// MisfireThreshold is how late a fire may be dispatched before it is a
	// misfire handled by the task's misfire policy (default 5s).
	MisfireThreshold time.Duration
	// Lead is how far dispatch may run ahead of the last watermark etcd
	// acknowledged (default 1s, at least twice WatermarkInterval). It
	// bounds the fires a crashed node's successor repeats; a node that
	// cannot record progress stops after it, and one whose etcd takes
	// longer than Lead to record a watermark fires late, by Lead a write
	// (writeWatermarks): keep it above etcd's write time.
	Lead time.Duration
	// WatermarkInterval is how often the node's watermark is written
	// (default 100ms): one etcd request per node, whatever the fire rate.
	// It must be well under Lead.
	WatermarkInterval time.Duration
	// DrainTimeout bounds how long Close waits for running executions
	// (default 30s, at most MaxDrainTimeout); those still running are then canceled, and the
	// retries of those with attempts left handed on to their partitions'
	// next owners, due at once.
	DrainTimeout time.Duration
	// ReleaseRunWait bounds how long a graceful release waits for the
	// attempts under way of tasks that retry or keep their fires apart,
	// and for backfills' fires under way (default 250ms, at most 10s): the
	// released partitions stand still that long at most, and no longer
	// than the node's session, whose end drops them at once. Past it, the
	// runs still going are marked in etcd for the next owner and their
	// retries handed on through etcd (docs/design.md, the release; a
	// partition whose markers etcd refuses stands still until it takes
	// them, a stuck release): a longer wait spares those writes for runs
	// that end within it, a shorter one the partitions' stall.
	ReleaseRunWait time.Duration
	// AllowExec enables the exec executor on this node (default false):
	// a task could otherwise run any command as the node's user.
	AllowExec bool
	// ExecAllow, when not empty, lists the absolute path prefixes the exec
	// executor's commands must lie under (--exec-allow; see
	// executor.PathAllow). Empty: any command, once AllowExec is set.
	ExecAllow []string
	// HTTPAllow, when not empty, lists the hosts, *.domains, IPs and CIDRs
	// the HTTP executor may reach (--http-allow; see executor.HostAllow).
	// Empty: any host.
	HTTPAllow []string

	// Alerts (issue 9; notify.go).

	// NotifyURL is where alerts go for tasks whose notify block names no
	// url, and, for tasks without a notify block, where their failure and
	// recovery alerts go (--notify-url). Empty: only tasks with a notify
	// url alert. The HTTP allow-list applies to it.
	NotifyURL string
	// NotifyQueue is how many alerts may wait for delivery (default 1024).
	// Alerts are sent off the fire path; when the queue is full an alert is
	// dropped and counted, never waited for.
	NotifyQueue int

	// Requests, when set, is the counter installed on the etcd client's
	// connection; Stats reports its counts.
	Requests *RequestCounter

	// Clock is the time the dispatch loop fires by (default the real
	// clock). Tests inject a shifted or faster clock.
	Clock Clock
	// Logger receives the engine's logs (default slog.Default()).
	Logger *slog.Logger
}

// DefaultConfig returns the defaults for a node.
func DefaultConfig(nodeID string) Config {
	return Config{
		NodeID:            nodeID,
		Prefix:            DefaultPrefix,
		Partitions:        ring.DefaultPartitions,
		ReplicationFactor: ring.DefaultReplicationFactor,
		Load:              ring.DefaultLoad,
		Workers:           256,
		Queue:             65536,
		BatchSize:         4096,
		Stage:             1 << 20,
		LeaseTTL:          membership.DefaultTTL,
		Tick:              time.Millisecond,
		MisfireThreshold:  5 * time.Second,
		Lead:              time.Second,
		WatermarkInterval: 100 * time.Millisecond,
		DrainTimeout:      30 * time.Second,
		ReleaseRunWait:    250 * time.Millisecond,
		NotifyQueue:       1024,
	}
}

// withDefaults fills zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig(c.NodeID)
	set := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setD := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	set(&c.Partitions, d.Partitions)
	set(&c.ReplicationFactor, d.ReplicationFactor)
	if c.Load == 0 {
		c.Load = d.Load
	}
	set(&c.Workers, d.Workers)
	set(&c.Queue, d.Queue)
	set(&c.BatchSize, d.BatchSize)
	set(&c.Stage, d.Stage)
	setD(&c.LeaseTTL, d.LeaseTTL)
	setD(&c.Tick, d.Tick)
	setD(&c.MisfireThreshold, d.MisfireThreshold)
	setD(&c.Lead, d.Lead)
	setD(&c.WatermarkInterval, d.WatermarkInterval)
	setD(&c.DrainTimeout, d.DrainTimeout)
	setD(&c.ReleaseRunWait, d.ReleaseRunWait)
	set(&c.NotifyQueue, d.NotifyQueue)
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate applies the defaults and checks every field and the rules
// between them.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("engine: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.NodeID == "" {
		bad("NodeID", "required")
	}
	if len(c.ExecAllow) > 0 {
		if _, err := executor.ParsePathAllow(c.ExecAllow); err != nil {
			bad("ExecAllow", "%v", err)
		}
	}
	if len(c.HTTPAllow) > 0 {
		if _, err := executor.ParseHostAllow(c.HTTPAllow); err != nil {
			bad("HTTPAllow", "%v", err)
		}
	}
	if c.Partitions > MaxPartitions {
		bad("Partitions", "must be at most %d, got %d", MaxPartitions, c.Partitions)
	} else if err := (ring.Config{Partitions: c.Partitions, ReplicationFactor: c.ReplicationFactor, Load: c.Load}).Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Workers < 1 || c.Workers > MaxWorkers {
		bad("Workers", "must be between 1 and %d, got %d", MaxWorkers, c.Workers)
	}
	if c.Queue < c.BatchSize || c.BatchSize < 1 {
		bad("Queue", "must be at least BatchSize (%d), got %d", c.BatchSize, c.Queue)
	} else if c.Queue > MaxQueue {
		bad("Queue", "must be at most %d, got %d", MaxQueue, c.Queue)
	}
	if c.Stage < 1 || c.Stage > MaxStage {
		bad("Stage", "must be between 1 and %d, got %d", MaxStage, c.Stage)
	}
	if c.Tick < MinTick || c.Tick > MaxTick {
		bad("Tick", "must be between %v and %v, got %v", MinTick, MaxTick, c.Tick)
	}
	if c.MisfireThreshold < c.Tick {
		bad("MisfireThreshold", "must be at least the tick (%v), got %v", c.Tick, c.MisfireThreshold)
	}
	if c.WatermarkInterval < c.Tick {
		bad("WatermarkInterval", "must be at least the tick (%v), got %v", c.Tick, c.WatermarkInterval)
	}
	if c.Lead < 2*c.WatermarkInterval {
		bad("Lead", "must be at least twice WatermarkInterval (%v) or dispatch stalls between writes, got %v", c.WatermarkInterval, c.Lead)
	}
	if c.NotifyURL != "" {
		if err := (executor.HTTPSpec{URL: c.NotifyURL}).Check(); err != nil {
			bad("NotifyURL", "want an absolute http or https URL (not shown: it may hold a secret)")
		}
	}
	if c.NotifyQueue < 1 {
		bad("NotifyQueue", "must be at least 1, got %d", c.NotifyQueue)
	}
	if c.DrainTimeout < 0 || c.DrainTimeout > MaxDrainTimeout {
		bad("DrainTimeout", "must be within 0-%v, got %v", MaxDrainTimeout, c.DrainTimeout)
	}
	if c.ReleaseRunWait < 0 || c.ReleaseRunWait > MaxReleaseRunWait {
		bad("ReleaseRunWait", "must be within 0-%v, got %v", MaxReleaseRunWait, c.ReleaseRunWait)
	}
	return errors.Join(errs...)
}

// membership returns the session config, publishing info under the
// node's key; New validates it with the client.
func (c Config) membership(cli *clientv3.Client, info membership.NodeInfo) membership.Config {
	return membership.Config{
		Client: cli, Prefix: c.Prefix, NodeID: c.NodeID,
		Info: info,
		TTL:  c.LeaseTTL, KeepAliveInterval: c.KeepAliveInterval, FenceMargin: c.FenceMargin,
		Logger: c.Logger,
	}
}

// nodeInfo is what the node publishes under its membership key: its
// address, version and what it can run, with the handlers registered and
// when it started (zero before Start).
func (c Config) nodeInfo(handlers []string, startedAt time.Time) membership.NodeInfo {
	return membership.NodeInfo{ID: c.NodeID, APIAddr: c.APIAddr, Version: c.Version, StartedAt: startedAt,
		Exec: c.AllowExec, ExecAllow: c.ExecAllow, HTTPAllow: c.HTTPAllow, Handlers: handlers}
}

func (c Config) ring() ring.Config {
	return ring.Config{Partitions: c.Partitions, ReplicationFactor: c.ReplicationFactor, Load: c.Load}
}

// Clock is the time source of dispatch.
type Clock interface {
	Now() time.Time
	// Until returns how long to wait, in real time, until the clock
	// shows t.
	Until(t time.Time) time.Duration
}

type realClock struct{}

func (realClock) Now() time.Time                  { return time.Now() }
func (realClock) Until(t time.Time) time.Duration { return time.Until(t) }
