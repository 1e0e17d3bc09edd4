package main

import (
	"io"
	"net/http"
	"time"
)

// bodyDeadline bounds the time a request's body may take to arrive: wait
// from the request's headers, and a second more for each rate bytes the
// handler has read of it. A client that sends its headers and then
// trickles its body, or stops halfway, has its connection closed at the
// deadline (the handler's read fails: 400). A body its handler does not
// read (a request refused for its token) is read by Go's server after the
// answer, up to 256 KiB, for the connection's next request: that read has
// the same deadline.
//
// http.Server.ReadTimeout would be one bound for every body, from the
// request's first byte: to let a batch of 64 MiB arrive at a modest pace
// it would let a stalled pause note of 100 bytes hold its connection and
// goroutine as long.
//
// The deadline ends with the body: at its end Go's server clears the
// connection's read deadline (it then waits for the client's close, or
// its next request, with none), so that an answer that takes long, an
// export or a bulk action, is not cut. Under HTTP/2 the deadline is the
// stream's, and cuts its body only.
type bodyDeadline struct {
	next http.Handler
	wait time.Duration
	rate int64 // bytes a second
}

func (b *bodyDeadline) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody {
		b.next.ServeHTTP(w, r)
		return
	}
	d := &deadlineBody{ReadCloser: r.Body, rc: http.NewResponseController(w), start: time.Now(), wait: b.wait, rate: b.rate}
	// Errors are ignored: a connection that takes no deadline has none.
	_ = d.rc.SetReadDeadline(d.start.Add(b.wait))
	r.Body = d
	b.next.ServeHTTP(w, r)
}

// deadlineBody is a request body whose reads move its connection's read
// deadline on by a second for each rate bytes read.
type deadlineBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	wait  time.Duration
	rate  int64
	n     int64 // bytes read
}

func (d *deadlineBody) Read(p []byte) (int, error) {
	n, err := d.ReadCloser.Read(p)
	d.n += int64(n)
	// Not at the body's end: the server has cleared the deadline then,
	// and one set again would end its wait for the client's close with a
	// timeout that cancels the request's context.
	if n > 0 && err == nil {
		_ = d.rc.SetReadDeadline(d.start.Add(d.wait + time.Duration(d.n/d.rate)*time.Second))
	}
	return n, err
}
