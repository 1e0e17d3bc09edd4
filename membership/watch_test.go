package membership

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
)

func TestList_SortedWithRevision(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := ctxTimeout(t, 10*time.Second)
	for _, id := range []string{"c", "a", "b"} {
		join(t, testConfig(c.Client, id))
	}
	// Not nodes: a malformed value still makes a member, a nested key and
	// another prefix do not.
	for k, v := range map[string]string{
		"/shardcron/nodes/d":       "not json",
		"/shardcron/nodes/x/extra": "{}",
		"/shardcron/tasks/0001/t":  "{}",
	} {
		if _, err := c.Client.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	ms, rev, err := List(ctx, c.Client, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(ms); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Fatalf("List ids %v", got)
	}
	if ms[0].Info.APIAddr != "127.0.0.1:80" || ms[0].Info.ID != "a" || ms[0].Info.Version != "test" {
		t.Errorf("member a info %+v", ms[0].Info)
	}
	if !reflect.DeepEqual(ms[3].Info, NodeInfo{ID: "d"}) {
		t.Errorf("malformed member info %+v, want only the id", ms[3].Info)
	}
	resp, err := c.Client.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	if rev != resp.Header.Revision {
		t.Errorf("List revision %d, current %d", rev, resp.Header.Revision)
	}
}

func TestWatch_InitialJoinAndLeave(t *testing.T) {
	c := etcdtest.Start(t)
	b := join(t, testConfig(c.Client, "b"))

	ctx, cancel := context.WithCancel(context.Background())
	ch := Watch(ctx, c.NewClient(t), "/shardcron", 20*time.Millisecond)
	recvUntil(t, ch, "b")

	join(t, testConfig(c.Client, "c"))
	join(t, testConfig(c.Client, "a"))
	ms := recvUntil(t, ch, "a", "b", "c")
	if ms[0].Info.APIAddr != "127.0.0.1:80" {
		t.Errorf("member info not decoded: %+v", ms[0])
	}

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, ch, "a", "c")

	cancel()
	waitChanClosed(t, ch)
}

func TestWatch_DebounceCoalescesChanges(t *testing.T) {
	c := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	// A long debounce: the three separate writes below land well within it.
	ch := Watch(ctx, c.NewClient(t), "", time.Second)
	t.Cleanup(func() { cancel(); waitChanClosed(t, ch) })
	if got := ids(recv(t, ch)); len(got) != 0 {
		t.Fatalf("initial set %v, want empty", got)
	}
	put := func(id string) {
		if _, err := c.Client.Put(ctxTimeout(t, 5*time.Second), "/shardcron/nodes/"+id, `{"id":"`+id+`"}`); err != nil {
			t.Fatal(err)
		}
	}
	put("y")
	put("x")
	put("z")
	if got := ids(recv(t, ch)); !slices.Equal(got, []string{"x", "y", "z"}) {
		t.Fatalf("first set after three writes: %v, want them coalesced and sorted", got)
	}
}

func TestWatch_ResumesAfterCut(t *testing.T) {
	c := etcdtest.Start(t)
	p := c.NewProxy(t)
	ctx, cancel := context.WithCancel(context.Background())
	ch := Watch(ctx, c.NewClient(t, p.Endpoint()), "", 20*time.Millisecond)
	recvUntil(t, ch)

	p.Cut()
	join(t, testConfig(c.Client, "joined-during-cut"))
	p.Restore()
	recvUntil(t, ch, "joined-during-cut")

	cancel()
	waitChanClosed(t, ch)
}

func TestWatch_EndsWhenClientCloses(t *testing.T) {
	c := etcdtest.Start(t)
	cli := c.NewClient(t)
	ch := Watch(context.Background(), cli, "", 0)
	recvUntil(t, ch)
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	waitChanClosed(t, ch)
}

func TestWatcher_SendKeepsOnlyTheNewest(t *testing.T) {
	w := &watcher{out: make(chan []Member, 1)}
	w.send([]Member{{ID: "old"}})
	w.send([]Member{{ID: "new"}})
	if got := ids(<-w.out); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("reader got %v, want the newest set", got)
	}
	select {
	case ms := <-w.out:
		t.Fatalf("a second set %v is buffered", ids(ms))
	default:
	}
}

func ids(ms []Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// recv returns the next set, failing the test after 10 s.
func recv(t *testing.T, ch <-chan []Member) []Member {
	t.Helper()
	select {
	case ms, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return ms
	case <-time.After(10 * time.Second):
		t.Fatal("no member set within 10s")
		return nil
	}
}

// recvUntil reads sets until one has exactly the ids want, in that order,
// failing the test after 20 s.
func recvUntil(t *testing.T, ch <-chan []Member, want ...string) []Member {
	t.Helper()
	timeout := time.After(20 * time.Second)
	var last []string
	for {
		select {
		case ms, ok := <-ch:
			if !ok {
				t.Fatalf("watch channel closed; last set %v, want %v", last, want)
			}
			last = ids(ms)
			if slices.Equal(last, want) || (len(want) == 0 && len(last) == 0) {
				return ms
			}
		case <-timeout:
			t.Fatalf("no set [%s] within 20s; last %v", strings.Join(want, " "), last)
		}
	}
}

func waitChanClosed(t *testing.T, ch <-chan []Member) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("watch channel not closed within 10s")
		}
	}
}
