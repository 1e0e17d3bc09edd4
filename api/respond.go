package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// errorBody is every error answer: {"error": "..."}.
type errorBody struct {
	Error string `json:"error"`
}

// writeJSON writes v as the JSON answer with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	// An answer may quote what a request sent (a task id with markup):
	// never HTML, even to a browser that would guess.
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // ids and URLs stay readable; the dashboard never injects answers as HTML
	_ = enc.Encode(v)        // the client went away: nothing to do
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, errorBody{Error: fmt.Sprintf(format, args...)})
}

// writeTask answers a task with its version as ETag, so that a client can
// send it back as If-Match.
func writeTask(w http.ResponseWriter, status int, t *task.Task) {
	if t.Version != 0 {
		w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(t.Version, 10)))
	}
	writeJSON(w, status, t)
}

// errTooBig is readBody's error for a body past its limit.
var errTooBig = errors.New("request body too big")

// readBody reads a request body of at most limit bytes; a longer one is
// errTooBig. A body whose Content-Length is past the limit is refused
// before any of it is read: a client that asked Expect: 100-continue then
// gets the answer at once, instead of sending a body that the server,
// having read its limit and answered, cuts off with a reset (which curl
// reports rather than the answer).
//
// A body with a Content-Encoding (gzip, say) is refused: the node reads
// bodies as they are sent, and read as JSON a compressed one was "not
// valid UTF-8" at best.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return nil, fmt.Errorf("Content-Encoding %q is not supported: send the body uncompressed", ce)
	}
	if r.ContentLength > limit {
		return nil, errTooBig
	}
	// One byte more than the limit tells "too big" from "exactly the limit".
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading the request body: %w", err)
	}
	if int64(len(body)) > limit {
		return nil, errTooBig
	}
	// Editors and PowerShell on Windows begin a file with it; JSON allows
	// a reader to ignore it.
	return bytes.TrimPrefix(body, []byte("\xef\xbb\xbf")), nil
}

// readBodyOr is readBody answering its error itself: 413 with the message
// tooBig (a format for args) for a body past limit, 400 for a body that
// could not be read. ok is false when it answered.
func readBodyOr(w http.ResponseWriter, r *http.Request, limit int64, tooBig string, args ...any) (body []byte, ok bool) {
	body, err := readBody(r, limit)
	switch {
	case errors.Is(err, errTooBig):
		writeError(w, http.StatusRequestEntityTooLarge, tooBig, args...)
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, "%v", err)
		return nil, false
	}
	return body, true
}

// noSpaceMessage begins the answer to a write etcd refused for space.
const noSpaceMessage = "etcd is out of space (its NOSPACE alarm is raised), so it refuses every write until an " +
	"operator frees space (compact and defragment etcd, then disarm the alarm: etcdctl alarm disarm); reads go on"

// fail answers an error of the registry or the engine: input errors are
// 4xx with their message, anything else a 5xx naming what failed.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, id string, err error) {
	var ve *task.ValidationError
	switch {
	case errors.As(err, &ve):
		writeError(w, http.StatusBadRequest, "%s", ve.Error())
	case errors.Is(err, registry.ErrNotFound):
		writeError(w, http.StatusNotFound, "task %q not found", id)
	case errors.Is(err, registry.ErrVersionMismatch):
		writeError(w, http.StatusPreconditionFailed,
			"task %q has another version than If-Match says (it changed or does not exist): GET it and retry with its current version", id)
	case errors.Is(err, registry.ErrContention):
		writeError(w, http.StatusConflict, "%v", err)
	case errors.Is(err, registry.ErrNoSpace):
		s.log.Warn("api: etcd refused a write: its space quota is exhausted (NOSPACE alarm)", "method", r.Method,
			"path", r.URL.EscapedPath(), "err", err)
		writeError(w, http.StatusServiceUnavailable, "%s: %v", noSpaceMessage, err)
	case errors.Is(err, engine.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, "the node is shutting down: retry on another node")
	case errors.Is(err, context.DeadlineExceeded):
		s.log.Warn("api: request timed out", "method", r.Method, "path", r.URL.EscapedPath(), "err", err)
		writeError(w, http.StatusGatewayTimeout, "etcd did not answer in time: %v", err)
	case r.Context().Err() != nil:
		// The client is gone; the answer is for the log only.
		writeError(w, http.StatusServiceUnavailable, "request canceled: %v", err)
	default:
		s.log.Warn("api: request failed", "method", r.Method, "path", r.URL.EscapedPath(), "err", err)
		writeError(w, http.StatusInternalServerError, "%v", err)
	}
}
