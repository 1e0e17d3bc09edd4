package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/logbuf"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

// TestShape_LoadsAsTheTaskJSON changes each field of a task in turn and
// checks that a task cached as its shape loads as its JSON does: the same
// profile, schedule and pause, whichever tasks the node cached before it.
// A field that a fire uses and that encodeShape or appendShapeKey leaves out
// fails here. Tasks differing only in fields a fire does not use share a
// shape; a task whose fires depend on its times stays JSON.
func TestShape_LoadsAsTheTaskJSON(t *testing.T) {
	hc, err := executor.NewClient(executor.DefaultClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	newEngine := func() *Engine {
		return &Engine{cfg: DefaultConfig("shape").withDefaults(), scheds: schedule.NewTable(), execs: &executors{shared: executor.Shared{HTTP: hc}}}
	}
	base := task.Task{ID: "t", Schedule: "H/5 * * * * *", Executor: task.Executor{Type: task.ExecutorNoop}}
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	base.CreatedAt, base.UpdatedAt = now, now
	stored := func(tk *task.Task, id string) []byte {
		c := *tk
		c.ID = id
		v, err := json.Marshal(&c)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// cached returns the cache values of tasks (each the JSON of a task
	// and its id), cached one after the other by a new node.
	cached := func(tasks ...[]byte) [][]byte {
		t.Helper()
		d := newEngine().decoder()
		var out [][]byte
		for i, v := range tasks {
			_, c, err := d.decode(fmt.Sprint("t", i), v)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			out = append(out, c)
		}
		return out
	}
	baseShape := cached(stored(&base, "a"), stored(&base, "b"))
	if baseShape[0][0] == shapeMark || baseShape[1][0] != shapeMark {
		t.Fatalf("two tasks of a shape are cached as %.30q and %.30q, want the first as JSON, the second as the shape", baseShape[0], baseShape[1])
	}
	type change struct {
		path string
		fn   func(*task.Task)
	}
	changes := []change{ // valid values the walk's cannot give
		{"schedule", func(tk *task.Task) { tk.Schedule = "*/7 * * * * *" }},
		{"timezone", func(tk *task.Task) { tk.Timezone = "Europe/Paris" }},
	}
	for f := range reflect.TypeFor[task.Task]().Fields() {
		name := jsonName(f)
		if slices.Contains(notFired, name) && f.Type.Kind() == reflect.Pointer {
			continue // output-only: partition, state, pause
		}
		eachLeaf(t, reflect.ValueOf(&base).Elem().FieldByIndex(f.Index), name, func(path string, fn func(*task.Task)) {
			changes = append(changes, change{path, fn})
		})
	}
	windowed := []string{"not_before", "not_after", "max_fires", "delete_after_fire"}
	n := 0
	for _, ch := range changes {
		mut := clone(t, &base)
		ch.fn(mut)
		if _, err := newEngine().decoder().def(mut.ID, stored(mut, "x")); err != nil {
			continue // a change the task cannot take: the shape is never made
		}
		n++
		field, _, _ := strings.Cut(ch.path, ".")
		// Tasks of the two kinds, interleaved on one node.
		vals := []*task.Task{&base, mut, &base, mut, mut}
		var in [][]byte
		for i, tk := range vals {
			in = append(in, stored(tk, fmt.Sprint("t", i)))
		}
		out := cached(in...)
		switch {
		case slices.Contains(windowed, field):
			if out[4][0] == shapeMark {
				t.Errorf("%s: a task with a window is cached as a shape", ch.path)
			}
			continue
		case slices.Contains(notFired, field):
			if !bytes.Equal(out[4], baseShape[1]) {
				t.Errorf("%s: tasks differing in a field a fire does not use have different shapes", ch.path)
			}
			continue
		case bytes.Equal(out[4], baseShape[1]):
			t.Errorf("%s: tasks differing in a fired field share a shape", ch.path)
		}
		// Loaded by a restart: the first task of a shape decodes its
		// JSON, the others reuse it.
		e := newEngine()
		d := e.decoder()
		for i, v := range out {
			id := fmt.Sprint("t", i)
			got, err := d.def(id, v)
			if err != nil {
				t.Fatalf("%s: load task %s cached as %.30q: %v", ch.path, id, v, err)
			}
			want, err := e.decoder().def(id, in[i])
			if err != nil {
				t.Fatal(err)
			}
			if got.id != id || got.hash != want.hash || got.part != want.part || got.sched != want.sched ||
				got.paused != want.paused || got.prof.key != want.prof.key {
				t.Errorf("%s: task %s loads from the cache as %+v (profile %q), from its JSON as %+v (profile %q)",
					ch.path, id, got, got.prof.key, want, want.prof.key)
			}
		}
	}
	if n < 30 {
		t.Fatalf("walked %d fields; the walk is broken", n)
	}
}

// A shape that does not decode (corrupted on disk) is an error, which the
// caller answers by reading etcd.
func TestShape_CorruptIsAnError(t *testing.T) {
	e := &Engine{cfg: DefaultConfig("shape").withDefaults(), scheds: schedule.NewTable(), execs: &executors{}}
	for _, v := range []string{"\x01", "\x01{\"schedule\": \"* *", "\x01{\"schedule\":\"* * * * * *\",\"not_after\":\"2999-01-01T00:00:00Z\"}"} {
		if _, err := e.decoder().def("t", []byte(v)); err == nil {
			t.Errorf("cached value %q decodes", v)
		}
	}
}

// TestEngine_RestartFromTheCache restarts a node on caches as this version
// writes them (tasks of one shape as their shape), as versions before
// shapes wrote them (every task as its JSON), with a shape corrupted on
// disk, and ahead of etcd. The first two load with no read of the
// partition; the others from etcd. Every task then fires with its own
// payload.
func TestEngine_RestartFromTheCache(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name      string
		edit      func(t *testing.T, st *store.Store, prefix string, rev int64, vals map[string][]byte)
		fullLoads bool
	}{
		{name: "shapes"},
		{name: "task JSON", edit: func(t *testing.T, st *store.Store, prefix string, rev int64, _ map[string][]byte) {
			// As a version before shapes cached them: etcd's values.
			resp, err := c.Client.Get(ctx, prefix+"/tasks/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			var kvs []store.KV
			for _, kv := range resp.Kvs {
				kvs = append(kvs, store.KV{ID: string(kv.Key[strings.LastIndexByte(string(kv.Key), '/')+1:]), Value: kv.Value})
			}
			if err := st.Reset(0, rev, kvs); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "corrupt shape", fullLoads: true, edit: func(t *testing.T, st *store.Store, _ string, rev int64, vals map[string][]byte) {
			for id, v := range vals {
				if v[0] == shapeMark {
					if err := st.Apply(0, rev, []store.KV{{ID: id, Value: v[:len(v)/2]}}, nil); err != nil {
						t.Fatal(err)
					}
					return
				}
			}
			t.Fatal("no task cached as a shape")
		}},
		{name: "ahead of etcd", fullLoads: true, edit: func(t *testing.T, st *store.Store, _ string, rev int64, _ map[string][]byte) {
			if err := st.Apply(0, rev+1000, nil, nil); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "/" + t.Name()
			tweak := func(cfg *Config) { cfg.Partitions, cfg.Prefix = 1, prefix }
			log := newFireLog()
			dir := t.TempDir()
			a := startNode(t, c, dir, log.handler, tweak)
			payloads := map[string]string{}
			for i, p := range []string{`{"shape":1}`, `{"shape":1}`, `{"shape":1}`, `{"shape":2}`, `{"shape":2}`} {
				id := string(rune('a' + i))
				tk := handlerTask(id, "* * * * * *")
				tk.Executor.Payload = json.RawMessage(p)
				tk.Labels = map[string]string{"n": id} // not fired: the shape is shared
				putTask(t, a.e.Registry(), tk)
				payloads[id] = p
			}
			ids := slices.Sorted(func(yield func(string) bool) {
				for id := range payloads {
					if !yield(id) {
						return
					}
				}
			})
			etcdtest.WaitFor(t, 10*time.Second, func() bool {
				return !slices.ContainsFunc(ids, func(id string) bool { return len(log.forTask(id)) == 0 })
			})
			a.stop(t)

			st, err := store.Open(store.DefaultConfig(dir))
			if err != nil {
				t.Fatal(err)
			}
			vals := map[string][]byte{}
			rev, err := st.Partition(0, func(id string, v []byte, _ int64) error { vals[id] = bytes.Clone(v); return nil })
			if err != nil || rev == 0 {
				t.Fatalf("the cache of partition 0: revision %d, %v", rev, err)
			}
			shapes := 0
			for _, v := range vals {
				if v[0] == shapeMark {
					shapes++
				}
			}
			if shapes < 3 {
				t.Errorf("%d of 5 tasks of two shapes cached as their shape, want at least 3 (all but the first of each)", shapes)
			}
			if tc.edit != nil {
				tc.edit(t, st, prefix, rev, vals)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}

			restarted := time.Now()
			b := startNode(t, c, dir, log.handler, tweak)
			if loads := b.e.Stats().FullLoads; (loads > 0) != tc.fullLoads {
				t.Errorf("%d full reads of the partition at the restart, want them: %v", loads, tc.fullLoads)
			}
			for _, id := range ids {
				etcdtest.WaitFor(t, 10*time.Second, func() bool {
					return slices.ContainsFunc(log.forTask(id), func(s time.Time) bool { return s.After(restarted) })
				})
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			for _, f := range log.fires {
				if string(f.Payload) != payloads[f.TaskID] {
					t.Errorf("%s fired with payload %s, want %s", f.TaskID, f.Payload, payloads[f.TaskID])
				}
			}
		})
	}
}

// A cache read from another etcd cluster or prefix is dropped at the
// start, even when the new etcd's revision is past the cache's (so that
// it does not look ahead of etcd): its tasks, which etcd does not hold,
// must not fire.
func TestEngine_CacheOfAnotherClusterOrPrefixIsDropped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		other func(t *testing.T, first *etcdtest.Cluster) (*etcdtest.Cluster, string)
	}{
		{name: "another cluster", other: func(t *testing.T, first *etcdtest.Cluster) (*etcdtest.Cluster, string) {
			c := etcdtest.Start(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resp, err := first.Client.Get(ctx, "any")
			if err != nil {
				t.Fatal(err)
			}
			for rev := int64(0); rev <= resp.Header.Revision+100; {
				put, err := c.Client.Put(ctx, "/filler", "x")
				if err != nil {
					t.Fatal(err)
				}
				rev = put.Header.Revision
			}
			return c, ""
		}},
		{name: "another prefix", other: func(t *testing.T, first *etcdtest.Cluster) (*etcdtest.Cluster, string) {
			return first, "/other"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := etcdtest.Start(t)
			log := newFireLog()
			dir := t.TempDir()
			a := startNode(t, first, dir, log.handler, func(cfg *Config) { cfg.Partitions = 1 })
			putTask(t, a.e.Registry(), handlerTask("ghost", "* * * * * *"))
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("ghost")) > 0 })
			a.stop(t)

			c, prefix := tc.other(t, first)
			fired := len(log.forTask("ghost"))
			b := startNode(t, c, dir, log.handler, func(cfg *Config) {
				cfg.Partitions = 1
				if prefix != "" {
					cfg.Prefix = prefix
				}
			})
			if loads := b.e.Stats().FullLoads; loads != 1 {
				t.Errorf("%d full reads of the partition at the restart, want 1: the cache was used", loads)
			}
			time.Sleep(2500 * time.Millisecond) // two of ghost's seconds
			if n := len(log.forTask("ghost")) - fired; n > 0 {
				t.Errorf("ghost, a task of the cache only, fired %d times after the restart", n)
			}
		})
	}
}

