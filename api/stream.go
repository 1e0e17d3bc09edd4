package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
)

// streamChunk is how many bytes a streamed answer gathers before it writes
// them to the client.
const streamChunk = 64 << 10

// jsonStream writes a 200 answer in pieces as they are read, so that a
// page of 10 000 tasks or an export of millions is never held whole.
// Not safe for concurrent use.
type jsonStream struct {
	w   http.ResponseWriter
	buf bytes.Buffer
	enc *json.Encoder
	n   int // items written
}

func newJSONStream(w http.ResponseWriter) *jsonStream {
	s := &jsonStream{w: w}
	s.enc = json.NewEncoder(&s.buf)
	s.enc.SetEscapeHTML(false) // as writeJSON
	return s
}

// begin sends the status and headers, and head.
func (s *jsonStream) begin(head string) {
	if s.w.Header().Get("Content-Type") == "" {
		s.w.Header().Set("Content-Type", "application/json")
	}
	s.w.Header().Set("Cache-Control", "no-store")
	s.w.Header().Set("X-Content-Type-Options", "nosniff") // as writeJSON
	s.w.WriteHeader(http.StatusOK)
	s.buf.WriteString(head)
}

// item adds v as an element of a JSON array.
func (s *jsonStream) item(v any) error {
	if s.n > 0 {
		s.buf.WriteByte(',')
	}
	if err := s.enc.Encode(v); err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	s.n++
	return s.flushIfFull()
}

// raw adds b, a JSON value, as an element of a JSON array, followed by a
// newline as item writes it.
func (s *jsonStream) raw(b []byte) error {
	if s.n > 0 {
		s.buf.WriteByte(',')
	}
	s.buf.Write(b)
	s.buf.WriteByte('\n')
	s.n++
	return s.flushIfFull()
}

// line adds b as a line of JSON Lines.
func (s *jsonStream) line(b []byte) error {
	s.buf.Write(b)
	s.buf.WriteByte('\n')
	s.n++
	return s.flushIfFull()
}

func (s *jsonStream) flushIfFull() error {
	if s.buf.Len() < streamChunk {
		return nil
	}
	_, err := s.w.Write(s.buf.Bytes())
	s.buf.Reset()
	if err != nil {
		return fmt.Errorf("send the answer: %w", err)
	}
	return nil
}

// end sends tail and what is left.
func (s *jsonStream) end(tail string) {
	s.buf.WriteString(tail)
	_, _ = s.w.Write(s.buf.Bytes()) // the client went away: nothing to do
	s.buf.Reset()
}

// abort cuts the answer off: net/http closes the connection without ending
// the body, so the client sees a broken answer instead of a short page.
// It is net/http's own way (http.ErrAbortHandler) and never reaches a log.
func (s *jsonStream) abort() {
	panic(http.ErrAbortHandler)
}
