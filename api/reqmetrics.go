package api

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// requestMetrics count and time the API's requests by route: the mux
// pattern without its method ("/v1/tasks/{id}"), so that task ids never
// become label values; "unmatched" for paths no route serves.
type requestMetrics struct {
	total    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newRequestMetrics() *requestMetrics {
	return &requestMetrics{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardcron_api_requests_total",
			Help: "HTTP requests this node's API answered, by method, route and status code.",
		}, []string{"method", "route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "shardcron_api_request_duration_seconds",
			Help: "Time to answer an HTTP request of this node's API, by method and route (requests fanned out to " +
				"other nodes include their time).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"method", "route"}),
	}
}

func (m *requestMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.total, m.duration}
}

// knownMethods bound the method label: anything else counts as "other".
var knownMethods = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true,
	"PATCH": true, "OPTIONS": true}

func (m *requestMetrics) observe(method, pattern string, code int, d time.Duration) {
	route := "unmatched"
	if pattern != "" {
		_, path, ok := strings.Cut(pattern, " ")
		if !ok {
			path = pattern
		}
		// A pattern's "{$}" (the path ends there) is no part of any
		// path a request names: the dashboard's route is "/".
		route = strings.TrimSuffix(path, "{$}")
	}
	if !knownMethods[method] {
		method = "other"
	}
	m.total.WithLabelValues(method, route, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(method, route).Observe(d.Seconds())
}
