package registry

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
)

// Two triggers of a task in one millisecond are two fires: each has a
// time of its own (a fire's idempotency key), from one process as from
// two. They were one key written twice, and the owner, which remembers
// the times it fired, dropped a second trigger of a time it had fired.
func TestRegistry_TriggersInOneMillisecondAreTwoFires(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	a, b := openRegistry(t, c.Client, "/twice"), openRegistry(t, c.Client, "/twice")
	a.now, b.now = func() time.Time { return now }, func() time.Time { return now }
	if _, err := a.Put(ctx, noopTask("t", "@yearly"), PutOptions{}); err != nil {
		t.Fatal(err)
	}
	var got []time.Time
	for _, r := range []*Registry{a, a, b} {
		at, err := r.Trigger(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, at)
	}
	want := []time.Time{now, now.Add(time.Millisecond), now.Add(2 * time.Millisecond)}
	for i := range want {
		if !got[i].Equal(want[i]) {
			t.Errorf("trigger %d at %s, want %s", i, got[i].Format(time.StampMilli), want[i].Format(time.StampMilli))
		}
	}
	resp, err := c.Client.Get(ctx, a.keys.triggers(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 3 {
		t.Errorf("%d trigger keys (%v), want 3", resp.Count, err)
	}

	// A fired trigger's key is gone, but this process still gives its next
	// trigger a time after its last.
	if _, err := c.Client.Delete(ctx, a.keys.triggers(), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if at, err := a.Trigger(ctx, "t"); err != nil || !at.After(got[1]) {
		t.Errorf("after the fires: trigger at %s, %v; want after %s", at.Format(time.StampMilli), err, got[1].Format(time.StampMilli))
	}
}
