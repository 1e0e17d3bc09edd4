package executor

import (
	"strings"
	"sync"
)

// Output keeps the first bytes an attempt printed, up to a bound: a task's
// opt-in capture (capture.max_bytes, at most 4096). An exec command's
// stdout and stderr are written to it as they come, interleaved; an http
// answer's body; a handler may write to it. Writes past the bound are
// counted as written and dropped, so a writer never fails or blocks on it.
// It is safe for concurrent use.
type Output struct {
	mu        sync.Mutex // guards buf and truncated
	max       int
	buf       []byte
	truncated bool
}

// NewOutput returns an Output that keeps the first max bytes.
func NewOutput(max int) *Output { return &Output{max: max} }

// Write keeps what fits within the bound and drops the rest; it never
// fails.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	room := o.max - len(o.buf)
	if len(p) > room {
		o.truncated = true
	}
	if room > 0 {
		o.buf = append(o.buf, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

// String returns what was kept as valid UTF-8: invalid bytes, and a rune
// cut by the bound, become U+FFFD.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.ToValidUTF8(string(o.buf), "\uFFFD")
}

// Truncated reports whether more was written than the bound kept.
func (o *Output) Truncated() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.truncated
}
