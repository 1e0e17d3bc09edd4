package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/shardcron/shardcron/task"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits of List.
const (
	DefaultListLimit = 1000  // tasks in a page when the caller gives no limit
	MaxListLimit     = 10000 // the largest page
)

// ListOptions filter and page List.
type ListOptions struct {
	Prefix string            // only ids with this prefix ('/' is a byte like any other)
	Labels map[string]string // only tasks with all these labels
	Limit  int               // at most this many tasks: 1 to MaxListLimit, 0 for DefaultListLimit
	Cursor string            // the last id of the previous page: this page starts after it
}

// query is what one scan of the index reads.
type query struct {
	prefix string
	labels map[string]string
	after  string // ids up to and including it are skipped; "" skips none
}

// List returns a page of the tasks that match opts, ordered by id, read at
// one etcd revision, and the cursor of the next page ("" after the last).
// A page holds opts.Limit tasks, fewer only when no match remains. The
// cursor is the page's last id, so paging is stable while tasks come and go:
// a task present from the first page to the last is returned exactly once,
// whatever is added, deleted or handed over meanwhile.
func (r *Registry) List(ctx context.Context, opts ListOptions) ([]*task.Task, string, error) {
	var out []*task.Task
	next, err := r.ListFunc(ctx, opts, func(t *task.Task) error {
		out = append(out, t)
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return out, next, nil
}

// ListFunc is List giving the page's tasks to fn one by one, in order,
// instead of building the page: fn's error stops the list and is returned.
func (r *Registry) ListFunc(ctx context.Context, opts ListOptions, fn func(*task.Task) error) (next string, err error) {
	return r.listKV(ctx, opts, func(kv *mvccpb.KeyValue) error {
		t, err := r.decode(kv)
		if err != nil {
			return err
		}
		return fn(t)
	})
}

// listKV is ListFunc giving the stored keys and values.
func (r *Registry) listKV(ctx context.Context, opts ListOptions, fn func(*mvccpb.KeyValue) error) (next string, err error) {
	limit := opts.Limit
	switch {
	case limit == 0:
		limit = DefaultListLimit
	case limit < 0 || limit > MaxListLimit:
		return "", task.Invalid("limit", "want 1 to %d, got %d", MaxListLimit, limit)
	}
	if err := CheckCursor(opts.Cursor); err != nil {
		return "", err
	}
	q := query{prefix: opts.Prefix, labels: opts.Labels, after: opts.Cursor}
	last := ""
	more, err := r.scan(ctx, q, limit, func(kv *mvccpb.KeyValue, id string) error {
		last = id
		return fn(kv)
	})
	if err != nil {
		return "", fmt.Errorf("list tasks: %w", err)
	}
	if !more {
		return "", nil
	}
	return last, nil
}

// CheckCursor refuses (*task.ValidationError) a cursor that cannot be the
// last id of a page, as List does.
func CheckCursor(c string) error {
	if c == "" {
		return nil
	}
	if err := task.CheckID(c); err != nil {
		var ve *task.ValidationError
		if errors.As(err, &ve) {
			return task.Invalid("cursor", "not the last id of a page (%s)", ve.Reason)
		}
		return err
	}
	return nil
}

// Export gives fn every task that sel's Prefix and Labels match (All,
// DryRun and Validate are the bulk actions' and do not apply), as stored (the task JSON
// without the fields responses add, which 'shardcron import' and
// POST /v1/tasks:batch read back as is), all read at one etcd revision: a
// consistent snapshot, whatever is written while it runs. It returns how
// many tasks it gave and the revision. fn's error stops it.
//
// The order is the one of each: by id with a prefix or labels, by
// partition and then id for a whole export (see each).
func (r *Registry) Export(ctx context.Context, sel task.Selector, fn func(stored []byte) error) (n int, rev int64, err error) {
	q := query{prefix: sel.Prefix, labels: sel.Labels}
	rev, built, err := r.readRevision(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("export tasks: %w", err)
	}
	err = r.each(ctx, q, rev, built, func(kv *mvccpb.KeyValue, _ string) error {
		// An import reads every line back: a stored value that is not a
		// JSON object (written by hand into etcd) would fail there, late.
		// Its ends tell at no cost; json.Valid cost a tenth of the rate.
		if v := bytes.TrimSpace(kv.Value); len(v) < 2 || v[0] != '{' || v[len(v)-1] != '}' {
			return fmt.Errorf("registry: stored task %s is corrupt: not a JSON object", kv.Key)
		}
		n++
		return fn(kv.Value)
	})
	if err != nil {
		return n, rev, fmt.Errorf("export tasks at revision %d: %w", rev, err)
	}
	return n, rev, nil
}

// each gives fn every task that q matches at revision rev (q.after is
// honoured too). With a prefix or labels, and the index built, it reads the
// matches the index names, in id order. Without a filter it streams the
// task keys with their values, in key order (by partition, then id): the
// index would only add a second read of every task, which halves the rate
// of a whole export or bulk action at fleet size.
func (r *Registry) each(ctx context.Context, q query, rev int64, built bool, fn func(kv *mvccpb.KeyValue, id string) error) error {
	var err error
	if built && (q.prefix != "" || len(q.labels) > 0) {
		_, err = r.scanAt(ctx, q, rev, 0, fn)
	} else {
		_, err = r.scanTasks(ctx, q, rev, 0, fn)
	}
	return err
}

// readRevision returns etcd's current revision, and whether the index is
// built, with one read: a marker deleted to have the index built again
// sends the next list back to scanning the tasks.
func (r *Registry) readRevision(ctx context.Context) (rev int64, built bool, err error) {
	resp, err := r.cli.Get(ctx, r.keys.indexBuilt(), clientv3.WithCountOnly())
	if err != nil {
		return 0, false, fmt.Errorf("read revision: %w", err)
	}
	return resp.Header.Revision, resp.Count > 0, nil
}

// scan reads the tasks that match q at the current revision, at most limit
// of them (0: all), and gives them to fn in id order. It reports whether
// another match follows the last one given.
func (r *Registry) scan(ctx context.Context, q query, limit int, fn func(kv *mvccpb.KeyValue, id string) error) (more bool, err error) {
	rev, built, err := r.readRevision(ctx)
	if err != nil {
		return false, err
	}
	if !built {
		return r.scanTasks(ctx, q, rev, limit, fn)
	}
	return r.scanAt(ctx, q, rev, limit, fn)
}

// Reading the index.
const (
	fetchBatch   = MaxTxnOps // task reads in one transaction
	fetchWorkers = 4         // transactions of task reads in flight (an export)
	scanRound    = fetchBatch * fetchWorkers
	pageRound    = 1024 // ids of a page read before its tasks

	// maxFetchInFlight bounds the transactions of one fetch in flight: a
	// page's round, and GetMany's ids (a list by status: up to 10 001 from
	// each node) in as many rounds as they take.
	maxFetchInFlight = pageRound / fetchBatch
)

// scanAt is scan through the index at revision rev. Every match the index
// names is read and checked against q, so an index key that outlived its
// task (written by a node of an older version) is skipped, never returned.
//
// A page (limit > 0) reads its ids, and one more to learn whether another
// follows, then stops the index streams before reading the tasks: etcd
// sends a stream ahead of what its reader takes, as far as gRPC's flow
// control lets it (hundreds of thousands of keys at fleet size), and a
// stream left open while the tasks are read costs more than the page. A
// round that skips a match reopens the streams after its last id.
func (r *Registry) scanAt(ctx context.Context, q query, rev int64, limit int, fn func(kv *mvccpb.KeyValue, id string) error) (more bool, err error) {
	m := r.matches(q, rev)
	defer m.close()
	given := 0
	ids := make([]string, 0, scanRound)
	for {
		want := scanRound
		if limit > 0 {
			want = min(pageRound, limit-given+1)
		}
		ids = ids[:0]
		for len(ids) < want {
			id, ok, err := m.next(ctx)
			if err != nil {
				return false, err
			}
			if !ok {
				break
			}
			ids = append(ids, id)
		}
		if len(ids) == 0 {
			return false, nil
		}
		if limit > 0 {
			m.suspend(ids[len(ids)-1])
		}
		kvs, err := r.fetch(ctx, ids, rev)
		if err != nil {
			return false, err
		}
		for i, kv := range kvs {
			// An index key without its task, or of a task that no longer
			// matches, is no match: neither in the page nor after it, where
			// it would send the client on to an empty page.
			if kv == nil || (len(q.labels) > 0 && !storedHasLabels(kv.Value, q.labels)) {
				continue
			}
			if limit > 0 && given == limit {
				return true, nil // ids[i] is a match after the page
			}
			if err := fn(kv, ids[i]); err != nil {
				return false, err
			}
			given++
		}
		if len(ids) < want {
			return false, nil // the index has no more
		}
	}
}

// fetch reads the tasks of ids at revision rev, in transactions of
// fetchBatch reads, at most maxFetchInFlight at once (an export's round
// of scanRound ids sends fetchWorkers). A task that is not stored comes
// back nil.
func (r *Registry) fetch(ctx context.Context, ids []string, rev int64) ([]*mvccpb.KeyValue, error) {
	out := make([]*mvccpb.KeyValue, len(ids))
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex // guards ferr
		ferr error
		sem  = make(chan struct{}, maxFetchInFlight)
	)
	for start := 0; start < len(ids); start += fetchBatch {
		part := ids[start:min(start+fetchBatch, len(ids))]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ops := make([]clientv3.Op, len(part))
			for i, id := range part {
				ops[i] = clientv3.OpGet(r.key(id), clientv3.WithRev(rev))
			}
			resp, err := r.cli.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				mu.Lock()
				if ferr == nil {
					ferr = fmt.Errorf("read tasks at revision %d: %w", rev, err)
				}
				mu.Unlock()
				return
			}
			for i, rr := range resp.Responses {
				if kvs := rr.GetResponseRange().Kvs; len(kvs) > 0 {
					out[start+i] = kvs[0]
				}
			}
		})
	}
	wg.Wait()
	return out, ferr
}

