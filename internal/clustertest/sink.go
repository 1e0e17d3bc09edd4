package clustertest

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The headers the http executor sends with every fire (docs/api.md, "What
// executors receive").
const (
	headerKey     = "Idempotency-Key"
	headerNode    = "Shardcron-Node"
	headerAttempt = "Shardcron-Attempt"
	headerFence   = "Shardcron-Fence"
)

// FireKey identifies a fire: a task and its scheduled time in Unix
// milliseconds, as its idempotency key `<task-id>@<unix ms>` says.
type FireKey struct {
	Task string
	At   int64
}

// String returns the idempotency key.
func (k FireKey) String() string { return k.Task + "@" + strconv.FormatInt(k.At, 10) }

// Call is one request the sink received.
type Call struct {
	Node    string    // Shardcron-Node
	Attempt string    // Shardcron-Attempt
	Fence   int64     // Shardcron-Fence: the revision of its partition's lock
	Arrived time.Time // when the request reached the sink
	// Ended is when the sink answered it, or saw its client go away while
	// it held it; zero while it is held.
	Ended time.Time
}

// Sink is an HTTP endpoint that records every fire it receives. Each
// request is held for Delay before it is answered 200, so that a node's
// workers stay busy and a second's burst waits in the queue in batches.
type Sink struct {
	// URL is the sink's base URL on loopback.
	URL string

	delay time.Duration
	srv   *httptest.Server
	// failFirst: every fire's attempt 1 is answered 500, the others 200,
	// as by an endpoint that fails once (set before the first request).
	failFirst bool
	// holdFirst: with failFirst, attempt 1 is held this long (beyond
	// delay) before its 500, as by a slow endpoint that fails (set before
	// the first request).
	holdFirst time.Duration

	mu      sync.Mutex // guards calls, seconds, bad and perNode
	calls   map[FireKey][]Call
	seconds map[int64]int // distinct keys received per scheduled second
	perNode map[nodeSecond]int
	bad     []string // requests without a parsable idempotency key
}

type nodeSecond struct {
	node string
	sec  int64
}

// NewSink starts a sink on a free loopback port; it is closed when the test
// ends.
func NewSink(t testing.TB, delay time.Duration) *Sink {
	t.Helper()
	s := &Sink{delay: delay, calls: make(map[FireKey][]Call), seconds: make(map[int64]int),
		perNode: make(map[nodeSecond]int)}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	t.Cleanup(s.srv.Close)
	return s
}

func (s *Sink) serve(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	key := r.Header.Get(headerKey)
	i := strings.LastIndexByte(key, '@')
	ms, err := strconv.ParseInt(key[i+1:], 10, 64)
	var k FireKey
	j := -1 // the call's index in calls[k]
	s.mu.Lock()
	if i <= 0 || err != nil {
		s.bad = append(s.bad, key)
	} else {
		k = FireKey{Task: key[:i], At: ms}
		prev := s.calls[k]
		if len(prev) == 0 {
			s.seconds[ms/1000]++
		}
		node := r.Header.Get(headerNode)
		fence, _ := strconv.ParseInt(r.Header.Get(headerFence), 10, 64)
		j = len(prev)
		s.calls[k] = append(prev, Call{Node: node, Attempt: r.Header.Get(headerAttempt), Fence: fence, Arrived: now})
		s.perNode[nodeSecond{node, ms / 1000}]++
	}
	s.mu.Unlock()
	hold := s.delay
	fail := s.failFirst && r.Header.Get(headerAttempt) == "1"
	if fail {
		hold += s.holdFirst
	}
	if hold > 0 {
		// A request its node gave up on (a canceled run) ends there.
		t := time.NewTimer(hold)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
	}
	if j >= 0 {
		// Before the answer, so that nothing the answer sets off comes
		// before it.
		s.mu.Lock()
		s.calls[k][j].Ended = time.Now()
		s.mu.Unlock()
	}
	if fail {
		http.Error(w, "attempt 1 fails", http.StatusInternalServerError)
	}
}

// Distinct returns how many distinct fires were received for the scheduled
// second sec (Unix seconds).
func (s *Sink) Distinct(sec int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seconds[sec]
}

// Complete reports whether want distinct fires were received for every
// scheduled second in [from, to].
func (s *Sink) Complete(from, to int64, want int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sec := from; sec <= to; sec++ {
		if s.seconds[sec] < want {
			return false
		}
	}
	return true
}

// Count returns how many distinct fires were received for the scheduled
// seconds in [from, to].
func (s *Sink) Count(from, to int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for sec := from; sec <= to; sec++ {
		n += s.seconds[sec]
	}
	return n
}

// LatestComplete returns the latest scheduled second, at or before now, for
// which want distinct fires were received, or 0.
func (s *Sink) LatestComplete(want int) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sec := time.Now().Unix(); sec > time.Now().Unix()-600; sec-- {
		if s.seconds[sec] >= want {
			return sec
		}
	}
	return 0
}

// PerNode returns how many fires each node sent for the scheduled second
// sec.
func (s *Sink) PerNode(sec int64) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int)
	for k, n := range s.perNode {
		if k.sec == sec {
			out[k.node] = n
		}
	}
	return out
}

// Spread returns, for the scheduled second sec, the time between the first
// and the last arrival of its fires: how long its burst took to get through.
func (s *Sink) Spread(sec int64) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var first, last time.Time
	for k, cs := range s.calls {
		if k.At/1000 != sec {
			continue
		}
		for _, c := range cs {
			if first.IsZero() || c.Arrived.Before(first) {
				first = c.Arrived
			}
			if c.Arrived.After(last) {
				last = c.Arrived
			}
		}
	}
	return last.Sub(first)
}

// Snapshot returns a copy of every recorded call, by fire, and the keys of
// requests whose idempotency key could not be parsed.
func (s *Sink) Snapshot() (map[FireKey][]Call, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[FireKey][]Call, len(s.calls))
	for k, cs := range s.calls {
		out[k] = append([]Call(nil), cs...)
	}
	return out, append([]string(nil), s.bad...)
}
