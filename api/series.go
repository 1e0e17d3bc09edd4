package api

import (
	"context"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/membership"
)

// seriesLen is how many one-second samples a node keeps for the
// dashboard's live charts: five minutes.
const seriesLen = 301

// seriesSample is one sample of the engine's counters.
type seriesSample struct {
	at                 time.Time
	fires, fail, miss  uint64
	lag                []uint64 // cumulative bucket counts of the fire-lag histogram
	lagCount           uint64
	queueDepth, queCap int
}

// series keeps the last seriesLen samples.
type series struct {
	mu      sync.Mutex // guards samples, next and n
	samples [seriesLen]seriesSample
	bounds  []float64 // of the lag histogram, the same in every sample
	next, n int
}

func (s *series) add(at time.Time, st engine.Stats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bounds = st.FireLag.Bounds
	s.samples[s.next] = seriesSample{at: at, fires: st.Fires,
		fail: st.Executions["failed"] + st.Executions["timeout"], miss: st.Misfires,
		lag: st.FireLag.Counts, lagCount: st.FireLag.Count,
		queueDepth: st.QueueDepth, queCap: st.QueueCapacity}
	s.next = (s.next + 1) % seriesLen
	s.n = min(s.n+1, seriesLen)
}

// points returns the intervals between consecutive samples, oldest first.
// An interval where a counter went back (never, short of a bug) is left
// out rather than shown as a spike.
func (s *series) points() []client.Point {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]client.Point, 0, s.n)
	for i := 1; i < s.n; i++ {
		a := &s.samples[(s.next-s.n+i-1+seriesLen)%seriesLen]
		b := &s.samples[(s.next-s.n+i+seriesLen)%seriesLen]
		dt := b.at.Sub(a.at).Seconds()
		if dt <= 0 || b.fires < a.fires || b.fail < a.fail || b.miss < a.miss || b.lagCount < a.lagCount {
			continue
		}
		p := client.Point{T: b.at.UnixMilli(), FireRate: round3(float64(b.fires-a.fires) / dt),
			Failures: b.fail - a.fail, Misfires: b.miss - a.miss}
		if b.queCap > 0 {
			p.QueueFill = round3(float64(b.queueDepth) / float64(b.queCap))
		}
		if b.lagCount > a.lagCount && len(a.lag) == len(b.lag) && len(b.lag) == len(s.bounds) {
			h := engine.Histogram{Bounds: s.bounds, Counts: make([]uint64, len(b.lag)), Count: b.lagCount - a.lagCount}
			for j := range b.lag {
				h.Counts[j] = b.lag[j] - a.lag[j]
			}
			p.P99LagMS = round3(h.Quantile(0.99) * 1000)
		}
		out = append(out, p)
	}
	return out
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// seriesHandler: GET /v1/series (extension), the last five minutes of fire
// rate, p99 lag, failures and misfires of every node, for the dashboard's
// charts; ?scope=self answers this node's only (what the others ask).
func (s *Server) seriesHandler(w http.ResponseWriter, r *http.Request) {
	self := client.NodeSeries{ID: s.e.NodeID(), Points: s.series.points()}
	resp := client.SeriesResponse{IntervalMS: sampleInterval.Milliseconds(), Nodes: []client.NodeSeries{self}}
	switch scope := r.URL.Query().Get("scope"); scope {
	case "self":
		writeJSON(w, http.StatusOK, resp)
		return
	case "":
	default:
		writeError(w, http.StatusBadRequest, "scope: want self (this node's series) or none (every node's), got %q", scope)
		return
	}
	ms, err := s.memberList(r.Context())
	if err != nil {
		s.log.Warn("api: listing members failed; answering this node's series only", "err", err)
		writeJSON(w, http.StatusOK, resp)
		return
	}
	var mu sync.Mutex // guards resp.Nodes
	s.eachPeer(r.Context(), ms, func(ctx context.Context, m membership.Member, c *client.Client) {
		ns := client.NodeSeries{ID: m.ID, Points: []client.Point{}}
		if points, err := c.LocalSeries(ctx); err != nil {
			ns.Error = "did not answer: " + err.Error()
		} else {
			ns.Points = points
		}
		mu.Lock()
		resp.Nodes = append(resp.Nodes, ns)
		mu.Unlock()
	})
	writeJSON(w, http.StatusOK, resp)
}

// nextFires: GET /v1/tasks/{id}/next?count=5 (extension), the task's next
// scheduled times from now, in its time zone, within its window; with a
// jitter, when each is released (preview).
func (s *Server) nextFires(w http.ResponseWriter, r *http.Request) {
	id := pathID(r)
	n, err := parseLimit(r.URL.Query().Get("count"), defaultNextFires, maxNextFires)
	if err != nil {
		writeError(w, http.StatusBadRequest, "count: want a whole number from 1 to %d, got %q", maxNextFires, r.URL.Query().Get("count"))
		return
	}
	t, err := s.reg.Get(r.Context(), id)
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	// Stored tasks were validated: this only fails on a node whose time
	// zone database lacks the zone.
	p, err := preview(t, time.Now(), n)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}