// A cache found ahead of etcd (restored under it) warns once, not once a
// partition: a node holds thousands of them.
func TestEngine_CacheAheadOfEtcdWarnsOnce(t *testing.T) {
	c := etcdtest.Start(t)
	dir := t.TempDir()
	tweak := func(cfg *Config) { cfg.Partitions = 4 }
	a := startNode(t, c, dir, nil, tweak)
	a.stop(t)
	st, err := store.Open(store.DefaultConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	for p := range uint32(4) {
		if err := st.Apply(p, 1<<40, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	var buf logbuf.Buffer
	b := startNode(t, c, dir, nil, func(cfg *Config) {
		tweak(cfg)
		cfg.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	if loads := b.e.Stats().FullLoads; loads != 4 {
		t.Errorf("%d partitions read from etcd, want the 4 the cache held ahead", loads)
	}
	if n := strings.Count(buf.String(), "ahead of etcd"); n != 1 {
		t.Errorf("%d warnings of a cache ahead of etcd, want 1:\n%s", n, buf.String())
	}
}

// A task changed to what the node cannot read (garbage written to etcd
// directly, or a value only a newer version reads) is left out as a read
// of the partition leaves it out: its former definition stops firing, and
// the cache does not keep it under the change's revision, where a restart
// from the cache would fire it again.
func TestEngine_UnreadableChangeIsLeftOutOfTheLoopAndTheCache(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	prefix := "/unreadable"
	tweak := func(cfg *Config) { cfg.Partitions, cfg.Prefix = 1, prefix }
	log := newFireLog()
	dir := t.TempDir()
	a := startNode(t, c, dir, log.handler, tweak)
	putTask(t, a.e.Registry(), handlerTask("keep", "* * * * * *"))
	putTask(t, a.e.Registry(), handlerTask("bad", "* * * * * *"))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("keep")) > 0 && len(log.forTask("bad")) > 0 })
	if _, err := c.Client.Put(ctx, prefix+"/tasks/00000/bad", "not a task"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { _, held := a.e.TaskState(ctx, "bad"); return !held })
	a.stop(t)

	st, err := store.Open(store.DefaultConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	var cached []string
	if _, err := st.Partition(0, func(id string, _ []byte, _ int64) error { cached = append(cached, id); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cached, []string{"keep"}) {
		t.Errorf("the cache holds %q, want only keep", cached)
	}
	restarted := time.Now()
	b := startNode(t, c, dir, log.handler, tweak)
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return slices.ContainsFunc(log.forTask("keep"), func(s time.Time) bool { return s.After(restarted) })
	})
	if _, held := b.e.TaskState(ctx, "bad"); held {
		t.Error("the restarted node armed the task whose change it cannot read")
	}
}