// matches returns the ids that match q at rev, in order: those of the id
// range of the prefix, or, with labels, those present in the range of every
// label (each label range is ordered by id too).
func (r *Registry) matches(q query, rev int64) *intersection {
	var bases []string
	if len(q.labels) == 0 {
		bases = []string{r.keys.indexIDs()}
	}
	for k, v := range q.labels {
		bases = append(bases, r.keys.indexLabel(k, v))
	}
	sort.Strings(bases) // a deterministic order of reads
	m := &intersection{}
	for _, b := range bases {
		m.streams = append(m.streams, &keyStream{cli: r.indexCli, base: b, prefix: q.prefix, after: q.after, rev: rev})
	}
	return m
}

// intersection yields the ids present in every stream, in order: each
// stream seeks to the largest head until they all agree.
// Not safe for concurrent use.
type intersection struct{ streams []*keyStream }

// next returns the next id of the intersection and moves past it; ok is
// false when there is none.
func (m *intersection) next(ctx context.Context) (id string, ok bool, err error) {
	cand, ok, err := m.streams[0].head(ctx)
	if err != nil || !ok {
		return "", false, err
	}
	for agreed := false; !agreed; {
		agreed = true
		for _, s := range m.streams {
			if err := s.seek(ctx, cand); err != nil {
				return "", false, err
			}
			h, ok, err := s.head(ctx)
			if err != nil || !ok {
				return "", false, err
			}
			if h != cand {
				cand, agreed = h, false
				break
			}
		}
	}
	for _, s := range m.streams {
		s.i++
	}
	return cand, true, nil
}

