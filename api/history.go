package api

import (
	"cmp"
	"context"
	"net/http"
	"slices"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/task"
)

// history: GET /v1/tasks/{id}/history?limit=, newest first, merged from
// every node; with local=1 (extension) from this node's store only.
func (s *Server) history(w http.ResponseWriter, r *http.Request) {
	id := pathID(r)
	q := r.URL.Query()
	limit, err := parseLimit(q.Get("limit"), DefaultHistoryLimit, MaxHistoryLimit)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	onlyLocal, err := parseFlag(r, "local")
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	local, err := s.e.History(r.Context(), id, limit)
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	if onlyLocal {
		writeJSON(w, http.StatusOK, client.HistoryResponse{Executions: nonNil(local)})
		return
	}
	lists, missing := askPeers(s, r.Context(), "give its history", func(ctx context.Context, c *client.Client) ([]task.Execution, error) {
		return c.LocalHistory(ctx, id, limit)
	}, "task", id)
	lists = append(lists, local)
	merged := mergeHistory(lists, limit)
	if len(merged) == 0 && len(missing) == 0 {
		// No record on any node: a mistyped id must not read as a task
		// that never ran. (Records outlive their task on the nodes that
		// are not its owner, until they expire: those are still answered,
		// and a node that did not answer may hold some.)
		if _, err := s.reg.Get(r.Context(), id); err != nil {
			s.fail(w, r, id, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, client.HistoryResponse{Executions: nonNil(merged), Partial: missing})
}

func nonNil(e []task.Execution) []task.Execution {
	if e == nil {
		return []task.Execution{}
	}
	return e
}

// mergeHistory merges the records of several nodes, newest first: by
// scheduled_at, then attempt, descending; identical records (a node asked
// twice, or reachable at two addresses) are kept once; at most limit.
func mergeHistory(lists [][]task.Execution, limit int) []task.Execution {
	var all []task.Execution
	for _, l := range lists {
		all = append(all, l...)
	}
	// A total order, so that identical records end up next to each other
	// and the answer does not depend on which node answered first.
	slices.SortFunc(all, func(a, b task.Execution) int {
		return cmp.Or(
			b.ScheduledAt.Compare(a.ScheduledAt),
			cmp.Compare(b.Attempt, a.Attempt),
			b.StartedAt.Compare(a.StartedAt),
			b.FinishedAt.Compare(a.FinishedAt),
			cmp.Compare(a.Node, b.Node),
			cmp.Compare(a.Status, b.Status),
			cmp.Compare(a.Error, b.Error),
			cmp.Compare(a.TaskID, b.TaskID),
		)
	})
	all = slices.CompactFunc(all, func(a, b task.Execution) bool {
		return a.TaskID == b.TaskID && a.ScheduledAt.Equal(b.ScheduledAt) && a.StartedAt.Equal(b.StartedAt) &&
			a.FinishedAt.Equal(b.FinishedAt) && a.Attempt == b.Attempt && a.Node == b.Node &&
			a.Status == b.Status && a.Error == b.Error
	})
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	return all
}
