package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/shardcron/shardcron/internal/cputime"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// Two triggers of a task in one millisecond are two fires: each has a
// time of its own (a fire's idempotency key), from one process as from
// two. They were one key written twice, and the owner, which remembers
// the times it fired, dropped a second trigger of a time it had fired.
func TestRegistry_TriggersInOneMillisecondAreTwoFires(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	a, b := openRegistry(t, c.Client, "/twice"), openRegistry(t, c.Client, "/twice")
	now := stopClocks(a, b)
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
	ms := time.Millisecond // now is a whole second, the time of scheduled fires: the first trigger takes the millisecond after
	want := []time.Time{now.Add(ms), now.Add(2 * ms), now.Add(3 * ms)}
	for i := range want {
		if !got[i].Equal(want[i]) {
			t.Errorf("trigger %d at %s, want %s", i, got[i].Format(time.StampMilli), want[i].Format(time.StampMilli))
		}
	}
	if n, err := a.PendingTriggerCount(ctx); err != nil || n != 3 {
		t.Errorf("%d trigger keys (%v), want 3", n, err)
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

// Two triggers with a payload of one task in one millisecond, from two
// processes, are two fires, each with its own payload: the second finds
// the first's key pending and takes the next millisecond. It was refused
// as if the task had changed while its override was checked.
func TestRegistry_OverriddenTriggersOfTwoProcessesInOneMillisecondAreTwoFires(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	a, b := openRegistry(t, c.Client, "/twiceover"), openRegistry(t, c.Client, "/twiceover")
	now := stopClocks(a, b)
	h := &task.Task{ID: "h", Schedule: "@yearly", Executor: task.Executor{Type: task.ExecutorHandler, Name: "h"}}
	if _, err := a.Put(ctx, h, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, r := range []*Registry{a, b} {
		if _, err := r.TriggerWith(ctx, "h", &task.Override{Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}); err != nil {
			t.Fatalf("trigger %d: %v", i, err)
		}
	}
	var got []string
	for _, kv := range triggerKeys(t, c.Client, a).Kvs {
		_, at, _, _ := a.ParseTrigger(string(kv.Key))
		o, _ := DecodeTriggerValue(kv.Value)
		if o == nil {
			t.Fatalf("a trigger key without its payload: %s", kv.Value)
		}
		got = append(got, fmt.Sprintf("+%dms %s", at-now.UnixMilli(), o.Payload))
	}
	if want := []string{`+1ms {"n":0}`, `+2ms {"n":1}`}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("trigger keys %v, want %v", got, want)
	}
}

// A process remembers each task's last trigger time whatever tasks it
// triggers in between: the triggers of A, B, then A again in one
// millisecond, the first two fired, are three fires, A's second after
// its first.
func TestRegistry_TriggersOfOtherTasksInBetweenKeepATasksLastTime(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/between")
	stopClocks(reg)
	for _, id := range []string{"a", "b"} {
		putTask(t, reg, noopTask(id, "@yearly"))
	}
	first, err := reg.Trigger(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Trigger(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.Delete(ctx, reg.keys.triggers(), clientv3.WithPrefix()); err != nil { // both fired
		t.Fatal(err)
	}
	if again, err := reg.Trigger(ctx, "a"); err != nil || !again.After(first) {
		t.Errorf("a's second trigger at %s, %v; want after its first at %s", again.Format(time.StampMilli), err, first.Format(time.StampMilli))
	}
}

// stopClocks stops the clocks of regs at one instant, which it returns.
func stopClocks(regs ...*Registry) time.Time {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, r := range regs {
		r.now = func() time.Time { return now }
	}
	return now
}

// A manual trigger and a bulk trigger of a task in one millisecond, from
// one process, are two fires. The bulk action took its time from a
// sequence of its own, the same, and wrote over the manual trigger's key:
// one fire, without the manual trigger's payload.
func TestRegistry_BulkAndManualTriggersInOneMillisecondAreTwoFires(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/bulkmanual")
	stopClocks(reg)
	h := &task.Task{ID: "h/1", Schedule: "@yearly", Executor: task.Executor{Type: task.ExecutorHandler, Name: "h"}}
	if _, err := reg.Put(ctx, h, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.TriggerWith(ctx, "h/1", &task.Override{Payload: json.RawMessage(`{"x":1}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Bulk(ctx, task.BulkTrigger, task.Selector{Prefix: "h/"}); err != nil {
		t.Fatal(err)
	}
	resp := triggerKeys(t, c.Client, reg)
	withPayload := 0
	times := map[int64]bool{} // unix ms
	for _, kv := range resp.Kvs {
		if o, _ := DecodeTriggerValue(kv.Value); o != nil && o.Payload != nil {
			withPayload++
		}
		_, at, _, _ := reg.ParseTrigger(string(kv.Key))
		times[at] = true
	}
	if len(resp.Kvs) != 2 || withPayload != 1 {
		t.Errorf("a manual trigger and a bulk trigger in one millisecond: %d trigger keys, %d with the payload; want 2, 1",
			len(resp.Kvs), withPayload)
	}

	// Both fired (their keys are gone); a manual trigger in the same
	// millisecond takes neither time, the bulk action's included.
	if _, err := c.Client.Delete(ctx, reg.keys.triggers(), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if at, err := reg.Trigger(ctx, "h/1"); err != nil || times[at.UnixMilli()] {
		t.Errorf("a trigger after the fires: at %s (%v), one of the fired times %v", at.Format(time.StampMilli), err, times)
	}
}

// A bulk trigger whose transaction fails (a task of its group deleted
// between the read and the write) triggers the others one at a time, at
// times of their own. It took the clock's millisecond, the key of an
// earlier bulk trigger still pending: two bulk actions, one fire.
func TestRegistry_BulkTriggerRetriedAloneTakesATimeOfItsOwn(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/bulkone")
	now := stopClocks(reg)
	for _, id := range []string{"b/a", "b/z"} {
		if _, err := reg.Put(ctx, noopTask(id, "@yearly"), PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reg.Bulk(ctx, task.BulkTrigger, task.Selector{Prefix: "b/"}); err != nil {
		t.Fatal(err)
	}
	// The second action reads the clock between its read and its write:
	// b/z is deleted then.
	deleted := false
	reg.now = func() time.Time {
		if !deleted {
			deleted = true
			if err := reg.Delete(ctx, "b/z"); err != nil {
				t.Error(err)
			}
		}
		return now
	}
	res, err := reg.Bulk(ctx, task.BulkTrigger, task.Selector{Prefix: "b/"})
	if err != nil || res.Changed != 1 || res.Skipped != 1 {
		t.Fatalf("second bulk trigger: %+v, %v; want 1 changed, 1 skipped", res, err)
	}
	resp, err := c.Client.Get(ctx, reg.keys.triggerPrefix(reg.Partition("b/a")), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, kv := range resp.Kvs {
		if _, _, id, ok := reg.ParseTrigger(string(kv.Key)); ok && id == "b/a" {
			n++
		}
	}
	if n != 2 {
		t.Errorf("two bulk triggers of b/a in one millisecond: %d trigger keys of it, want 2", n)
	}
}

// A bulk trigger of more tasks than a transaction holds writes them all:
// etcd bounds a transaction's compares as it bounds its operations, and a
// trigger has two compares.
func TestRegistry_BulkTriggerOfManyTasks(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/bulkmany")
	const n = 3 * MaxTxnOps
	tasks := make([]*task.Task, n)
	for i := range tasks {
		tasks[i] = noopTask(fmt.Sprintf("m/%04d", i), "@yearly")
	}
	if _, err := reg.PutBatch(ctx, tasks); err != nil {
		t.Fatal(err)
	}
	res, err := reg.Bulk(ctx, task.BulkTrigger, task.Selector{Prefix: "m/"})
	if err != nil || res.Changed != n {
		t.Fatalf("Bulk = %+v, %v; want %d changed", res, err, n)
	}
	if got, err := reg.PendingTriggerCount(ctx); err != nil || got != n {
		t.Errorf("%d trigger keys (%v), want %d", got, err, n)
	}
}

// A retry handed on as a trigger reads back as the attempt it is, due when
// it was due, with its fire's override; a plain trigger reads back as no
// retry. A retry of a task deleted meanwhile is not written.
func TestRegistry_TriggerRetryCarriesItsAttempt(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/retry")
	put, err := reg.Put(ctx, noopTask("t", "@yearly"), PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	due := at.Add(90 * time.Second)
	body := "b"
	if err := reg.TriggerRetry(ctx, "t", at, Retry{Attempt: 3, Due: due}, &task.Override{Body: &body}, put.Version); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Trigger(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	resp := triggerKeys(t, c.Client, reg)
	var retries []string
	for _, kv := range resp.Kvs {
		_, ms, _, _ := reg.ParseTrigger(string(kv.Key))
		o, r := DecodeTriggerValue(kv.Value)
		if r == nil {
			continue
		}
		b := "<none>"
		if o != nil && o.Body != nil {
			b = *o.Body
		}
		retries = append(retries, fmt.Sprintf("%s attempt %d due %s body %s", time.UnixMilli(ms).UTC().Format(time.TimeOnly),
			r.Attempt, r.Due.Format(time.TimeOnly), b))
	}
	if want := []string{"03:04:05 attempt 3 due 03:05:35 body b"}; len(resp.Kvs) != 2 || fmt.Sprint(retries) != fmt.Sprint(want) {
		t.Errorf("%d trigger keys, retries %v; want 2, %v", len(resp.Kvs), retries, want)
	}
	// A creation not known (0) is not checked: the retry was dropped.
	if err := reg.TriggerRetry(ctx, "t", at.Add(time.Minute), Retry{Attempt: 2, Due: due}, nil, 0); err != nil {
		t.Errorf("a retry whose task's creation is not known: %v", err)
	}
	if err := reg.Delete(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if err := reg.TriggerRetry(ctx, "t", at, Retry{Attempt: 2, Due: due}, nil, put.Version); !errors.Is(err, ErrNotFound) {
		t.Errorf("a retry of a deleted task: %v, want ErrNotFound", err)
	}
}

// A retry takes the first of the maxTriggerTries milliseconds after its
// fire's time with no trigger of the task pending; with every one of them
// pending it writes nothing and says to try again.
func TestRegistry_TriggerRetryTakesAnyOfItsTimes(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/retrytimes")
	put, err := reg.Put(ctx, noopTask("t", "@yearly"), PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for attempt := range uint16(maxTriggerTries) {
		if err := reg.TriggerRetry(ctx, "t", at, Retry{Attempt: attempt + 2, Due: at}, nil, put.Version); err != nil {
			t.Fatalf("retry %d of %d: %v", attempt+1, maxTriggerTries, err)
		}
	}
	kvs := triggerKeys(t, c.Client, reg).Kvs
	if n := len(kvs); n != maxTriggerTries {
		t.Fatalf("%d trigger keys, want %d", n, maxTriggerTries)
	}
	if _, last, _, _ := reg.ParseTrigger(string(kvs[len(kvs)-1].Key)); last != at.UnixMilli()+maxTriggerTries {
		t.Errorf("the last retry at %+dms, want %+dms", last-at.UnixMilli(), maxTriggerTries)
	}
	before := revision(t, c.Client)
	err = reg.TriggerRetry(ctx, "t", at, Retry{Attempt: maxTriggerTries + 2, Due: at}, nil, put.Version)
	if !errors.Is(err, ErrContention) || revision(t, c.Client) != before {
		t.Errorf("a retry with all its times pending: %v, want ErrContention and nothing written", err)
	}
}

// A fire's first attempt that its node's stop came before, handed on
// unrun, reads back as attempt 1 of that fire, not as a trigger's own
// fire at the key's time (another fire, under another idempotency key).
func TestRegistry_TriggerRetryOfAFirstAttemptReadsBackAsIt(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/retryfirst")
	put, err := reg.Put(ctx, noopTask("t", "@yearly"), PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := reg.TriggerRetry(ctx, "t", at, Retry{Attempt: 1, Due: at}, nil, put.Version); err != nil {
		t.Fatal(err)
	}
	kvs := triggerKeys(t, c.Client, reg).Kvs
	if len(kvs) != 1 {
		t.Fatalf("%d trigger keys, want 1", len(kvs))
	}
	if _, r := DecodeTriggerValue(kvs[0].Value); r == nil || r.Attempt != 1 || !r.At.Equal(at) {
		t.Errorf("read back as %+v, want attempt 1 of the fire at %v", r, at)
	}
}

// A retry is of the task whose attempt failed, not of its id: the task
// deleted and put again after its node last read the partition, the
// retry is not written (ErrNotFound, as for a task deleted), and the new
// task does not fire from it. It was written, the new task's creation
// checked only for being there.
func TestRegistry_TriggerRetryOfATaskPutAgainIsNotWritten(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/retryagain")
	put, err := reg.Put(ctx, noopTask("x", "@yearly"), PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Put(ctx, noopTask("other", "@yearly"), PutOptions{}); err != nil {
		t.Fatal(err) // the partition's view moves on past x's creation
	}
	seen := put.Version + 1
	if err := reg.Delete(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Put(ctx, noopTask("x", "@yearly"), PutOptions{}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	retry := Retry{Attempt: 2, Due: at.Add(10 * time.Second)}
	if err := reg.TriggerRetry(ctx, "x", at, retry, nil, seen); !errors.Is(err, ErrNotFound) {
		t.Errorf("a retry of x put again since: %v, want ErrNotFound", err)
	}
	if n := len(triggerKeys(t, c.Client, reg).Kvs); n != 0 {
		t.Errorf("%d trigger keys of x put again since, want none", n)
	}
}

// A retry handed on through etcd is another fire than a chain's or an API
// trigger's of its task at its fire's time: X's scheduled fire at 12:00
// fails after its release while the chain of Y's fire at 12:00 triggers X
// at 12:00. The retry was put on that trigger's key, pending for the next
// owner, and the chained fire was lost; a chain trigger put after the
// retry would have taken the retry's place. Both stay, and each reads
// back as what it is.
func TestRegistry_TriggerRetryKeepsAPendingTriggerOfItsFire(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/retry")
	put, err := reg.Put(ctx, noopTask("x", "0 * * * * *"), PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	if err := reg.TriggerAt(ctx, "x", at); err != nil { // Y's chain
		t.Fatal(err)
	}
	retry := Retry{Attempt: 2, Due: at.Add(10 * time.Second)}
	if err := reg.TriggerRetry(ctx, "x", at, retry, nil, put.Version); err != nil {
		t.Fatal(err)
	}
	if err := reg.TriggerRetry(ctx, "x", at, retry, nil, put.Version); err != nil { // put again after an error that hid the first put
		t.Fatal(err)
	}
	if err := reg.TriggerAt(ctx, "x", at); err != nil { // another chain of x at 12:00: that fire
		t.Fatal(err)
	}
	resp := triggerKeys(t, c.Client, reg)
	var got []string
	for _, kv := range resp.Kvs {
		_, ms, _, _ := reg.ParseTrigger(string(kv.Key))
		if _, r := DecodeTriggerValue(kv.Value); r != nil {
			got = append(got, fmt.Sprintf("attempt %d", r.Attempt))
		} else {
			got = append(got, fmt.Sprintf("fire at %s", time.UnixMilli(ms).UTC().Format(time.TimeOnly)))
		}
	}
	if want := []string{"fire at 03:04:00", "attempt 2"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("trigger keys %v, want %v", got, want)
	}
}

// A chain's trigger of a task at a time where a trigger of it that is
// another fire is pending, a retry handed on or an API trigger with a
// payload, takes a time of its own: it was put on that key, and the retry
// (its attempt, its due time) or the payload was lost, the chained fire
// taking its place. A second chain of the task at that time (a diamond)
// is the first one's fire.
func TestRegistry_ChainTriggerKeepsAPendingRetryOrOverride(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/chainover")
	now := stopClocks(reg)
	h := &task.Task{ID: "x", Schedule: "@yearly", Executor: task.Executor{Type: task.ExecutorHandler, Name: "h"}}
	put, err := reg.Put(ctx, h, PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Millisecond
	over, err := reg.TriggerWith(ctx, "x", &task.Override{Payload: json.RawMessage(`{"x":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.TriggerRetry(ctx, "x", now.Add(5*ms), Retry{Attempt: 2, Due: now.Add(time.Minute)}, nil, put.Version); err != nil {
		t.Fatal(err) // its key is at +6ms
	}
	// The chains of fires at the payload's time and at the retry key's.
	for _, at := range []time.Time{over, now.Add(6 * ms), over} {
		if err := reg.TriggerAt(ctx, "x", at); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, kv := range triggerKeys(t, c.Client, reg).Kvs {
		_, at, _, _ := reg.ParseTrigger(string(kv.Key))
		o, r := DecodeTriggerValue(kv.Value)
		what := "fire"
		switch {
		case r != nil:
			what = fmt.Sprintf("attempt %d", r.Attempt)
		case o != nil:
			what = "payload " + string(o.Payload)
		}
		got = append(got, fmt.Sprintf("+%dms %s", at-now.UnixMilli(), what))
	}
	if want := []string{`+1ms payload {"x":1}`, "+2ms fire", "+6ms attempt 2", "+7ms fire"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("trigger keys %v, want %v", got, want)
	}
}

// A bulk trigger by labels triggers only the tasks that match when it
// writes: one that another writer moved out of the selection between the
// bulk read and its write is skipped, as a pause skips it. The trigger's
// transaction compared only that the task existed, and fired it anyway.
func TestRegistry_BulkTriggerByLabelsSkipsATaskThatLeftTheSelection(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/bulklabels")
	now := stopClocks(reg)
	bulkFleet(t, reg, 4) // fleet/0000 and fleet/0002 are billing
	// The action reads the clock between its read and its write:
	// fleet/0000 moves to another team then.
	moved := false
	reg.now = func() time.Time {
		if !moved {
			moved = true
			tk, err := reg.Get(ctx, "fleet/0000")
			if err != nil {
				t.Error(err)
				return now
			}
			tk.Labels = map[string]string{"team": "ads"}
			if _, err := reg.Put(ctx, tk, PutOptions{}); err != nil {
				t.Error(err)
			}
		}
		return now
	}
	res, err := reg.Bulk(ctx, task.BulkTrigger, task.Selector{Labels: map[string]string{"team": "billing"}})
	if err != nil {
		t.Fatal(err)
	}
	resp := triggerKeys(t, c.Client, reg)
	var fired []string
	for _, kv := range resp.Kvs {
		if _, _, id, ok := reg.ParseTrigger(string(kv.Key)); ok {
			fired = append(fired, id)
		}
	}
	if res.Changed != 1 || res.Skipped != 1 || len(fired) != 1 || fired[0] != "fleet/0002" {
		t.Errorf("bulk trigger of team billing: %+v, triggered %v; want fleet/0002 alone (1 changed, 1 skipped): fleet/0000 left the team before the write", res, fired)
	}
}

// A trigger's time is the fire's idempotency key, and a task's scheduled
// fires fall on whole seconds (cron, @every, @at): a manual or bulk
// trigger made on a whole second took that second's time, the key of the
// task's own fire then, and the two fires were one for receivers (and a
// retry of each, handed over at a release, one retry for the next owner).
// It takes the millisecond after instead.
func TestRegistry_TriggerOnAWholeSecondTakesNotTheScheduledFiresTime(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/whole")
	now := stopClocks(reg) // on a whole second
	for _, id := range []string{"s/1", "s/2"} {
		if _, err := reg.Put(ctx, noopTask(id, "* * * * * *"), PutOptions{}); err != nil { // a fire every second
			t.Fatal(err)
		}
	}
	at, err := reg.Trigger(ctx, "s/1")
	if err != nil {
		t.Fatal(err)
	}
	if at.UnixMilli()%1000 == 0 {
		t.Errorf("a trigger of s/1 at %s: the time of its scheduled fire then, one idempotency key for two fires", at.Format(time.StampMilli))
	}
	reg2 := openRegistry(t, c.Client, "/whole")
	reg2.now = func() time.Time { return now.Add(time.Second) }
	if _, err := reg2.Bulk(ctx, task.BulkTrigger, task.Selector{Prefix: "s/"}); err != nil {
		t.Fatal(err)
	}
	resp := triggerKeys(t, c.Client, reg)
	if len(resp.Kvs) != 3 { // else the loop below checks nothing
		t.Errorf("%d trigger keys, want 3: s/1's trigger and the bulk trigger's of s/1 and s/2", len(resp.Kvs))
	}
	for _, kv := range resp.Kvs {
		if _, ms, id, _ := reg.ParseTrigger(string(kv.Key)); ms%1000 == 0 {
			t.Errorf("a trigger of %s at %s: the time of its scheduled fire then", id, time.UnixMilli(ms).UTC().Format(time.StampMilli))
		}
	}
}

// triggerKeys reads every trigger key of reg.
func triggerKeys(t *testing.T, cli *clientv3.Client, reg *Registry) *clientv3.GetResponse {
	t.Helper()
	resp, err := cli.Get(context.Background(), reg.keys.triggers(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// A chain's trigger joins a plain trigger of its target pending at its
// time only if that key was written for the target as it is: one written
// before the target was deleted and put again is the task before's, which
// its owner drops (the trigger's key is older than the task's creation),
// and the chain's trigger with it. The chain's then takes the next
// millisecond. It wrote nothing, and the new task never fired.
func TestRegistry_ChainTriggerJoinsNoTriggerOfATaskDeletedSince(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/chainagain")
	now := stopClocks(reg)
	h := &task.Task{ID: "x", Schedule: "@yearly", Executor: task.Executor{Type: task.ExecutorHandler, Name: "h"}}
	at := now.Add(5 * time.Millisecond)
	if _, err := reg.Put(ctx, h, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := reg.TriggerAt(ctx, "x", at); err != nil {
		t.Fatal(err)
	}
	if err := reg.Delete(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	created, err := reg.Put(ctx, h, PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.TriggerAt(ctx, "x", at); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, kv := range triggerKeys(t, c.Client, reg).Kvs {
		_, ms, _, _ := reg.ParseTrigger(string(kv.Key))
		got = append(got, fmt.Sprintf("+%dms written after the put: %v", ms-now.UnixMilli(), kv.ModRevision > created.Version))
	}
	if want := []string{"+5ms written after the put: false", "+6ms written after the put: true"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("trigger keys %v, want %v", got, want)
	}
}

// BenchmarkCreated measures the read by which an owner learns when the
// tasks of triggers older than a creation it applied were created (every
// trigger an acquire reads), MaxTxnOps tasks a transaction, over n tasks:
//
//	go test -run '^$' -bench 'Created' -benchtime 3x ./registry/
func BenchmarkCreated(b *testing.B) {
	const n = 10_000
	_, reg := bulkBenchFleet(b, n)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("job-%07d", i) // fillRegistry's
	}
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		for chunk := range slices.Chunk(ids, MaxTxnOps) {
			created, _, err := reg.Created(ctx, chunk)
			if err != nil || created[chunk[0]] == 0 {
				b.Fatalf("Created = %v, %v; want the creation of %s", created[chunk[0]], err, chunk[0])
			}
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tasks/s")
}

// A trigger key's owner deletes only the put it ended: a key put again
// since is another trigger (its task deleted and put again in between),
// or one the owner has yet to take, and stays for whoever owns its
// partition then. The delete took it whatever it held, and that trigger
// was lost. A transaction of keys of which one was put again deletes the
// others; a key gone or put again keeps no key from going.
func TestRegistry_DeleteTriggersDeletesOnlyThePutItEnded(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg := openRegistry(t, c.Client, "/deltrig")
	const n = MaxTxnOps
	puts := make([]TriggerPut, n)
	for i := range puts {
		puts[i] = TriggerPut{Part: i % 4, ID: fmt.Sprintf("t%03d", i), At: 1000}
		resp, err := c.Client.Put(ctx, reg.keys.trigger(puts[i].Part, puts[i].ID, puts[i].At), "")
		if err != nil {
			t.Fatal(err)
		}
		puts[i].Rev = resp.Header.Revision
	}
	again, err := c.Client.Put(ctx, reg.keys.trigger(puts[7].Part, puts[7].ID, puts[7].At), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.Delete(ctx, reg.keys.trigger(puts[9].Part, puts[9].ID, puts[9].At)); err != nil {
		t.Fatal(err)
	}
	if err := reg.DeleteTriggers(ctx, puts); err != nil {
		t.Fatal(err)
	}
	resp := triggerKeys(t, c.Client, reg)
	if len(resp.Kvs) != 1 || resp.Kvs[0].ModRevision != again.Header.Revision {
		t.Fatalf("trigger keys left %v, want %s's put again alone, at revision %d", resp.Kvs, puts[7].ID, again.Header.Revision)
	}
	puts[7].Rev = again.Header.Revision
	if err := reg.DeleteTriggers(ctx, puts[7:8]); err != nil {
		t.Fatal(err)
	}
	if resp := triggerKeys(t, c.Client, reg); len(resp.Kvs) != 0 {
		t.Errorf("trigger keys left %v, want none: the put again ended", resp.Kvs)
	}
}

// BenchmarkBulkTriggerDeletes is what the owners' deletes of a bulk
// trigger's 100 000 keys cost etcd, in transactions of MaxTxnOps, eight at
// once, as the engine's deleter sends them: delete=plain deletes each key
// whatever it holds (before 2026-12-07), delete=at-put only the put it
// ended (DeleteTriggers: a compare a key, which etcd bounds apart from
// the deletes, so a transaction still holds 128 keys). cpu-ms/op is the
// process's CPU time, etcd's and the client's, over the deletes:
//
//	go test -run '^$' -bench 'BulkTriggerDeletes' -benchtime 3x -count 2 ./registry/
func BenchmarkBulkTriggerDeletes(b *testing.B) {
	const n, parallel = 100_000, 8
	c := etcdtest.Start(b)
	reg, err := OpenRegistry(context.Background(), c.Client, "/bench", 1024)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	write := func() []TriggerPut {
		puts := make([]TriggerPut, n)
		for i := range puts {
			puts[i] = TriggerPut{Part: i % 1024, ID: fmt.Sprintf("bench/%06d", i), At: 1_800_000_000_000}
		}
		for chunk := range slices.Chunk(puts, MaxTxnOps) {
			ops := make([]clientv3.Op, len(chunk))
			for i, t := range chunk {
				ops[i] = clientv3.OpPut(reg.keys.trigger(t.Part, t.ID, t.At), "")
			}
			resp, err := c.Client.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				b.Fatal(err)
			}
			for i := range chunk {
				chunk[i].Rev = resp.Header.Revision
			}
		}
		return puts
	}
	for _, tc := range []struct {
		name string
		del  func(puts []TriggerPut) error
	}{
		{"delete=plain", func(puts []TriggerPut) error {
			ops := make([]clientv3.Op, len(puts))
			for i, t := range puts {
				ops[i] = clientv3.OpDelete(reg.keys.trigger(t.Part, t.ID, t.At))
			}
			_, err := c.Client.Txn(ctx).Then(ops...).Commit()
			return err
		}},
		{"delete=at-put", func(puts []TriggerPut) error { return reg.DeleteTriggers(ctx, puts) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var took, cpu time.Duration
			for range b.N {
				b.StopTimer()
				puts := write()
				b.StartTimer()
				start, startCPU := time.Now(), cputime.Process()
				var g errgroup.Group
				g.SetLimit(parallel)
				for chunk := range slices.Chunk(puts, MaxTxnOps) {
					g.Go(func() error { return tc.del(chunk) })
				}
				if err := g.Wait(); err != nil {
					b.Fatal(err)
				}
				took, cpu = took+time.Since(start), cpu+cputime.Process()-startCPU
			}
			if left, err := reg.PendingTriggerCount(ctx); err != nil || left != 0 {
				b.Fatalf("%d trigger keys left (%v), want none", left, err)
			}
			b.ReportMetric(float64(n*b.N)/took.Seconds(), "keys/s")
			b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/op")
		})
	}
}
