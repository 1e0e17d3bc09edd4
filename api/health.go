package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/ring"
	"github.com/shardcron/shardcron/task"
)

// Fleet health: lists by status, answered by the owners, the states of a
// page of tasks, and the cluster's recent failures.

// Limits of GET /v1/failures.
const (
	DefaultFailuresLimit = 100
	MaxFailuresLimit     = 1000
)

// queryHeld runs the engine's Query, with the partitions its answer
// covers: those whose tasks the node held throughout it.
func (s *Server) queryHeld(ctx context.Context, q task.StatusQuery) (client.StatusAnswer, error) {
	ms, more, held, err := s.e.Query(ctx, q)
	if err != nil {
		return client.StatusAnswer{}, err
	}
	if ms == nil {
		ms = []task.Match{}
	}
	return client.StatusAnswer{Tasks: ms, More: more, Held: held}, nil
}

// uncovered returns the partitions that no answer held throughout its
// scan: they changed hands (or their owner did not answer), so their
// tasks may be missing.
func uncovered(answers []client.StatusAnswer, partitions int) []int {
	held := make([]bool, partitions)
	for _, a := range answers {
		for _, p := range a.Held {
			if p >= 0 && p < partitions {
				held[p] = true
			}
		}
	}
	var out []int
	for p, h := range held {
		if !h {
			out = append(out, p)
		}
	}
	return out
}

// localStatus: GET /v1/tasks:status?status=&prefix=&after=&limit=
// (extension, node to node): the tasks this node owns with a status.
func (s *Server) localStatus(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	st, err := task.ParseStatus(q.Get("status"))
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	limit, err := parseLimit(q.Get("limit"), DefaultListLimit, registry.MaxListLimit+1)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	a, err := s.queryHeld(r.Context(), task.StatusQuery{Status: st, Prefix: q.Get("prefix"), After: q.Get("after"), Limit: limit})
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}

// statusRound asks every node for its first matches of q and merges them
// (mergeStatus). missing says which nodes did not answer, and which
// partitions no node held throughout its scan.
func (s *Server) statusRound(ctx context.Context, q task.StatusQuery) (matches []task.Match, bound string, more bool, missing []string, err error) {
	var answers []client.StatusAnswer
	done := make(chan struct{})
	go func() {
		defer close(done)
		answers, missing = askPeers(s, ctx, "list its tasks by status", func(ctx context.Context, c *client.Client) (client.StatusAnswer, error) {
			a, err := c.LocalStatus(ctx, q)
			if err != nil {
				return client.StatusAnswer{}, err
			}
			return *a, nil
		})
	}()
	own, err := s.queryHeld(ctx, q)
	<-done
	if err != nil {
		return nil, "", false, nil, err
	}
	answers = append(answers, own)
	matches, bound, more = mergeStatus(answers)
	if ps := uncovered(answers, s.reg.Partitions()); len(ps) > 0 {
		missing = append(missing, fmt.Sprintf("partitions %s were held by no node that answered, throughout its scan (moving, or their owner did not answer): their tasks may be missing", ring.Ranges(ps)))
	}
	return matches, bound, more, missing, nil
}

// mergeStatus merges the nodes' answers: the matches in id order, each id
// once, up to bound when a node has more (past that node's last id
// another of its matches could come before the next ones of the others);
// more tells whether any node has more.
func mergeStatus(answers []client.StatusAnswer) (matches []task.Match, bound string, more bool) {
	for _, a := range answers {
		matches = append(matches, a.Tasks...)
		if a.More && len(a.Tasks) > 0 {
			if last := a.Tasks[len(a.Tasks)-1].ID; !more || last < bound {
				bound = last
			}
			more = true
		}
	}
	slices.SortStableFunc(matches, func(a, b task.Match) int { return strings.Compare(a.ID, b.ID) })
	// A task seen by two nodes (one releasing its partition, one taking
	// it) is listed once.
	matches = slices.CompactFunc(matches, func(a, b task.Match) bool { return a.ID == b.ID })
	if more {
		end, _ := slices.BinarySearchFunc(matches, bound, func(m task.Match, id string) int { return strings.Compare(m.ID, id) })
		matches = matches[:min(end+1, len(matches))]
	}
	return matches, bound, more
}

