package membership

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultDebounce is the debounce Watch uses when given zero or less.
const DefaultDebounce = 200 * time.Millisecond

// Watch retries a failed List with backoff between these bounds.
const (
	minRetry = 50 * time.Millisecond
	maxRetry = 2 * time.Second
)

// Member is a registered node.
type Member struct {
	// ID is the node id, taken from the key.
	ID string
	// Info is what the node published. A value that is not valid JSON
	// leaves it zero apart from ID: the key alone makes the member.
	Info NodeInfo
}

// List returns the registered members, sorted by ID, and the etcd revision
// they were read at (a Watch from revision+1 misses no change). An empty
// prefix means DefaultPrefix.
func List(ctx context.Context, cli *clientv3.Client, prefix string) ([]Member, int64, error) {
	return list(ctx, cli, nodesPrefix(prefix))
}

func list(ctx context.Context, cli *clientv3.Client, nodes string) ([]Member, int64, error) {
	resp, err := cli.Get(ctx, nodes, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("membership: list %s: %w", nodes, err)
	}
	members := make([]Member, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if m, ok := decodeMember(nodes, kv.Key, kv.Value); ok {
			members = append(members, m)
		}
	}
	sortMembers(members)
	return members, resp.Header.Revision, nil
}

// decodeMember turns a node key and value into a Member; false for keys
// under the prefix that cannot be a node (an id is never empty and never
// contains '/').
func decodeMember(nodes string, key, value []byte) (Member, bool) {
	id, ok := strings.CutPrefix(string(key), nodes)
	if !ok || id == "" || strings.Contains(id, "/") {
		return Member{}, false
	}
	var info NodeInfo
	if err := json.Unmarshal(value, &info); err != nil {
		info = NodeInfo{}
	}
	info.ID = id
	return Member{ID: id, Info: info}, true
}

func sortMembers(ms []Member) {
	slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
}

func membersEqual(a, b []Member) bool {
	return slices.EqualFunc(a, b, func(x, y Member) bool {
		return x.ID == y.ID && x.Info.APIAddr == y.Info.APIAddr &&
			x.Info.Version == y.Info.Version && x.Info.StartedAt.Equal(y.Info.StartedAt) &&
			x.Info.Leaving == y.Info.Leaving
	})
}

// Watch sends the sorted member set at once and then after every change,
// debounced: changes within debounce of the first one are sent together
// (zero or less means DefaultDebounce). On a watch error or compaction it
// lists the members again and resumes, so a change is never lost, only
// possibly coalesced.
//
// The channel holds at most one set, the newest: a slow reader skips
// intermediate sets but always gets the latest. Watch runs one goroutine;
// it ends, and closes the channel, when ctx ends or cli is closed. To wait
// for it, cancel ctx and read the channel until it is closed.
//
// An empty prefix means DefaultPrefix.
func Watch(ctx context.Context, cli *clientv3.Client, prefix string, debounce time.Duration) <-chan []Member {
	if debounce <= 0 {
		debounce = DefaultDebounce
	}
	w := &watcher{cli: cli, nodes: nodesPrefix(prefix), debounce: debounce, out: make(chan []Member, 1)}
	go func() {
		defer close(w.out)
		w.run(ctx)
	}()
	return w.out
}

// watcher is the state of one Watch; used only by its goroutine.
type watcher struct {
	cli      *clientv3.Client
	nodes    string
	debounce time.Duration
	out      chan []Member

	members map[string]Member // the current set
	sent    []Member          // the last set sent
	started bool              // the first set has been sent
	pending <-chan time.Time  // the debounce timer, nil when none runs
	timer   *time.Timer
}

func (w *watcher) run(ctx context.Context) {
	w.timer = time.NewTimer(time.Hour)
	w.timer.Stop()
	defer w.timer.Stop()
	retry := minRetry
	for {
		rev, err := w.relist(ctx)
		if err != nil {
			if !w.sleep(ctx, retry) {
				return
			}
			retry = min(2*retry, maxRetry)
			continue
		}
		retry = minRetry
		if !w.follow(ctx, rev) {
			return
		}
		// The watch failed: list again, after a pause so that a watch that
		// fails at once (no leader) does not spin.
		if !w.sleep(ctx, minRetry) {
			return
		}
	}
}

// relist reads the whole set; the first set is sent at once, later ones
// through the debounce.
func (w *watcher) relist(ctx context.Context) (int64, error) {
	ms, rev, err := list(ctx, w.cli, w.nodes)
	if err != nil {
		return 0, err
	}
	w.members = make(map[string]Member, len(ms))
	for _, m := range ms {
		w.members[m.ID] = m
	}
	if !w.started {
		w.started = true
		w.send(ms)
	} else {
		w.changed()
	}
	return rev, nil
}

// follow applies the watch from rev+1 until it fails (true: relist) or ctx
// ends (false).
func (w *watcher) follow(ctx context.Context, rev int64) bool {
	// WithRequireLeader: a member cut off from its cluster cancels the watch
	// instead of silently delivering nothing.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := w.cli.Watch(wctx, w.nodes, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for {
		select {
		case <-ctx.Done():
			return false
		case <-w.pending:
			w.pending = nil
			w.flush()
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil {
				return ctx.Err() == nil && w.cli.Ctx().Err() == nil
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					if m, ok := decodeMember(w.nodes, ev.Kv.Key, nil); ok {
						delete(w.members, m.ID)
					}
					continue
				}
				if m, ok := decodeMember(w.nodes, ev.Kv.Key, ev.Kv.Value); ok {
					w.members[m.ID] = m
				}
			}
			if len(resp.Events) > 0 {
				w.changed()
			}
		}
	}
}

// changed starts the debounce timer unless it runs already: the set is sent
// at most debounce after the first change it contains.
func (w *watcher) changed() {
	if w.pending == nil {
		w.timer.Reset(w.debounce)
		w.pending = w.timer.C
	}
}

// flush sends the current set if it differs from the last one sent.
func (w *watcher) flush() {
	ms := make([]Member, 0, len(w.members))
	for _, m := range w.members {
		ms = append(ms, m)
	}
	sortMembers(ms)
	if !membersEqual(ms, w.sent) {
		w.send(ms)
	}
}

// send replaces any unread set in the channel with ms. It never blocks:
// this goroutine is the only sender, so after the drain there is room.
func (w *watcher) send(ms []Member) {
	w.sent = ms
	select {
	case w.out <- ms:
		return
	default:
	}
	select {
	case <-w.out:
	default:
	}
	w.out <- ms
}

// sleep waits d; false if ctx ended or the client was closed meanwhile.
func (w *watcher) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-w.cli.Ctx().Done():
		return false
	case <-t.C:
		return true
	}
}
