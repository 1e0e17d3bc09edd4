// Package lograte passes one log line of each key an interval and counts
// the lines it held back, so that a fault that repeats (a slow etcd, a
// node that does not answer) is told once in a while with how often,
// rather than filling the log.
package lograte

import (
	"sync"
	"time"
)

// Limiter passes one line of each key an Every. The zero value, given its
// Every, is ready; it is safe for concurrent use.
type Limiter struct {
	Every time.Duration

	mu   sync.Mutex
	last map[string]time.Time // when each key last passed
	held map[string]int       // lines of each key held back since
}

// Pass reports whether a line of key at now may be logged, and how many
// lines of key were held back since the last that was.
func (l *Limiter) Pass(key string, now time.Time) (ok bool, held int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if last, seen := l.last[key]; seen && now.Sub(last) < l.Every {
		l.held[key]++
		return false, 0
	}
	if l.last == nil {
		l.last, l.held = map[string]time.Time{}, map[string]int{}
	}
	held = l.held[key]
	l.last[key], l.held[key] = now, 0
	return true, held
}
