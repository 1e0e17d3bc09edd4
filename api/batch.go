package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// batchItem is one item of a batch as sent.
type batchItem struct {
	raw  []byte
	line int // 1-based line of a JSON Lines item; 0 in an array
}

// putBatch: POST /v1/tasks:batch, a JSON array or JSON Lines.
func (s *Server) putBatch(w http.ResponseWriter, r *http.Request) {
	body, ok := readBodyOr(w, r, s.cfg.MaxBatchBytes, "batch body is more than %d bytes, this node's limit: split it into smaller batches", s.cfg.MaxBatchBytes)
	if !ok {
		return
	}
	items, err := splitBatch(body, MaxBatchItems)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	res := client.BatchResult{Errors: []task.BatchError{}}
	puts := make([]registry.BatchItem, len(items))
	var runners *registry.Runners // read once, by the first task that needs them
	for i, it := range items {
		t, err := task.DecodeTask(it.raw)
		if err != nil {
			msg := err.Error()
			if it.line > 0 {
				msg = fmt.Sprintf("line %d: %s", it.line, msg)
			}
			puts[i] = registry.BatchItem{ID: task.PeekID(it.raw), Refused: msg}
			continue
		}
		warning, err := s.runnable(r.Context(), t, &runners)
		if err != nil {
			var ve *task.ValidationError
			if !errors.As(err, &ve) {
				s.fail(w, r, t.ID, err)
				return
			}
			puts[i] = registry.BatchItem{ID: t.ID, Refused: err.Error()}
			continue
		}
		if warning != "" {
			res.Warnings = append(res.Warnings, client.BatchWarning{Index: i, Warning: warning})
		}
		puts[i].Task = t
	}
	put, err := s.reg.PutItems(r.Context(), puts)
	res.Written, res.Unchanged = put.Written, put.Unchanged
	if put.Errors != nil {
		res.Errors = put.Errors
	}
	for _, i := range put.Replaced {
		res.Warnings = append(res.Warnings, client.BatchWarning{Index: i,
			Warning: "its id comes again later in this batch, which replaces this task"})
	}
	slices.SortStableFunc(res.Warnings, func(a, b client.BatchWarning) int { return a.Index - b.Index })
	if err != nil {
		s.log.Warn("api: batch write failed", "written", res.Written, "err", err)
		status := http.StatusInternalServerError
		var ve *task.ValidationError
		switch {
		case errors.As(err, &ve):
			status = http.StatusBadRequest
		case errors.Is(err, registry.ErrNoSpace):
			status, err = http.StatusServiceUnavailable, fmt.Errorf("%s: %w", noSpaceMessage, err)
		}
		writeJSON(w, status, struct {
			Error string `json:"error"`
			client.BatchResult
		}{fmt.Sprintf("batch stopped after writing %d tasks: %v", res.Written, err), res})
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// splitBatch cuts a batch body into its items: a JSON array when its first
// non-space byte is '[', else JSON Lines (blank lines skipped). It refuses
// more than max items and an array that is not well-formed JSON (its items
// cannot be told apart then); an empty body is an empty batch.
func splitBatch(body []byte, max int) ([]batchItem, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '[' {
		return splitArray(body, max)
	}
	var items []batchItem
	line := 0
	for rest := body; len(rest) > 0; {
		var l []byte
		l, rest, _ = bytes.Cut(rest, []byte{'\n'})
		line++
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		if len(items) == max {
			return nil, tooManyItems(max)
		}
		items = append(items, batchItem{raw: bytes.TrimRight(l, "\r"), line: line})
	}
	return items, nil
}

func splitArray(body []byte, max int) ([]batchItem, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil { // '['
		return nil, fmt.Errorf("malformed JSON array: %v", err)
	}
	var items []batchItem
	for dec.More() {
		if len(items) == max {
			return nil, tooManyItems(max)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("malformed JSON array at item %d (byte %d): %v; nothing was written", len(items), dec.InputOffset(), err)
		}
		items = append(items, batchItem{raw: raw})
	}
	if _, err := dec.Token(); err != nil { // ']'
		return nil, fmt.Errorf("malformed JSON array at byte %d: %v; nothing was written", dec.InputOffset(), err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("malformed JSON array: data after its closing ']' at byte %d; nothing was written", dec.InputOffset())
	}
	return items, nil
}

func tooManyItems(max int) error {
	return fmt.Errorf("a batch holds at most %d tasks: split it into several requests; nothing was written", max)
}