// suspend stops the streams; the next call of next reopens them after id,
// the last id taken.
func (m *intersection) suspend(id string) {
	for _, s := range m.streams {
		s.close()
		s.opened, s.buf, s.i, s.eof, s.after = false, nil, 0, false, id
	}
}

func (m *intersection) close() {
	for _, s := range m.streams {
		s.close()
	}
}

// keyStream reads the keys of one index range (base+prefix...) in order, at
// one revision, through etcd's RangeStream: unlike a Range with a limit,
// which counts every key to the end of its range, a stream costs only the
// keys it sends, so the first page of a million keys costs what the page
// costs. The stream is opened on first use and reopened further on when a
// seek would otherwise read far. Not safe for concurrent use.
type keyStream struct {
	cli    *clientv3.Client
	base   string // the stream's keys are base+id
	prefix string // of the ids
	after  string // ids up to and including it are skipped
	rev    int64
	values bool // read the values too (scanTasks), not only the keys

	opened bool
	cancel context.CancelFunc
	ch     clientv3.GetStreamChan
	buf    []*mvccpb.KeyValue
	i      int  // buf[i] is the head
	eof    bool // no key follows buf
	legacy bool // etcd has no RangeStream (before 3.7): pages of Range
	from   string
}

// legacyPage is the page of a Range read when etcd has no RangeStream.
const legacyPage = 1000

