package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/shardcron/shardcron/engine/executor"
)

// receiver is the local HTTP endpoint of the http executor's tasks: it
// records each fire it gets by its idempotency key.
type receiver struct {
	srv  *http.Server
	url  string
	done chan struct{} // closed when Serve has returned
}

func startReceiver(rec *recorder) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: receiver: %w", err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		key := r.Header.Get(executor.HeaderIdempotencyKey)
		at := strings.LastIndexByte(key, '@')
		msec, err := strconv.ParseInt(key[at+1:], 10, 64)
		node := strings.TrimPrefix(r.Header.Get(executor.HeaderNode), "bench-")
		idx, nerr := strconv.Atoi(node)
		if at < 0 || err != nil || nerr != nil || idx < 0 || idx >= rec.nodes {
			http.Error(w, "bench: bad idempotency key or node", http.StatusBadRequest)
			return
		}
		rec.observe(idx, key[:at], time.UnixMilli(msec), now)
		w.WriteHeader(http.StatusNoContent)
	})
	s := &receiver{
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second},
		url: "http://" + ln.Addr().String() + "/fire", done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		// Serve fails only when the listener does; the run then counts
		// the fires it did not get as missed.
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

func (s *receiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	<-s.done
}