// listByStatus: GET /v1/tasks?status=failing|paused|stale with the other
// filters of a list. The owners say which of their tasks have the status,
// in id order; the tasks are read from etcd and checked against the labels.
// Rounds go on until the page holds opts.Limit tasks and one more match
// is known (then the cursor is the page's last id), or no match remains.
// Every task carries its state. A node that does not answer makes the
// answer partial, which "partial" says.
func (s *Server) listByStatus(w http.ResponseWriter, r *http.Request, opts registry.ListOptions, st task.Status) {
	ctx := r.Context()
	if err := registry.CheckCursor(opts.Cursor); err != nil {
		s.fail(w, r, "", err)
		return
	}
	jw := newJSONStream(w)
	after, next := opts.Cursor, ""
	var partial []string
	var last string
	// A round asks each node for limit+1 matches, and twice as many as
	// the round before when labels left the page short: a label that few
	// of the matches carry costs a few large rounds, not many small ones.
	k := opts.Limit + 1
	err := func() error {
		for ; ; k = min(2*k, registry.MaxListLimit+1) {
			q := task.StatusQuery{Status: st, Prefix: opts.Prefix, After: after, Limit: k}
			ms, bound, more, missing, err := s.statusRound(ctx, q)
			if err != nil {
				return err
			}
			for _, m := range missing {
				if !slices.Contains(partial, m) {
					partial = append(partial, m)
				}
			}
			ids := make([]string, len(ms))
			for i, m := range ms {
				ids[i] = m.ID
			}
			tasks, err := s.reg.GetMany(ctx, ids)
			if err != nil {
				return err
			}
			for i, t := range tasks {
				if t == nil || !hasLabels(t.Labels, opts.Labels) {
					continue // deleted since, or not labelled so
				}
				if jw.n == opts.Limit {
					next = last // a match follows the full page
					return nil
				}
				if jw.n == 0 {
					jw.begin(`{"tasks":[`)
				}
				t.State = ms[i].State
				pauseInState(t)
				if err := jw.item(t); err != nil {
					return err
				}
				last = t.ID
			}
			if !more {
				return nil
			}
			after = bound
		}
	}()
	if err != nil {
		if jw.n == 0 {
			s.fail(w, r, "", fmt.Errorf("list %s tasks: %w", st, err))
			return
		}
		s.log.Warn("api: list by status failed after its first tasks were sent; cutting the answer off", "err", err)
		jw.abort()
		return
	}
	if jw.n == 0 {
		jw.begin(`{"tasks":[`)
	}
	tail, _ := json.Marshal(next)
	end := `],"next_cursor":` + string(tail)
	if len(partial) > 0 {
		p, _ := json.Marshal(partial)
		end += `,"partial":` + string(p)
	}
	jw.end(end + "}\n")
}

// hasLabels reports whether labels hold every pair of want.
func hasLabels(labels, want map[string]string) bool {
	for k, v := range want {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// statesChunk is how many tasks of a page get their states at once.
const statesChunk = 500

// fillStates sets the state of each task from its owner: this node, or the
// ring's owner asked once for all of its tasks among them. A task whose
// owner does not answer keeps a nil state, as GET /v1/tasks/{id} does.
func (s *Server) fillStates(ctx context.Context, tasks []*task.Task) {
	a := s.e.Assignment()
	if a == nil {
		return
	}
	byOwner := map[string][]int{}
	for i, t := range tasks {
		owner := a.Owner(s.reg.Partition(t.ID))
		byOwner[owner] = append(byOwner[owner], i)
	}
	var wg sync.WaitGroup
	for owner, idx := range byOwner {
		if owner == "" {
			continue
		}
		ids := make([]string, len(idx))
		for k, i := range idx {
			ids[k] = tasks[i].ID
		}
		wg.Go(func() {
			var states []*task.State
			var err error
			if owner == s.e.NodeID() {
				sctx, cancel := context.WithTimeout(ctx, stateTimeout)
				states, err = s.e.TaskStates(sctx, ids)
				cancel()
			} else if c := s.peerClient(ctx, owner); c != nil {
				pctx, cancel := context.WithTimeout(ctx, peerTimeout)
				states, err = c.LocalStates(pctx, ids)
				cancel()
			}
			if err != nil || len(states) != len(ids) {
				s.warnPeer(owner, "api: the owner of tasks did not give their states", "tasks", len(ids), "err", err)
				return
			}
			for k, i := range idx {
				tasks[i].State = states[k] // each goroutine sets its own tasks
				pauseInState(tasks[i])
			}
		})
	}
	wg.Wait()
}

// maxStatesBody bounds the body of POST /v1/tasks:states: registry.MaxListLimit
// ids of 256 bytes, escaped.
const maxStatesBody = 16 << 20

// localStates: POST /v1/tasks:states {"ids": [...]} (extension, node to
// node): the states of the tasks this node holds, in the order of ids,
// null for the others.
func (s *Server) localStates(w http.ResponseWriter, r *http.Request) {
	var req client.StatesRequest
	body, err := readBody(r, maxStatesBody)
	if err == nil {
		err = decodeObject(body, &req)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v (want {\"ids\": [task ids]})", err)
		return
	}
	if len(req.IDs) > registry.MaxListLimit {
		writeError(w, http.StatusBadRequest, "ids: at most %d, got %d", registry.MaxListLimit, len(req.IDs))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), stateTimeout)
	defer cancel()
	states, err := s.e.TaskStates(ctx, req.IDs)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	writeJSON(w, http.StatusOK, client.StatesAnswer{States: states})
}

// failures: GET /v1/failures?limit= , the latest failed or timed-out
// attempts of the cluster, newest first (by scheduled time), at most
// limit: each node remembers its last 1000 since it started. With local=1
// (extension) from this node only.
func (s *Server) failures(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := parseLimit(q.Get("limit"), DefaultFailuresLimit, MaxFailuresLimit)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	onlyLocal, err := parseFlag(r, "local")
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	local := s.e.RecentFailures(limit)
	if onlyLocal {
		writeJSON(w, http.StatusOK, client.FailuresResponse{Failures: nonNil(local)})
		return
	}
	lists, partial := askPeers(s, r.Context(), "give its failures", func(ctx context.Context, c *client.Client) ([]task.Execution, error) {
		return c.LocalFailures(ctx, limit)
	})
	lists = append(lists, local)
	writeJSON(w, http.StatusOK, client.FailuresResponse{Failures: nonNil(mergeHistory(lists, limit)), Partial: partial})
}
