package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// checkIndex fails the test unless the index holds exactly the keys the
// stored tasks call for: one id key per task, one label key per label.
func checkIndex(t *testing.T, cli *clientv3.Client, reg *Registry) {
	t.Helper()
	ctx := context.Background()
	tasks, err := cli.Get(ctx, reg.keys.tasks(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, kv := range tasks.Kvs {
		_, id, _ := reg.keys.parseTaskKey(string(kv.Key))
		want[reg.keys.indexID(id)] = true
		for k, v := range storedLabels(kv.Value) {
			want[reg.keys.indexLabel(k, v)+id] = true
		}
	}
	idx, err := cli.Get(ctx, reg.keys.index(), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithRev(tasks.Header.Revision))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, kv := range idx.Kvs {
		if k := string(kv.Key); k != reg.keys.indexBuilt() {
			got[k] = true
		}
	}
	for k := range want {
		if !got[k] {
			t.Errorf("index lacks %s", k)
		}
	}
	for k := range got {
		if !want[k] {
			t.Errorf("index holds %s, which no task calls for", k)
		}
	}
}

func labelled(id string, labels map[string]string) *task.Task {
	tsk := noopTask(id, "* * * * *")
	tsk.Labels = labels
	return tsk
}

// TestIndex_FollowsEveryWrite: after a create, a label change, a pause, a
// delete, batches of new, changed and unchanged tasks, and a task that
// changes all of its 64 labels at once (more than one transaction holds),
// the index holds exactly what the tasks call for.
func TestIndex_FollowsEveryWrite(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/ix")
	ctx := context.Background()

	putTask(t, reg, labelled("a/1", map[string]string{"team": "x", "env": "prod", "tier": "1"}))
	checkIndex(t, c.Client, reg)
	putTask(t, reg, labelled("a/1", map[string]string{"team": "y", "env": "prod", "zone": "eu"})) // changed, kept, removed, added
	checkIndex(t, c.Client, reg)
	if _, err := reg.SetPaused(ctx, "a/1", true); err != nil {
		t.Fatal(err)
	}
	checkIndex(t, c.Client, reg)
	putTask(t, reg, labelled("a/2", map[string]string{"team": "y"}))
	if err := reg.Delete(ctx, "a/1"); err != nil {
		t.Fatal(err)
	}
	checkIndex(t, c.Client, reg)

	var batch []*task.Task
	for i := range 300 {
		batch = append(batch, labelled(fmt.Sprintf("b/%03d", i), map[string]string{"n": fmt.Sprint(i % 7), "team": "z"}))
	}
	batch = append(batch, labelled("a/2", map[string]string{"team": "w"}))
	if res, err := reg.PutBatch(ctx, batch); err != nil || len(res.Errors) > 0 || res.Written != len(batch) || res.Unchanged != 0 {
		t.Fatalf("batch: written %d (%d unchanged), errors %v, err %v", res.Written, res.Unchanged, res.Errors, err)
	}
	checkIndex(t, c.Client, reg)
	moved := 0
	for i, tsk := range batch {
		if i%3 == 0 {
			tsk.Labels = map[string]string{"n": "moved"}
			moved++
		}
	}
	if res, err := reg.PutBatch(ctx, batch); err != nil || len(res.Errors) > 0 || res.Written != len(batch) || res.Unchanged != len(batch)-moved {
		t.Fatalf("second batch: written %d (%d unchanged), errors %v, err %v; want %d unchanged", res.Written, res.Unchanged, res.Errors, err, len(batch)-moved)
	}
	checkIndex(t, c.Client, reg)

	many := func(v string) map[string]string {
		l := map[string]string{}
		for i := range task.MaxLabels {
			l[fmt.Sprintf("k%02d", i)] = v + fmt.Sprint(i)
		}
		return l
	}
	wide := putTask(t, reg, labelled("wide", many("a")))
	// 1 put, 64 deletes, 64 puts: two transactions, one write
	if _, err := reg.Put(ctx, labelled("wide", many("b")), PutOptions{IfVersion: wide.Version}); err != nil {
		t.Fatalf("a change of all 64 labels at the stored version: %v", err)
	}
	checkIndex(t, c.Client, reg)
	if res, err := reg.PutBatch(ctx, []*task.Task{labelled("wide", many("c")), labelled("b/000", nil)}); err != nil || len(res.Errors) > 0 || res.Written != 2 || res.Unchanged != 0 {
		t.Fatalf("batch with a wide task: written %d (%d unchanged), errors %v, err %v", res.Written, res.Unchanged, res.Errors, err)
	}
	checkIndex(t, c.Client, reg)

	// Bulk actions: a pause keeps the labels, a delete takes the index keys.
	if _, err := reg.BulkPause(ctx, task.Selector{Labels: map[string]string{"team": "z"}}, "test"); err != nil {
		t.Fatal(err)
	}
	checkIndex(t, c.Client, reg)
	if res, err := reg.Bulk(ctx, task.BulkDelete, task.Selector{Prefix: "b/"}); err != nil || res.Changed != 300 {
		t.Fatalf("bulk delete: %+v, %v", res, err)
	}
	checkIndex(t, c.Client, reg)
}

// listAll pages through List with opts and returns the ids in order,
// failing on a page that is not full but for the last, or ids out of order.
func listAll(t *testing.T, reg *Registry, opts ListOptions, between func(page int)) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for page := 0; ; page++ {
		if page > 10000 {
			t.Fatal("the cursor never ends")
		}
		if between != nil {
			between(page)
		}
		tasks, next, err := reg.List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		limit := opts.Limit
		if limit == 0 {
			limit = DefaultListLimit
		}
		if next != "" && len(tasks) != limit {
			t.Fatalf("page %d: %d tasks and a next cursor, want full pages of %d", page, len(tasks), limit)
		}
		for _, tsk := range tasks {
			if len(ids) > 0 && tsk.ID <= ids[len(ids)-1] {
				t.Fatalf("page %d: %q after %q: not in id order, or twice", page, tsk.ID, ids[len(ids)-1])
			}
			if !strings.HasPrefix(tsk.ID, opts.Prefix) || !hasLabels(tsk.Labels, opts.Labels) {
				t.Fatalf("page %d: %s %v does not match %+v", page, tsk.ID, tsk.Labels, opts)
			}
			ids = append(ids, tsk.ID)
		}
		if next == "" {
			return ids
		}
		if next != tasks[len(tasks)-1].ID {
			t.Fatalf("next cursor %q, want the page's last id %q", next, tasks[len(tasks)-1].ID)
		}
		opts.Cursor = next
	}
}

// TestList_FullPagesStableUnderWrites: while another writer creates and
// deletes tasks around them, paging by prefix and by label returns every
// task that exists throughout exactly once, in id order, in full pages.
func TestList_FullPagesStableUnderWrites(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/stable")
	ctx := context.Background()
	var stable []*task.Task
	for i := range 400 {
		stable = append(stable, labelled(fmt.Sprintf("job/%04d", 2*i), map[string]string{"team": "pay", "even": fmt.Sprint(i%2 == 0)}))
	}
	if _, err := reg.PutBatch(ctx, stable); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("job/%04d", 2*rng.IntN(400)+1) // odd: never a stable one
			if rng.IntN(2) == 0 {
				_, _ = reg.Put(ctx, labelled(id, map[string]string{"team": "pay", "even": "true"}), PutOptions{})
			} else {
				_ = reg.Delete(ctx, id)
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()

	for _, opts := range []ListOptions{
		{Prefix: "job/", Limit: 7},
		{Labels: map[string]string{"team": "pay"}, Limit: 13},
		{Prefix: "job/0", Labels: map[string]string{"team": "pay", "even": "true"}, Limit: 5},
	} {
		got := listAll(t, reg, opts, nil)
		seen := map[string]bool{}
		for _, id := range got {
			seen[id] = true
		}
		for _, tsk := range stable {
			if strings.HasPrefix(tsk.ID, opts.Prefix) && hasLabels(tsk.Labels, opts.Labels) && !seen[tsk.ID] {
				t.Errorf("%+v: stable task %s missing", opts, tsk.ID)
			}
		}
	}
}

// TestList_PrefixesAndLabelsWithDelimiters: a prefix is bytes ('/' is no
// separator), and labels whose keys hold '/' and values hold '=' or '/' do
// not share index ranges: with label keys and values unescaped, {a: "b/c"}
// of task "x" and {a: "b"} of task "c/x" would be one index key, and
// deleting "c/x" would lose "x".
func TestList_PrefixesAndLabelsWithDelimiters(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/delim")
	ctx := context.Background()
	for _, id := range []string{"a/b", "a/b/", "a/b/c", "a/b/c/d", "a/bc", "a%2Fb", "ab", "a"} {
		putTask(t, reg, noopTask(id, "* * * * *"))
	}
	for prefix, want := range map[string][]string{
		"a/b/": {"a/b/", "a/b/c", "a/b/c/d"},
		"a/b":  {"a/b", "a/b/", "a/b/c", "a/b/c/d", "a/bc"},
		"a/":   {"a/b", "a/b/", "a/b/c", "a/b/c/d", "a/bc"},
		"a%":   {"a%2Fb"},
		"":     {"a", "a%2Fb", "a/b", "a/b/", "a/b/c", "a/b/c/d", "a/bc", "ab"},
	} {
		for _, limit := range []int{1, 2, 100} {
			if got := listAll(t, reg, ListOptions{Prefix: prefix, Limit: limit}, nil); !slices.Equal(got, want) {
				t.Errorf("prefix %q limit %d: %v, want %v", prefix, limit, got, want)
			}
		}
	}

	putTask(t, reg, labelled("x", map[string]string{"a": "b/c", "k/1": "v=w"}))
	putTask(t, reg, labelled("c/x", map[string]string{"a": "b", "k": "1=v=w"}))
	checkIndex(t, c.Client, reg)
	if err := reg.Delete(ctx, "c/x"); err != nil {
		t.Fatal(err)
	}
	for _, l := range []map[string]string{{"a": "b/c"}, {"k/1": "v=w"}, {"a": "b/c", "k/1": "v=w"}} {
		if got := listAll(t, reg, ListOptions{Labels: l}, nil); !slices.Equal(got, []string{"x"}) {
			t.Errorf("labels %v: %v, want [x]", l, got)
		}
	}
	checkIndex(t, c.Client, reg)
}

// TestList_SeveralLabels: labels are ANDed. The intersection of three
// labels is sparse (one task in 105), so the streams seek over long gaps.
func TestList_SeveralLabels(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/and")
	ctx := context.Background()
	var all []*task.Task
	for i := range 2100 {
		all = append(all, labelled(fmt.Sprintf("t%05d", i), map[string]string{
			"m3": fmt.Sprint(i % 3), "m5": fmt.Sprint(i % 5), "m7": fmt.Sprint(i % 7)}))
	}
	if _, err := reg.PutBatch(ctx, all); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		labels map[string]string
		prefix string
	}{
		{map[string]string{"m3": "0", "m5": "0", "m7": "0"}, ""},
		{map[string]string{"m3": "1", "m7": "6"}, "t01"},
		{map[string]string{"m5": "4"}, ""},
		{map[string]string{"m5": "4", "m7": "nope"}, ""},
	} {
		var want []string
		for _, tsk := range all {
			if strings.HasPrefix(tsk.ID, tt.prefix) && hasLabels(tsk.Labels, tt.labels) {
				want = append(want, tsk.ID)
			}
		}
		for _, limit := range []int{4, 1000} {
			got := listAll(t, reg, ListOptions{Prefix: tt.prefix, Labels: tt.labels, Limit: limit}, nil)
			if !slices.Equal(got, want) {
				t.Errorf("labels %v prefix %q limit %d: %d ids %v, want %d", tt.labels, tt.prefix, limit, len(got), got, len(want))
			}
		}
	}
}

// TestExport_OneRevision: tasks written, changed and deleted while an
// export runs change nothing in it: it gives the tasks as they were when it
// began, in id order, as stored.
func TestExport_OneRevision(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/export")
	ctx := context.Background()
	var all []*task.Task
	for i := range 1500 {
		all = append(all, labelled(fmt.Sprintf("e/%04d", i), map[string]string{"team": fmt.Sprint(i % 2)}))
	}
	if _, err := reg.PutBatch(ctx, all); err != nil {
		t.Fatal(err)
	}
	before, err := c.Client.Get(ctx, reg.keys.tasks(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	// A whole export is in key order (partition, then id), as read.
	var want []string
	for _, kv := range before.Kvs {
		want = append(want, string(kv.Value))
	}
	var got []string
	first := true
	n, _, err := reg.Export(ctx, task.Selector{}, func(tsk []byte) error {
		if first {
			first = false
			var churn []*task.Task
			for i := range 200 {
				churn = append(churn, labelled(fmt.Sprintf("e/%04d", 7*i), map[string]string{"team": "changed"}))
				churn = append(churn, labelled(fmt.Sprintf("e/new/%04d", i), nil))
			}
			if _, err := reg.PutBatch(ctx, churn); err != nil {
				return err
			}
			for i := range 100 {
				if err := reg.Delete(ctx, fmt.Sprintf("e/%04d", 11*i+1)); err != nil {
					return err
				}
			}
		}
		got = append(got, string(tsk))
		return nil
	})
	if err != nil || n != len(all) || len(got) != len(all) {
		t.Fatalf("export: %d tasks (%d given), %v; want %d", n, len(got), err, len(all))
	}
	for i, line := range got {
		if line != want[i] {
			t.Fatalf("export line %d: %s\nwant the task as stored before, in key order: %s", i, line, want[i])
		}
	}

	// A selection by label and prefix, read back by the batch path, is
	// the same tasks.
	var sel []*task.Task
	if _, _, err := reg.Export(ctx, task.Selector{Prefix: "e/00", Labels: map[string]string{"team": "changed"}}, func(b []byte) error {
		tsk, err := task.DecodeTask(b)
		sel = append(sel, tsk)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(sel) != 14 { // e/0000 ... e/0098 by 7, but e/0056, deleted
		t.Errorf("selection: %d tasks, want 14", len(sel))
	}
	if !slices.IsSortedFunc(sel, func(a, b *task.Task) int { return strings.Compare(a.ID, b.ID) }) {
		t.Errorf("a selection by prefix and label is not in id order")
	}
	rev := revision(t, c.Client)
	if res, err := reg.PutBatch(ctx, sel); err != nil || len(res.Errors) > 0 || res.Written != len(sel) || revision(t, c.Client) != rev {
		t.Errorf("re-import of an export: written %d, errors %v, err %v; revision moved: %v", res.Written, res.Errors, err, revision(t, c.Client) != rev)
	}
}

// TestBuildIndex_OfAnOlderCluster: tasks written without the index (as
// nodes before it did) are listed by scanning until BuildIndex has run,
// while writes go on; then the index holds exactly what they call for.
func TestBuildIndex_OfAnOlderCluster(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	old := openRegistry(t, c.Client, "/old")
	old.noIndex = true
	if _, err := c.Client.Delete(ctx, old.keys.index(), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	var all []*task.Task
	for i := range 700 {
		all = append(all, labelled(fmt.Sprintf("o/%04d", i), map[string]string{"team": fmt.Sprint(i % 3)}))
	}
	if _, err := old.PutBatch(ctx, all); err != nil {
		t.Fatal(err)
	}

	reg := openRegistry(t, c.Client, "/old")
	if built, err := reg.IndexBuilt(ctx); err != nil || built {
		t.Fatalf("IndexBuilt before the build: %v, %v", built, err)
	}
	want := func(team string) []string {
		var ids []string
		for _, tsk := range all {
			if tsk.Labels["team"] == team {
				ids = append(ids, tsk.ID)
			}
		}
		return ids
	}
	if got := listAll(t, reg, ListOptions{Labels: map[string]string{"team": "1"}, Limit: 9}, nil); !slices.Equal(got, want("1")) {
		t.Errorf("before the build: %v, want %v", got, want("1"))
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; i < 700; i += 5 {
			if i%10 == 0 {
				_ = reg.Delete(ctx, fmt.Sprintf("o/%04d", i))
			} else {
				_, _ = reg.Put(ctx, labelled(fmt.Sprintf("o/%04d", i), map[string]string{"team": "moved"}), PutOptions{})
			}
		}
	})
	n, err := reg.BuildIndex(ctx)
	wg.Wait()
	if err != nil || n == 0 {
		t.Fatalf("BuildIndex: %d, %v", n, err)
	}
	checkIndex(t, c.Client, reg)
	if built, err := reg.IndexBuilt(ctx); err != nil || !built {
		t.Fatalf("IndexBuilt after the build: %v, %v", built, err)
	}
	var moved []string
	for i := 5; i < 700; i += 10 {
		moved = append(moved, fmt.Sprintf("o/%04d", i))
	}
	if got := listAll(t, reg, ListOptions{Labels: map[string]string{"team": "moved"}, Limit: 9}, nil); !slices.Equal(got, moved) {
		t.Errorf("after the build: %v, want %v", got, moved)
	}
	if n, err := reg.BuildIndex(ctx); err != nil || n != 0 {
		t.Errorf("a second BuildIndex: %d, %v; want nothing done", n, err)
	}
}

// TestList_PageSkipsStaleIndexKeys: index keys whose task no longer
// matches take a page's room in the first read of ids; the page then reads
// on after them (not from its start) and is still full.
func TestList_PageSkipsStaleIndexKeys(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/stale")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tasks := []*task.Task{labelled("s/1", nil), labelled("s/2", nil)}
	for _, id := range []string{"s/3", "s/4", "s/5"} {
		tasks = append(tasks, labelled(id, map[string]string{"team": "x"}))
	}
	if res, err := reg.PutBatch(ctx, tasks); err != nil || len(res.Errors) > 0 {
		t.Fatal(err, res.Errors)
	}
	for _, id := range []string{"s/1", "s/2"} { // as an older writer would leave them
		if _, err := c.Client.Put(ctx, reg.keys.indexLabel("team", "x")+id, ""); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	opts := ListOptions{Labels: map[string]string{"team": "x"}, Limit: 2}
	for pages := 0; ; pages++ {
		page, next, err := reg.List(ctx, opts)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		if next != "" && len(page) != 2 {
			t.Errorf("page %d holds %d tasks before the end, want 2", pages, len(page))
		}
		for _, tsk := range page {
			got = append(got, tsk.ID)
		}
		if next == "" {
			break
		}
		opts.Cursor = next
	}
	if want := []string{"s/3", "s/4", "s/5"}; !slices.Equal(got, want) {
		t.Errorf("pages gave %v, want %v", got, want)
	}
}

// countingConn counts the bytes read from a connection.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestRegistry_PageReadsIdsThroughIndexClient: with WithIndexClient, a
// page reads its ids through the index client and its tasks through the
// main one: of 20 000 ids (about 800 KB) and their tasks, a page of 1000
// brings the index client some bytes, and less than 256 KiB.
func TestRegistry_PageReadsIdsThroughIndexClient(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := context.Background()
	var read atomic.Int64
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		return countingConn{conn, &read}, err
	}
	icli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second,
		DialOptions: append(IndexDialOptions(), grpc.WithContextDialer(dial))})
	if err != nil {
		t.Fatal(err)
	}
	defer icli.Close()
	reg, err := OpenRegistry(ctx, c.Client, "/p", 64, WithIndexClient(icli))
	if err != nil {
		t.Fatal(err)
	}
	const n = 20_000
	for lo := 0; lo < n; lo += MaxBatchItems {
		batch := make([]*task.Task, 0, MaxBatchItems)
		for i := lo; i < lo+MaxBatchItems; i++ {
			batch = append(batch, noopTask(fmt.Sprintf("job-%07d", i), "@yearly"))
		}
		if res, err := reg.PutBatch(ctx, batch); err != nil || len(res.Errors) > 0 {
			t.Fatal(err, res.Errors)
		}
	}
	for _, cursor := range []string{"", "job-0005000"} {
		before := read.Load()
		tasks, next, err := reg.List(ctx, ListOptions{Cursor: cursor, Limit: 1000})
		if err != nil || len(tasks) != 1000 || next != tasks[999].ID {
			t.Fatalf("page after %q: %d tasks, next %q, %v", cursor, len(tasks), next, err)
		}
		if got := read.Load() - before; got == 0 || got > 256<<10 {
			t.Errorf("page after %q: the index client read %d bytes, want some and at most 256 KiB", cursor, got)
		}
	}
}

// A task whose stored value was written over by hand with something that
// is not a JSON object is an error wherever it is read: a query by label
// left it out unsaid (its labels did not decode, so it "did not match"),
// and an export wrote the garbage as a line an import then refused.
func TestList_CorruptStoredTaskIsAnError(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/corrupt")
	for _, id := range []string{"a/1", "a/2"} {
		tsk := noopTask(id, "@yearly")
		tsk.Labels = map[string]string{"team": "x"}
		if _, err := reg.Put(ctx, tsk, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Client.Put(ctx, reg.key("a/1"), "not json at all"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := reg.List(ctx, ListOptions{Labels: map[string]string{"team": "x"}, Limit: 10}); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("list by label: %v, want the error of a corrupt stored task", err)
	}
	for _, sel := range []task.Selector{{}, {Labels: map[string]string{"team": "x"}}, {Prefix: "a/"}} {
		if _, _, err := reg.Export(ctx, sel, func([]byte) error { return nil }); err == nil || !strings.Contains(err.Error(), "corrupt") {
			t.Errorf("export of %+v: %v, want the error of a corrupt stored task", sel, err)
		}
	}

	// An export tells a JSON object by its ends alone: either one missing
	// is corrupt; "{}" is an object.
	for _, v := range []string{"x}", "{x", "{", "{}"} {
		if _, err := c.Client.Put(ctx, reg.key("a/1"), v); err != nil {
			t.Fatal(err)
		}
		n, _, err := reg.Export(ctx, task.Selector{}, func([]byte) error { return nil })
		if corrupt := err != nil && strings.Contains(err.Error(), "corrupt"); corrupt != (v != "{}") {
			t.Errorf("export over the stored value %s: %d tasks, %v", v, n, err)
		}
	}

	// JSON whose labels are not strings does not have them: no match.
	if _, err := c.Client.Delete(ctx, reg.key("a/1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.Put(ctx, reg.key("a/2"), `{"id":"a/2","schedule":"@yearly","executor":{"type":"noop"},"labels":{"team":5}}`); err != nil {
		t.Fatal(err)
	}
	if got, _, err := reg.List(ctx, ListOptions{Labels: map[string]string{"team": "x"}, Limit: 10}); err != nil || len(got) != 0 {
		t.Errorf("list by label over labels that are not strings: %d tasks, %v; want none", len(got), err)
	}
}

// TestList_SeveralLabelsReadOnInsteadOfReopening: two labels whose matches
// lie a few keys apart in each other's ranges (every task of the rare label
// carries the common one) are intersected by reading the common label's
// stream on, not by a new RangeStream at every match: at 200 000 tasks a
// page of such a query opened one stream per match and took seconds where
// one label took milliseconds. The test counts the RangeStream calls of the
// index client.
func TestList_SeveralLabelsReadOnInsteadOfReopening(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := context.Background()
	var streams atomic.Int64
	count := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if strings.HasSuffix(method, "/RangeStream") {
			streams.Add(1)
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
	icli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second,
		DialOptions: append(IndexDialOptions(), grpc.WithStreamInterceptor(count))})
	if err != nil {
		t.Fatal(err)
	}
	defer icli.Close()
	reg, err := OpenRegistry(ctx, c.Client, "/readon", 16, WithIndexClient(icli))
	if err != nil {
		t.Fatal(err)
	}
	const n = 8000
	var want []string
	for lo := 0; lo < n; lo += MaxBatchItems {
		var batch []*task.Task
		for i := lo; i < lo+MaxBatchItems && i < n; i++ {
			id := fmt.Sprintf("job-%05d", i)
			labels := map[string]string{"team": fmt.Sprint(i % 4), "shard": fmt.Sprint(i % 40)}
			if labels["team"] == "3" && labels["shard"] == "7" {
				want = append(want, id)
			}
			batch = append(batch, labelled(id, labels))
		}
		if res, err := reg.PutBatch(ctx, batch); err != nil || len(res.Errors) > 0 {
			t.Fatal(err, res.Errors)
		}
	}
	before := streams.Load()
	got := listAll(t, reg, ListOptions{Labels: map[string]string{"team": "3", "shard": "7"}, Limit: 1000}, nil)
	if !slices.Equal(got, want) {
		t.Fatalf("got %d ids, want %d", len(got), len(want))
	}
	// Two streams, and a few reopens at most: not one per match.
	opened := streams.Load() - before
	t.Logf("%d matches, %d index streams opened", len(want), opened)
	if opened > 10 {
		t.Errorf("a page of %d matches of two labels opened %d index streams, want at most 10", len(want), opened)
	}
}

// TestList_LastPageEndsBeforeStaleIndexKeys: an index key whose task does
// not match (a write cut off between the transactions of a task with many
// labels leaves such keys, and so did older writers) right after a full
// page is no match: the page is the last one, with no next cursor, rather
// than pointing to an empty page.
func TestList_LastPageEndsBeforeStaleIndexKeys(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/tail")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var tasks []*task.Task
	for _, id := range []string{"s/1", "s/2"} {
		tasks = append(tasks, labelled(id, map[string]string{"team": "x"}))
	}
	tasks = append(tasks, labelled("s/3", nil))
	if res, err := reg.PutBatch(ctx, tasks); err != nil || len(res.Errors) > 0 {
		t.Fatal(err, res.Errors)
	}
	// A label key of s/3, which has no labels, and an id key of s/4,
	// which does not exist.
	for _, key := range []string{reg.keys.indexLabel("team", "x") + "s/3", reg.keys.indexID("s/4")} {
		if _, err := c.Client.Put(ctx, key, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, opts := range []ListOptions{
		{Labels: map[string]string{"team": "x"}, Limit: 2},
		{Prefix: "s/", Limit: 3},
		{Limit: 3},
	} {
		page, next, err := reg.List(ctx, opts)
		if err != nil {
			t.Fatalf("%+v: %v", opts, err)
		}
		if len(page) != opts.Limit || next != "" {
			t.Errorf("%+v: %d tasks, next cursor %q; want %d tasks and no next page (no match remains)", opts, len(page), next, opts.Limit)
		}
	}
}

// TestExport_RoundTripsIntoAnotherCluster: an export read back by the
// batch path (what 'shardcron import' sends) into a cluster that does not
// hold the tasks stores them as exported, field for field, created_at,
// paused and a paused task's pause record (who paused it, when and why)
// included, and indexes them; only updated_at, the import's time,
// differs. The pause record was lost: DecodeTask ignored it. Read back
// into the cluster it came from, the export resumes a task paused since,
// its pause record gone, and keeps the record of one paused then.
func TestExport_RoundTripsIntoAnotherCluster(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	src := openRegistry(t, c.Client, "/from")
	bodies := []string{
		`{"id":"r/1","schedule":"*/5 * * * * *","timezone":"Europe/Paris","executor":{"type":"http","url":"http://127.0.0.1:9/h","method":"PUT",` +
			`"headers":{"X-A":"b"},"body":"{\"k\":\"<&>\"}"},"timeout":"7s","retry":{"max_attempts":3,"backoff":"2s","max_backoff":"9s"},` +
			`"misfire":"fire_all","catchup_window":"3m","concurrency":"forbid","jitter":"1s","labels":{"team":"pay","k/1":"a=b/c%"},` +
			`"history_limit":{"successes":3,"failures":4},"notify":{"on":["failure","misfire"],"url":"http://127.0.0.1:9/n","headers":{"A":"b"}},` +
			`"pause_on_failure":2,"capture":{"max_bytes":100,"on":"always"},"not_before":"2020-01-01T00:00:00Z","not_after":"2099-01-01T00:00:00+02:00",` +
			`"max_fires":1000,"created_at":"2021-02-03T04:05:06.789Z"}`,
		`{"id":"r/2","schedule":"@every 1h","executor":{"type":"handler","name":"h","payload":{"x":[1,"y",null]}},"on_success":["r/1"],"on_failure":["r/1"],` +
			`"max_fires":3,"delete_after_fire":true,"paused":true,"created_at":"2022-01-01T00:00:00Z","labels":{"team":"pay"}}`,
		`{"id":"r/3","schedule":"0 0 1 1 *","executor":{"type":"exec","command":["/bin/true","a b"],"env":{"K":"v"}}}`,
	}
	for _, b := range bodies {
		tsk, err := task.DecodeTask([]byte(b))
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		putTask(t, src, tsk)
	}
	if _, err := src.Pause(ctx, "r/3", task.Pause{Note: "why", By: "me"}); err != nil {
		t.Fatal(err)
	}
	export := func(reg *Registry) map[string]map[string]any {
		t.Helper()
		out := map[string]map[string]any{}
		if _, _, err := reg.Export(ctx, task.Selector{}, func(b []byte) error {
			var v map[string]any
			if err := json.Unmarshal(b, &v); err != nil {
				return err
			}
			out[v["id"].(string)] = v
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	before := export(src)
	var lines []*task.Task
	if _, _, err := src.Export(ctx, task.Selector{}, func(b []byte) error {
		tsk, err := task.DecodeTask(b)
		lines = append(lines, tsk)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	dst := openRegistry(t, c.Client, "/to")
	if res, err := dst.PutBatch(ctx, lines); err != nil || len(res.Errors) > 0 || res.Written != len(bodies) {
		t.Fatalf("import: %+v, %v", res, err)
	}
	after := export(dst)
	if len(after) != len(before) {
		t.Fatalf("%d tasks imported, %d exported", len(after), len(before))
	}
	for id, want := range before {
		got := after[id]
		if (want["pause"] != nil) != (id == "r/3") {
			t.Errorf("%s: pause record %v exported; want one of r/3's only", id, want["pause"])
		}
		for _, v := range []map[string]any{want, got} {
			delete(v, "updated_at")
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s imported as\n%v\nexported as\n%v", id, got, want)
		}
	}
	checkIndex(t, c.Client, dst)
	if got := listAll(t, dst, ListOptions{Labels: map[string]string{"team": "pay"}, Limit: 1}, nil); !slices.Equal(got, []string{"r/1", "r/2"}) {
		t.Errorf("imported tasks by label: %v", got)
	}

	if _, err := src.Pause(ctx, "r/1", task.Pause{Note: "since", By: "me"}); err != nil {
		t.Fatal(err)
	}
	if res, err := src.PutBatch(ctx, lines); err != nil || len(res.Errors) > 0 {
		t.Fatalf("import back: %+v, %v", res, err)
	}
	r1, err := src.Get(ctx, "r/1")
	if err != nil {
		t.Fatal(err)
	}
	if r1.Paused || r1.Pause != nil {
		t.Errorf("r/1, paused since the export, imported back: paused %t, record %+v; want resumed, no record", r1.Paused, r1.Pause)
	}
	if again := export(src)["r/3"]; !reflect.DeepEqual(again["pause"], before["r/3"]["pause"]) {
		t.Errorf("r/3 imported back with pause record %v, want the exported %v", again["pause"], before["r/3"]["pause"])
	}
}

// oldEtcdStream is a RangeStream as an etcd before 3.7 answers it: the
// method is unknown.
type oldEtcdStream struct{ ctx context.Context }

func (oldEtcdStream) Header() (metadata.MD, error) { return nil, nil }
func (oldEtcdStream) Trailer() metadata.MD         { return nil }
func (oldEtcdStream) CloseSend() error             { return nil }
func (s oldEtcdStream) Context() context.Context   { return s.ctx }
func (oldEtcdStream) SendMsg(any) error            { return nil }
func (oldEtcdStream) RecvMsg(any) error {
	return status.Error(codes.Unimplemented, "unknown method RangeStream for service etcdserverpb.KV")
}

// With an etcd that has no RangeStream (before 3.7), queries fall back to
// paged Range reads (docs/design.md): the same pages as with it, for
// lists and exports by prefix and labels, over more keys than a Range
// page reads.
func TestList_WithoutRangeStreamFallsBackToRange(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	noStream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if strings.HasSuffix(method, "/RangeStream") {
			return oldEtcdStream{ctx}, nil
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
	old, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithStreamInterceptor(noStream)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = old.Close() })
	reg, legacy := openRegistry(t, c.Client, "/old"), openRegistry(t, old, "/old")
	var batch []*task.Task
	for i := range 2500 {
		batch = append(batch, labelled(fmt.Sprintf("t/%04d", i), map[string]string{"team": fmt.Sprint(i % 3), "env": fmt.Sprint(i % 2)}))
	}
	if res, err := reg.PutBatch(ctx, batch); err != nil || res.Written != len(batch) {
		t.Fatalf("batch: written %d, %v", res.Written, err)
	}
	for _, opts := range []ListOptions{
		{Limit: MaxListLimit},
		{Limit: 700},
		{Prefix: "t/1", Limit: 300},
		{Labels: map[string]string{"team": "1"}, Limit: 700},
		{Prefix: "t/2", Labels: map[string]string{"team": "1", "env": "0"}, Limit: 50},
		{Labels: map[string]string{"team": "none"}},
	} {
		got, want := listAll(t, legacy, opts, nil), listAll(t, reg, opts, nil)
		if len(want) == 0 && len(opts.Labels) == 0 {
			t.Fatalf("%+v: nothing listed", opts)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%+v: listed %d tasks without RangeStream, %d with it", opts, len(got), len(want))
		}
		sel := task.Selector{Prefix: opts.Prefix, Labels: opts.Labels}
		if n, _, err := legacy.Export(ctx, sel, func([]byte) error { return nil }); err != nil || n != len(want) {
			t.Errorf("export of %+v without RangeStream: %d tasks, %v; want %d", sel, n, err, len(want))
		}
	}
}

// A read of tasks that etcd fails is an error, for GetMany and for a
// List page, not tasks left out as if they were not stored.
func TestGetMany_AFailedReadIsAnError(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	var failing atomic.Pointer[string]
	reg := openRegistry(t, failingClient(t, c, &failing), "/failed")
	putTask(t, reg, noopTask("f/1", "@yearly"))
	failing.Store(new("/Txn"))
	if got, err := reg.GetMany(ctx, []string{"f/1"}); err == nil {
		t.Errorf("GetMany with its read failed: %v, no error", got)
	}
	if got, _, err := reg.List(ctx, ListOptions{Prefix: "f/"}); err == nil {
		t.Errorf("a List page with its read failed: %d tasks, no error", len(got))
	}
}

// TestGetMany_BoundsTransactionsInFlight: the tasks of a list by status
// (up to 10 001 ids from each node, merged) are read in transactions of
// 128 reads, at most as many at once as a page of the index sends: not
// one transaction per 128 ids all at once, a burst of hundreds on etcd
// for one request.
func TestGetMany_BoundsTransactionsInFlight(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	var inFlight, most atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/Txn") {
			n := inFlight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			defer inFlight.Add(-1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli := interceptedClient(t, c, count)
	reg := openRegistry(t, cli, "/many")
	ids := make([]string, 6000)
	for i := range ids {
		ids[i] = fmt.Sprintf("m/%05d", i)
	}
	putTask(t, reg, noopTask(ids[4321], "@yearly"))
	most.Store(0)
	got, err := reg.GetMany(ctx, ids)
	if err != nil || len(got) != len(ids) || got[4321] == nil || got[4321].ID != ids[4321] || got[0] != nil {
		t.Fatalf("GetMany: %d tasks, %v", len(got), err)
	}
	if m := most.Load(); m > maxFetchInFlight {
		t.Errorf("%d transactions in flight at once, want at most %d", m, maxFetchInFlight)
	}
}

// TestList_MarkerDeletedScansAgain: deleting the index marker (as after
// nodes of an older version wrote tasks without indexing them) sends the
// lists of a running node back to scanning every task at once, not only
// after a restart, until the index is built again.
func TestList_MarkerDeletedScansAgain(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/m")
	putTask(t, reg, labelled("i/1", nil))
	if got := listAll(t, reg, ListOptions{Prefix: "i/", Limit: 10}, nil); !slices.Equal(got, []string{"i/1"}) {
		t.Fatalf("through the index: %v", got)
	}
	old := openRegistry(t, c.Client, "/m")
	old.noIndex = true
	putTask(t, old, labelled("u/1", nil))
	if _, err := c.Client.Delete(ctx, reg.keys.indexBuilt()); err != nil {
		t.Fatal(err)
	}
	if built, err := reg.IndexBuilt(ctx); err != nil || built {
		t.Errorf("IndexBuilt with the marker deleted: %v, %v", built, err)
	}
	if got := listAll(t, reg, ListOptions{Prefix: "u/", Limit: 10}, nil); !slices.Equal(got, []string{"u/1"}) {
		t.Errorf("with the marker deleted: %v, want the unindexed task", got)
	}
	if n, err := reg.BuildIndex(ctx); err != nil || n == 0 {
		t.Fatalf("BuildIndex: %d, %v", n, err)
	}
	checkIndex(t, c.Client, reg)
}
