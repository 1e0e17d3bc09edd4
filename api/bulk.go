package api

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"

	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// maxSelectorBytes bounds the body of a bulk action: a prefix and labels.
const maxSelectorBytes = 64 << 10

// bulk returns the handler of POST /v1/tasks:<action>, which applies the
// action to every task the selector in the body chooses
// ({"prefix", "labels", "all", "dry_run"}, and a pause's "note") and
// answers the counts (task.BulkResult). A pause records who paused each
// task it changes, and when, as the pause of one task does. A failure
// midway answers the counts done so far with the error; running the
// action again finishes it.
func (s *Server) bulk(action task.BulkAction) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, ok := readBodyOr(w, r, maxSelectorBytes, "selector: more than %d bytes", maxSelectorBytes)
		if !ok {
			return
		}
		sel, err := decodeSelector(body)
		if err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return
		}
		var res task.BulkResult
		if action == task.BulkPause {
			res, err = s.reg.BulkPause(r.Context(), sel, s.caller(r))
		} else {
			res, err = s.reg.Bulk(r.Context(), action, sel)
		}
		if err != nil {
			var ve *task.ValidationError
			if errors.As(err, &ve) {
				writeError(w, http.StatusBadRequest, "%s", ve.Error())
				return
			}
			s.log.Warn("api: bulk action failed midway", "action", action, "changed", res.Changed, "err", err)
			status := http.StatusInternalServerError
			switch {
			case errors.Is(err, registry.ErrNoSpace):
				status, err = http.StatusServiceUnavailable, fmt.Errorf("%s: %w", noSpaceMessage, err)
			case errors.Is(err, registry.ErrContention):
				status = http.StatusConflict
			}
			writeJSON(w, status, struct {
				task.BulkResult
				Error string `json:"error"`
			}{res, fmt.Sprintf("bulk %s stopped after %d of the matched tasks were changed: %v (run it again to finish)",
				action, res.Changed, err)})
			return
		}
		writeJSON(w, http.StatusOK, res)
	}
}

// decodeSelector decodes a selector, refusing unknown fields (a misspelt
// "lables" must not widen a delete to every task of a prefix) and a prefix
// or label key no task can match (checkFilter).
func decodeSelector(b []byte) (task.Selector, error) {
	var sel task.Selector
	if len(bytes.TrimSpace(b)) == 0 {
		return sel, errors.New(`selector: the body is empty; send {"prefix": "...", "labels": {"k": "v"}, "dry_run": true} or {"all": true}`)
	}
	if err := decodeObject(b, &sel); err != nil {
		return sel, fmt.Errorf("selector: %v (want {\"prefix\", \"labels\", \"all\", \"dry_run\"}, and a pause's \"note\")", err)
	}
	return sel, checkFilter(sel.Prefix, sel.Labels, "labels")
}
