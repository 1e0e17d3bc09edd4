package api

import (
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"runtime"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shardcron/shardcron/engine"
)

// collector turns engine.Stats into metrics when scraped: the fire path
// updates only the engine's own atomics, never a Prometheus metric.
type collector struct {
	e       *engine.Engine
	version string

	fires, staged, stageDrops, lag, executions, misfires, queue     *prometheus.Desc
	owned, tasks, partitions                                        *prometheus.Desc
	etcd, fenced, ready, dropped, writeFailed, fullLoads, watermark *prometheus.Desc
	noSpace                                                         *prometheus.Desc
	sampled, sampleRatio                                            *prometheus.Desc
	queueCap, workers, fences, execDur, handOver                    *prometheus.Desc
	build                                                           *prometheus.Desc
	// Issue 9: alerts, pause_on_failure, the retry backlog and cache
	// write errors.
	notify, pausedOnFailure, retryBacklog, cacheWriteErrors *prometheus.Desc
	chainsDropped, retriesHandedOn                          *prometheus.Desc
	runsMarked, runsElsewhere                               *prometheus.Desc
	standbyReady, standbyTaken                              *prometheus.Desc
}

func newCollector(e *engine.Engine, version string) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("shardcron_"+name, help, labels, nil)
	}
	return &collector{
		e:       e,
		version: version,
		fires:   d("fires_total", "Fires dispatched by this node (first attempts, scheduled and triggered)."),
		staged: d("fires_staged_total", "Of shardcron_fires_total, the fires whose jobs were built before their tick was "+
			"due and handed to the workers whole at it (--stage); a share well below 1 for a fleet of large bursts means "+
			"the stage was dropped (shardcron_stage_drops_total), cut short, or not built (the queue had no room, or events kept "+
			"coming before the tick)."),
		stageDrops: d("stage_drops_total", "Ticks that came with a stage the dispatch loop could not use (--stage), by cause: "+
			"changed (a command other than a wake, a completion or a release in the loop after the stage was built), late (the tick came "+
			"past the misfire threshold), mismatch (the wheel released other timers than those staged). Their fires "+
			"are released one by one, as an unstaged tick's.", "cause"),
		lag: d("fire_lag_seconds", "How late fires start: from a fire's due time (its scheduled time plus its jitter) "+
			"to a worker starting it, for first attempts and retries. It covers the timing wheel's tick, dispatch and "+
			"the wait for a free worker, not the execution itself; misfires show up here as large values."),
		executions: d("executions_total", "Execution attempts by status, including skipped and misfired fires.", "status"),
		misfires: d("misfires_total", "Fires dispatched later than the misfire threshold (or handed over unrun and "+
			"older than their catch-up window), by the task's misfire policy.", "policy"),
		queue:    d("queue_depth", "Fires waiting for a worker (at most shardcron_queue_capacity, but for a staged tick)."),
		queueCap: d("queue_capacity", "Fires that may wait for a worker (--queue); dispatch pauses when the queue is full."),
		workers:  d("workers", "Executions that may run at once (--workers)."),
		fences: d("fence_events_total", "Times this node's session passed its fencing deadline or ended, so that the node "+
			"stopped dispatching, dropped its partitions and rejoined with a new session."),
		execDur: d("execution_duration_seconds", "How long executions took, each attempt from its start to its end, "+
			"by http, exec and handler executors (noop executions are not timed)."),
		handOver: d("handover_duration_seconds", "How long the phases of partition hand-overs took on this node: "+
			"prepare (reading a partition while its old owner still fires it), lock_wait (from prepared to holding "+
			"its lock, i.e. the old owner's release), take (from the lock to the partition armed: the gap in its "+
			"fires) on the new owner; release (from the mark to the committed checkpoint) on the old one.", "phase"),
		owned:   d("partitions_owned", "Partitions this node owns."),
		tasks:   d("tasks", "Tasks held by this node (in the partitions it owns)."),
		etcd:    d("etcd_requests_total", "Requests sent to etcd by this node's client, by operation.", "op"),
		fenced:  d("fenced", "1 when the node is fenced and dispatches nothing, else 0."),
		ready:   d("ready", "1 when the node owns every partition the ring gives it, else 0."),
		dropped: d("history_dropped_total", "Execution records dropped because the history buffer was full (or their write failed)."),
		writeFailed: d("history_write_failed_total", "Execution records lost because their write to disk failed "+
			"(disk full, I/O error; also counted in shardcron_history_dropped_total). Firing goes on meanwhile."),
		sampled: d("history_sampled_total", "Successful execution records left out of the history by sampling, "+
			"while records arrive faster than the disk takes them. Failures are never sampled."),
		sampleRatio: d("history_sample_ratio", "Share of successful executions currently recorded in the history: "+
			"1 records all, 0.125 one in 8 (chosen by a hash of task id and scheduled time)."),
		fullLoads: d("partition_full_loads_total", "Partitions loaded with a full etcd range read rather than from the local cache."),
		watermark: d("watermark_timestamp_seconds", "The node watermark etcd last acknowledged, as a Unix time (0 before the first)."),
		noSpace: d("etcd_no_space", "1 while etcd refuses the node's watermark writes for lack of space (its NOSPACE alarm): "+
			"every write is refused, task changes and hand-overs too, and the node fires on unrecorded, else 0."),
		build: d("build_info", "Always 1; labels name the version of shardcron and of Go that built it.", "version", "goversion"),
		notify: d("notify_total", "Alerts of task state changes by result: sent (answered 2xx), failed (every attempt failed), "+
			"refused (--http-allow leaves the url out), dropped (the alert queue was full).", "result"),
		pausedOnFailure: d("paused_on_failure_total", "Tasks this node paused because they failed pause_on_failure fires in a row."),
		retryBacklog:    d("retry_backlog", "Retries waiting for their backoff in this node's timing wheel."),
		cacheWriteErrors: d("cache_write_errors_total", "Writes of task changes to the Badger partition cache that failed; "+
			"each drops that partition's cache until its next etcd read (history write failures are in "+
			"shardcron_history_write_failed_total)."),
		chainsDropped: d("chain_triggers_dropped_total", "Ended fires whose on_success/on_failure triggers were dropped: "+
			"the queue of trigger writes was full while etcd refused or was slow to take them."),
		retriesHandedOn: d("retries_handed_on_total", "Retries of attempts that failed after their partition's graceful release "+
			"was sealed, or that the node's stop canceled, handed on through etcd to the partition's owner."),
		runsMarked: d("runs_marked_total", "Runs of tasks whose concurrency policy keeps fires apart, or with fires of their backfill, that went on past their "+
			"partition's graceful release, marked in etcd for the next owner."),
		runsElsewhere: d("runs_elsewhere", "Runs on former owners, past their partition's release, that this node's tasks "+
			"count as running (concurrency policies)."),
		standbyReady: d("standby_partitions", "Partitions prepared ahead of the lease's end of nodes whose watermarks stopped "+
			"(likely dead), not yet acquired."),
		standbyTaken: d("standby_taken_total", "Partitions acquired already prepared, ahead of their dead owner's lease's end."),
		partitions: d("partitions", "Partitions of the cluster (--partitions, fixed when it was created): what the "+
			"nodes' shardcron_partitions_owned add up to when every partition has its owner."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.fires, c.staged, c.stageDrops, c.lag, c.executions, c.misfires, c.queue, c.owned, c.partitions, c.tasks,
		c.etcd, c.fenced, c.ready, c.noSpace, c.dropped, c.sampled, c.sampleRatio, c.fullLoads, c.watermark, c.build,
		c.queueCap, c.workers, c.fences, c.execDur, c.handOver, c.writeFailed,
		c.notify, c.pausedOnFailure, c.retryBacklog, c.cacheWriteErrors, c.chainsDropped, c.retriesHandedOn, c.runsMarked, c.runsElsewhere, c.standbyReady, c.standbyTaken} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	metric := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		m, err := prometheus.NewConstMetric(d, t, v, labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
	}
	if c.e == nil {
		// A node that has not started (Starting): not ready, and which
		// build it is.
		metric(c.ready, prometheus.GaugeValue, 0)
		metric(c.build, prometheus.GaugeValue, 1, c.version, runtime.Version())
		return
	}
	st := c.e.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		metric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64) { metric(d, prometheus.GaugeValue, v) }
	flag := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}

	histogram := func(d *prometheus.Desc, h engine.Histogram, labels ...string) {
		buckets := make(map[float64]uint64, len(h.Bounds))
		for i, b := range h.Bounds {
			if i < len(h.Counts) {
				buckets[b] = h.Counts[i]
			}
		}
		if m, err := prometheus.NewConstHistogram(d, h.Count, h.Sum, buckets, labels...); err == nil {
			ch <- m
		} else {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
	}

	counter(c.fires, st.Fires)
	counter(c.staged, st.Staged)
	for _, cause := range slices.Sorted(maps.Keys(st.StageDrops)) {
		counter(c.stageDrops, st.StageDrops[cause], cause)
	}
	histogram(c.lag, st.FireLag)
	histogram(c.execDur, st.ExecDuration)
	for _, phase := range slices.Sorted(maps.Keys(st.HandOver)) {
		histogram(c.handOver, st.HandOver[phase], phase)
	}
	gauge(c.queueCap, float64(st.QueueCapacity))
	gauge(c.workers, float64(st.Workers))
	counter(c.fences, st.Fences)
	for _, status := range slices.Sorted(maps.Keys(st.Executions)) {
		counter(c.executions, st.Executions[status], status)
	}
	for _, policy := range slices.Sorted(maps.Keys(st.MisfiresByPolicy)) {
		counter(c.misfires, st.MisfiresByPolicy[policy], policy)
	}
	for _, result := range slices.Sorted(maps.Keys(st.Notify)) {
		counter(c.notify, st.Notify[result], result)
	}
	counter(c.pausedOnFailure, st.PausedOnFailure)
	gauge(c.retryBacklog, float64(st.RetryBacklog))
	counter(c.cacheWriteErrors, st.CacheWriteErrors)
	counter(c.chainsDropped, st.ChainsDropped)
	counter(c.retriesHandedOn, st.RetriesHandedOn)
	counter(c.runsMarked, st.RunsMarked)
	gauge(c.runsElsewhere, float64(st.RunsElsewhere))
	gauge(c.queue, float64(st.QueueDepth))
	gauge(c.owned, float64(st.PartitionsOwned))
	gauge(c.partitions, float64(c.e.Registry().Partitions()))
	gauge(c.tasks, float64(st.Tasks))
	for _, op := range slices.Sorted(maps.Keys(st.EtcdRequests)) {
		counter(c.etcd, st.EtcdRequests[op], op)
	}
	gauge(c.fenced, flag(st.Fenced))
	gauge(c.ready, flag(st.Ready))
	gauge(c.noSpace, flag(st.EtcdNoSpace))
	counter(c.dropped, st.HistoryDropped)
	counter(c.writeFailed, st.HistoryFailed)
	counter(c.sampled, st.HistorySampled)
	gauge(c.sampleRatio, 1/float64(max(1, st.HistorySampling)))
	counter(c.fullLoads, st.FullLoads)
	gauge(c.standbyReady, float64(st.StandbyReady))
	counter(c.standbyTaken, st.StandbyTaken)
	wm := 0.0
	if !st.Watermark.IsZero() {
		wm = float64(st.Watermark.UnixNano()) / 1e9
	}
	gauge(c.watermark, wm)
	metric(c.build, prometheus.GaugeValue, 1, c.version, runtime.Version())
}

// newMetrics returns the registry /metrics serves: the engine's collector
// and the Go and process collectors. One registry per Server: no global
// state, so several nodes can run in one process (tests). A nil e is a
// node that has not started: its collector gives shardcron_ready 0 and
// shardcron_build_info only.
func newMetrics(e *engine.Engine, version string, reqs *requestMetrics) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	for _, c := range append([]prometheus.Collector{
		newCollector(e, version),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}, reqs.collectors()...) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("api: register metrics: %w", err)
		}
	}
	return reg, nil
}

func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(s.metrics, promhttp.HandlerOpts{
		ErrorLog:      promLogger{s.log},
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// promLogger passes promhttp's errors to slog.
type promLogger struct{ log *slog.Logger }

func (l promLogger) Println(v ...any) { l.log.Warn("api: serving metrics", "err", fmt.Sprint(v...)) }