func (s *keyStream) end() string { return clientv3.GetPrefixRangeEnd(s.base + s.prefix) }

func (s *keyStream) readOpts() []clientv3.OpOption {
	opts := []clientv3.OpOption{clientv3.WithRange(s.end()), clientv3.WithRev(s.rev)}
	if !s.values {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	return opts
}

// open starts reading at key from (a full key).
func (s *keyStream) open(ctx context.Context, from string) error {
	s.close()
	s.opened, s.buf, s.i, s.eof, s.from = true, nil, 0, false, from
	if s.legacy {
		return nil
	}
	sctx, cancel := context.WithCancel(ctx)
	ch, err := s.cli.GetStream(sctx, from, s.readOpts()...)
	if err != nil {
		cancel()
		return fmt.Errorf("read index %s: %w", s.base, err)
	}
	s.cancel, s.ch = cancel, ch
	return nil
}

// fill reads the next chunk of keys into buf.
func (s *keyStream) fill(ctx context.Context) error {
	if s.legacy {
		resp, err := s.cli.Get(ctx, s.from, append(s.readOpts(), clientv3.WithLimit(legacyPage))...)
		if err != nil {
			return fmt.Errorf("read index %s: %w", s.base, err)
		}
		s.buf, s.i, s.eof = resp.Kvs, 0, !resp.More
		if len(resp.Kvs) > 0 {
			s.from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
		return nil
	}
	resp, ok := <-s.ch
	if !ok {
		s.buf, s.i, s.eof = nil, 0, true
		return nil
	}
	if err := resp.Err(); err != nil {
		if status.Code(err) == codes.Unimplemented {
			s.legacy = true
			return s.open(ctx, s.from)
		}
		return fmt.Errorf("read index %s: %w", s.base, err)
	}
	s.buf, s.i = resp.Kvs, 0
	if len(resp.Kvs) > 0 {
		s.from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	s.eof = resp.Header != nil // only the last chunk has a header
	return nil
}

// start is where the stream begins: after the cursor, within the prefix.
func (s *keyStream) start() string {
	from := s.base + s.prefix
	if s.after != "" && s.base+s.after+"\x00" > from {
		from = s.base + s.after + "\x00"
	}
	return from
}

// head returns the id at the stream's position; ok is false at the end.
func (s *keyStream) head(ctx context.Context) (id string, ok bool, err error) {
	if !s.opened {
		if err := s.open(ctx, s.start()); err != nil {
			return "", false, err
		}
	}
	for s.i >= len(s.buf) {
		if s.eof {
			return "", false, nil
		}
		if err := s.fill(ctx); err != nil {
			return "", false, err
		}
	}
	return string(s.buf[s.i].Key[len(s.base):]), true, nil
}

// seekReadOn is how many keys a seek passes by reading its stream on
// before it reopens the stream at the target instead. A reopen costs a
// round trip and a linearizable read and starts again at etcd's first
// chunk of 10 keys, about what reading 1000 keys on costs; so a seek never
// pays more than about twice what the better of the two would have.
const seekReadOn = 1024

// seek moves the stream to the first id at or after id. Past the keys it
// holds, it reads the stream on, which etcd has already sent or is
// sending, for up to seekReadOn keys, then reopens the stream at id: two
// labels whose matches lie close in each other's ranges are read through
// once (a reopen at each match made a page of them take seconds at 200 000
// tasks), and a seek over a long gap (a rare label's next match in a
// common label) costs seekReadOn keys and one round trip, not the keys in
// between.
func (s *keyStream) seek(ctx context.Context, id string) error {
	if _, _, err := s.head(ctx); err != nil {
		return err
	}
	key := s.base + id
	passed := 0
	for {
		n := sort.Search(len(s.buf)-s.i, func(k int) bool { return string(s.buf[s.i+k].Key) >= key })
		s.i += n
		passed += n
		if s.i < len(s.buf) || s.eof {
			return nil
		}
		// A legacy page is a Range either way: reading on costs what a
		// reopen at id costs, and may read more keys.
		if passed >= seekReadOn || s.legacy {
			if err := s.open(ctx, key); err != nil {
				return err
			}
			passed = 0
		}
		if err := s.fill(ctx); err != nil {
			return err
		}
	}
}

// close stops the stream and waits for its reader, which sends its last
// error on the channel before closing it.
func (s *keyStream) close() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	for range s.ch {
	}
	s.cancel, s.ch = nil, nil
}

// scanTasks is scan without the index, for a cluster whose index is not
// built yet (BuildIndex is running): it reads every task at rev and
// filters in Go, in time proportional to the fleet. A page keeps the limit+1
// smallest matching ids, so pages are still full and ordered by id; an
// export (limit 0) gives tasks in key order (by partition, then id).
func (r *Registry) scanTasks(ctx context.Context, q query, rev int64, limit int, fn func(kv *mvccpb.KeyValue, id string) error) (more bool, err error) {
	s := &keyStream{cli: r.cli, base: r.keys.tasks(), rev: rev, values: true}
	defer s.close()
	var page []taskKV // sorted by id, at most limit+1
	for {
		_, ok, err := s.head(ctx)
		if err != nil {
			return false, err
		}
		if !ok {
			break
		}
		kv := s.buf[s.i]
		s.i++
		_, id, ok := r.keys.parseTaskKey(string(kv.Key))
		if !ok || !q.has(id) || (len(q.labels) > 0 && !storedHasLabels(kv.Value, q.labels)) {
			continue
		}
		if limit == 0 {
			if err := fn(kv, id); err != nil {
				return false, err
			}
			continue
		}
		if len(page) > limit && id > page[limit].id {
			continue
		}
		at := sort.Search(len(page), func(i int) bool { return page[i].id > id })
		page = append(page[:at], append([]taskKV{{id, kv}}, page[at:]...)...)
		if len(page) > limit+1 {
			page = page[:limit+1]
		}
	}
	for i, e := range page {
		if i == limit {
			return true, nil
		}
		if err := fn(e.kv, e.id); err != nil {
			return false, err
		}
	}
	return false, nil
}

type taskKV struct {
	id string
	kv *mvccpb.KeyValue
}

// has reports whether id is within the query's prefix and after its cursor.
func (q query) has(id string) bool { return strings.HasPrefix(id, q.prefix) && id > q.after }

// GetMany returns the tasks of ids, read at one etcd revision, in the
// order of ids; a task that is not stored is nil. It reads them in
// transactions of many reads, so a page of ids costs a few round trips.
func (r *Registry) GetMany(ctx context.Context, ids []string) ([]*task.Task, error) {
	rev, _, err := r.readRevision(ctx)
	if err != nil {
		return nil, fmt.Errorf("get tasks: %w", err)
	}
	kvs, err := r.fetch(ctx, ids, rev)
	if err != nil {
		return nil, fmt.Errorf("get tasks: %w", err)
	}
	out := make([]*task.Task, len(ids))
	for i, kv := range kvs {
		if kv == nil {
			continue
		}
		if out[i], err = r.decode(kv); err != nil {
			return nil, fmt.Errorf("get tasks: %w", err)
		}
	}
	return out, nil
}
