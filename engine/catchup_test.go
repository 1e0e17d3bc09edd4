package engine

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/logbuf"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// What changed in a prepared partition before its acquisition reaches the
// acquire: tasks created and changed with their last value, tasks deleted
// as nil, nothing else. From the partition's watch, which waits for a
// progress notification at the acquisition's revision or later (an earlier
// one, answering an earlier request, says nothing of the changes after
// it); from a read when the watch cannot say (etcd compacted its start).
func TestEngine_ChangesSincePreparedRead(t *testing.T) {
	c := etcdtest.Start(t)
	for _, tc := range []struct {
		name    string
		compact bool
	}{{name: "watch"}, {name: "read", compact: true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			prefix := "/" + t.Name()
			a := startNode(t, c, "", nil, func(c *Config) { c.Partitions, c.Prefix = 1, prefix })
			reg := a.e.Registry()
			for _, id := range []string{"same", "changed", "deleted"} {
				putTask(t, reg, &task.Task{ID: id, Schedule: "@hourly", Executor: task.Executor{Type: task.ExecutorNoop}})
			}
			prep, err := a.e.rangeLoad(ctx, 0, a.e.decoder()) // as prepare reads etcd
			if err != nil {
				t.Fatal(err)
			}
			putTask(t, reg, &task.Task{ID: "changed", Schedule: "@daily", Executor: task.Executor{Type: task.ExecutorNoop}})
			putTask(t, reg, &task.Task{ID: "created", Schedule: "@daily", Executor: task.Executor{Type: task.ExecutorNoop}})
			if err := reg.Delete(ctx, "deleted"); err != nil {
				t.Fatal(err)
			}
			// The acquiring transaction, which writes no task.
			at, err := c.Client.Put(ctx, prefix+"/checkpoints/00000", "{}")
			if err != nil {
				t.Fatal(err)
			}
			atRev := at.Header.Revision
			if tc.compact {
				if _, err := c.Client.Compact(ctx, atRev); err != nil {
					t.Fatal(err)
				}
			}
			wctx, stopWatch := context.WithCancel(ctx)
			defer stopWatch()
			watched, progress := reg.CatchUp(wctx, 0, prep.rev)
			wch := make(chan clientv3.WatchResponse)
			go func() {
				defer close(wch)
				stale := clientv3.WatchResponse{Header: &etcdserverpb.ResponseHeader{Revision: prep.rev}}
				select {
				case wch <- stale:
				case <-wctx.Done():
					return
				}
				for resp := range watched {
					select {
					case wch <- resp:
					case <-wctx.Done():
						return
					}
				}
			}()
			ch, synced, err := a.e.catchUp(ctx, prep, atRev, wch, progress)
			touched := ch.values
			if tc.compact {
				if !errors.Is(err, errNoCatchUp) {
					t.Fatalf("caught up from a watch whose start was compacted: %v", err)
				}
				// The watch ended: the changes are read.
				touched, synced, err = a.e.changesSince(ctx, prep, atRev, wch, func() error { return nil })
			}
			if err != nil {
				t.Fatal(err)
			}
			if synced < atRev {
				t.Errorf("synced to revision %d, before the acquisition's %d", synced, atRev)
			}
			var got []string
			for id, v := range touched {
				switch {
				case v == nil:
					got = append(got, id+" deleted")
				case strings.Contains(string(v), "@daily"):
					got = append(got, id+" @daily")
				default:
					got = append(got, id+" ?")
				}
			}
			slices.Sort(got)
			if want := []string{"changed @daily", "created @daily", "deleted deleted"}; !slices.Equal(got, want) {
				t.Errorf("changes %v, want %v", got, want)
			}
			if tc.compact {
				// The partition's latest creation moves to the task created
				// since: a trigger written before it waits for the check of
				// its task's creation (triggerNow).
				created, _, err := reg.Created(ctx, []string{"created"})
				if err != nil {
					t.Fatal(err)
				}
				if prep.created != created["created"] {
					t.Errorf("the partition's latest creation at revision %d, want %d (the task created since)", prep.created, created["created"])
				}
			}
		})
	}
}

// A partition prepared at a revision past its acquisition's was read from
// a history etcd no longer has (restored from a backup after the read):
// its catch-up refuses it, where it found no change and armed the read's
// tasks, which etcd may not have, as they were.
func TestEngine_ChangesSinceRefusesAReadFromPastTheAcquisition(t *testing.T) {
	c := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := startNode(t, c, "", nil, func(c *Config) { c.Partitions = 1 })
	putTask(t, a.e.Registry(), &task.Task{ID: "ghost", Schedule: "@hourly", Executor: task.Executor{Type: task.ExecutorNoop}})
	prep, err := a.e.rangeLoad(ctx, 0, a.e.decoder())
	if err != nil {
		t.Fatal(err)
	}
	at, err := c.Client.Get(ctx, "any") // the acquisition's revision
	if err != nil {
		t.Fatal(err)
	}
	prep.rev += 1000 // before the restore
	wch, progress := a.e.Registry().CatchUp(ctx, 0, prep.rev)
	if _, _, err := a.e.changesSince(ctx, prep, at.Header.Revision, wch, progress); err == nil {
		t.Errorf("caught a read at revision %d up to revision %d", prep.rev, at.Header.Revision)
	}
}

// A node that joins an etcd with password authentication logs in a
// bounded number of times, however many partitions it acquires. clientv3
// logs in (Authenticate: a bcrypt on etcd) for every gRPC stream it opens,
// and etcd queues the logins: a catch-up watch on a stream of its own per
// acquire made a join of N partitions N logins, ahead of the node's own
// keep-alive, and the node fenced itself after every join on a slow etcd
// (TestServer_EtcdTLSAndAuth under -race). Its catch-up watches share
// registry.CatchUpStreams streams. A count, not a speed. Not parallel:
// etcd's logins (bcrypt) would load the tests that measure windows.
func TestEngine_JoinLogsInOncePerStreamNotPerPartition(t *testing.T) {
	const password, partitions = "catch-up-pass", 64
	c := etcdtest.StartCluster(t, etcdtest.Options{RootPassword: password})
	rc := &RequestCounter{}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second,
		Username: "root", Password: password, DialOptions: rc.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	// Ready: the node acquired every partition.
	startNodeOn(t, cli, "", nil, func(cfg *Config) { cfg.Partitions, cfg.Requests = partitions, rc })
	// The client's own, the node's watch streams, the session's keep-alive
	// and lock streams, and the catch-up streams: a handful, not one per
	// partition.
	if logins := rc.Counts()["authenticate"]; logins >= partitions/4 {
		t.Fatalf("%d logins to acquire %d partitions (%v)", logins, partitions, rc.Counts())
	} else {
		t.Logf("%d logins to acquire %d partitions", logins, partitions)
	}
}

// A partition's watch that etcd compacted past while it was down reloads
// the partition: a task deleted meanwhile stops firing, one put meanwhile
// fires, and one left alone fires on without a repeat or a gap. The
// watch, cut by a member that lost its leader, resumes after the last
// revision it saw, which etcd has compacted away (watch's reload, which no
// other test reaches).
func TestEngine_PartitionWatchCompactedWhileDownReloads(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, etcdtest.Options{Members: 3})
	log := newFireLog()
	var buf logbuf.Buffer
	const parts = 1
	cli := c.NewClient(t, c.Members[1].Endpoint(), c.Members[2].Endpoint())
	reg, err := registry.OpenRegistry(context.Background(), cli, DefaultPrefix, parts)
	if err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, handlerTask("steady", "* * * * * *"))
	putTask(t, reg, handlerTask("gone", "* * * * * *"))
	n := startNodeOn(t, c.NewClient(t, c.Members[0].Endpoint()), "", log.handler, func(cfg *Config) {
		cfg.Partitions = parts
		cfg.LeaseTTL = watchesDownTTL
		cfg.MisfireThreshold = time.Minute // the outage's fires run late, each as itself
		cfg.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("gone")) > 0 })
	watchesDown(t, c, n, func(ctx context.Context) {
		if err := reg.Delete(ctx, "gone"); err != nil {
			t.Fatal(err)
		}
		putTask(t, reg, handlerTask("new", "* * * * * *"))
		resp, err := cli.Get(ctx, "compact")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			t.Fatal(err)
		}
	})
	if !eventually(10*time.Second, func() bool { return len(log.forTask("new")) > 0 }) {
		t.Fatal("the task put while the partition's watch was down never fired")
	}
	if !strings.Contains(buf.String(), "the partition's revision was compacted; reloading it") {
		t.Fatalf("the partition's watch did not find its revision compacted: the test proves nothing\n%s", buf.String())
	}
	// The reload takes "gone" out in the command that arms "new": "gone"'s
	// fires of the outage may run late before it, none after. Two seconds
	// of "steady"'s fires past it give "gone" the time to show it is still
	// armed.
	first := log.forTask("new")[0]
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return slices.ContainsFunc(log.forTask("steady"), func(at time.Time) bool { return !at.Before(first.Add(2 * time.Second)) })
	})
	n.stop(t)
	for _, at := range log.forTask("gone") {
		if !at.Before(first) {
			t.Errorf("the task deleted while the partition's watch was down fired at %v, after the reload armed the new task at %v", at, first)
		}
	}
	noGapAllowingLead(t, log, "steady")
	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("fires repeated: %v", d)
	}
}
