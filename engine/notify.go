package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/task"
)

// Failure alerts (issue 9, part 2). The dispatch loop sees each change of a
// task's state (health.go: the first failure after a success, the first
// success after failures, the first late fire after timely ones) and hands
// an alert to the notifier, which sends it off the fire path with the HTTP
// executors' client, so that the node's --http-allow applies. The loop
// never waits for it: a full queue drops the alert and counts it.
//
// What it does not guarantee: an alert is sent at most once per change on
// the node that saw it, with retries, and may be lost (queue full, all
// attempts failed, the node stopped). A graceful hand-over passes each
// task's failure streak on, so the next owner neither repeats a failure
// alert nor misses the recovery; after a crash the next owner starts
// afresh, and a task still failing alerts once more there.

// Alert is the JSON body of an alert: docs/api.md, "Alerts".
type Alert struct {
	// Event is failure, recovery or misfire.
	Event task.NotifyEvent `json:"event"`
	// TaskID and IdempotencyKey identify the fire that changed the state
	// (the key is the one its attempts carried).
	TaskID         string    `json:"task_id"`
	IdempotencyKey string    `json:"idempotency_key"`
	ScheduledAt    time.Time `json:"scheduled_at"`
	// Status is the fire's status: failed, timeout, ok or misfired.
	Status string `json:"status"`
	// Error is the error of the last attempt, at most 512 bytes.
	Error string `json:"error,omitempty"`
	// Attempt is the fire's last attempt, counting from 1.
	Attempt int `json:"attempt"`
	// ConsecutiveFailures is the task's failure streak after this fire.
	ConsecutiveFailures uint64 `json:"consecutive_failures"`
	// Node is the owner that sent the alert.
	Node string `json:"node"`
}

// notifyTarget is where a profile's alerts go: built once per profile.
type notifyTarget struct {
	url    *url.URL
	header http.Header // the task's headers, canonical; values are secrets
	mask   uint8       // task.Notify.EventMask
}

// wants reports whether t alerts on ev; t may be nil.
func (t *notifyTarget) wants(ev task.NotifyEvent) bool {
	return t != nil && t.mask&task.NotifyEventBit(ev) != 0
}

// newNotifyTarget resolves a task's notify block against the node's
// default url; nil: the task sends no alerts.
func newNotifyTarget(n *task.Notify, defaultURL string) (*notifyTarget, error) {
	target := &notifyTarget{url: nil, mask: task.NotifyEventBit(task.NotifyFailure) | task.NotifyEventBit(task.NotifyRecovery)}
	raw := defaultURL
	if n != nil {
		target.mask = n.EventMask()
		if n.URL != "" {
			raw = n.URL
		}
		if len(n.Headers) > 0 {
			target.header = make(http.Header, len(n.Headers))
			for _, k := range slices.Sorted(maps.Keys(n.Headers)) {
				target.header.Set(k, n.Headers[k])
			}
		}
	}
	if raw == "" {
		return nil, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("notify url is not a valid URL") // not quoted: it may hold a secret
	}
	target.url = u
	return target, nil
}

// Results of an alert, the result label of shardcron_notify_total.
const (
	notifySent    = iota // answered 2xx
	notifyFailed         // every attempt failed
	notifyRefused        // the node's --http-allow leaves the url out
	notifyDropped        // the queue was full
	numNotifyResults
)

var notifyResultNames = [numNotifyResults]string{"sent", "failed", "refused", "dropped"}

// notice is one piece of work for the notifier: an alert to send, or a
// task to pause (pause_on_failure).
type notice struct {
	alert  Alert
	to     *notifyTarget
	pause  bool
	fails  uint64 // the streak that paused it, for the log
	taskID string
}

// notifier delivers alerts and pauses off the dispatch loop, with a
// bounded queue and a few workers. Its goroutines run from start to stop.
type notifier struct {
	client    *http.Client
	userAgent string
	log       *slog.Logger
	q         chan notice

	// Delivery of one alert: attempts at most, the first retry after
	// backoff, doubled per retry, each attempt bounded by timeout.
	attempts int
	backoff  time.Duration
	timeout  time.Duration

	results [numNotifyResults]atomic.Uint64
	pauses  atomic.Uint64 // tasks paused by pause_on_failure

	// pauseTask pauses a task through the registry, as the pause API
	// does, unless it is paused already; it reports whether it paused
	// it. Set by start.
	pauseTask func(ctx context.Context, id string) (bool, error)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the workers
}

// notifyWorkers is how many alerts are delivered at once.
const notifyWorkers = 4

func newNotifier(client *http.Client, userAgent string, queue int, log *slog.Logger) *notifier {
	return &notifier{
		client: client, userAgent: userAgent, log: log, q: make(chan notice, queue),
		attempts: 3, backoff: time.Second, timeout: 10 * time.Second,
	}
}

// start runs the workers until stop.
func (n *notifier) start(pauseTask func(ctx context.Context, id string) (bool, error)) {
	n.pauseTask = pauseTask
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.wg.Add(notifyWorkers)
	for range notifyWorkers {
		go n.work()
	}
}

// stop lets the workers deliver what is queued for at most grace, then
// cancels what is still being sent and waits for them. Called once, after
// the dispatch loop ended (nothing is queued after that).
func (n *notifier) stop(grace time.Duration) {
	if n.cancel == nil {
		return // never started
	}
	close(n.q)
	t := time.AfterFunc(grace, n.cancel)
	defer t.Stop()
	n.wg.Wait()
	n.cancel()
}

// enqueue hands a notice to the workers without waiting; when the queue is
// full the notice is dropped and counted. Called from the dispatch loop.
func (n *notifier) enqueue(x notice) {
	select {
	case n.q <- x:
	default:
		n.results[notifyDropped].Add(1)
		n.log.Warn("alert queue full; dropping", "task", x.taskID, "event", x.alert.Event, "pause", x.pause)
	}
}

func (n *notifier) work() {
	defer n.wg.Done()
	for x := range n.q {
		if x.pause {
			n.pause(x)
			continue
		}
		res, err := n.deliver(x)
		n.results[res].Add(1)
		if err != nil {
			// The task id and the error only: the url and the headers may
			// hold secrets.
			n.log.Warn("sending an alert failed", "task", x.taskID, "event", x.alert.Event,
				"result", notifyResultNames[res], "err", err)
		}
	}
}

// pause pauses a task that reached its pause_on_failure streak.
func (n *notifier) pause(x notice) {
	ctx, cancel := context.WithTimeout(n.ctx, etcdTimeout)
	defer cancel()
	paused, err := n.pauseTask(ctx, x.taskID)
	if err != nil {
		n.log.Warn("pausing a failing task failed", "task", x.taskID, "consecutive_failures", x.fails, "err", err)
		return
	}
	if !paused {
		// Paused since the loop asked (by an operator, or by this
		// pause_on_failure at an earlier failure): that pause stays.
		n.log.Debug("a failing task was paused already; its pause is left as it is (pause_on_failure)", "task", x.taskID, "consecutive_failures", x.fails)
		return
	}
	n.pauses.Add(1)
	n.log.Info("task paused after failing in a row (pause_on_failure)", "task", x.taskID, "consecutive_failures", x.fails)
}

// deliver sends one alert, retrying failures; it returns the result and
// the last error.
func (n *notifier) deliver(x notice) (int, error) {
	body, err := json.Marshal(x.alert)
	if err != nil {
		return notifyFailed, fmt.Errorf("encode alert: %w", err)
	}
	wait := n.backoff
	for attempt := 1; ; attempt++ {
		err = n.post(x, body)
		switch {
		case err == nil:
			return notifySent, nil
		case errors.Is(err, executor.ErrNotAllowed):
			return notifyRefused, err
		case attempt >= n.attempts || n.ctx.Err() != nil:
			return notifyFailed, err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-n.ctx.Done():
			t.Stop()
			return notifyFailed, err
		}
		wait *= 2
	}
}

// post sends the alert once: nil for a 2xx answer.
func (n *notifier) post(x notice, body []byte) error {
	ctx, cancel := context.WithTimeout(n.ctx, n.timeout)
	defer cancel()
	u := *x.to.url
	h := make(http.Header, len(x.to.header)+3)
	for k, v := range x.to.header {
		h[k] = v
	}
	h.Set("Content-Type", "application/json")
	if h.Get("User-Agent") == "" {
		h.Set("User-Agent", n.userAgent)
	}
	// Retries of one alert carry one key, so that a receiver can drop
	// repeats.
	h.Set(executor.HeaderIdempotencyKey, x.alert.IdempotencyKey+"/"+string(x.alert.Event))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return errors.New("build the alert request") // the url may hold a secret
	}
	req.Header = h
	resp, err := n.client.Do(req)
	if err != nil {
		// url.Error repeats the url, which may hold a secret.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("alert: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("alert: answered %s", resp.Status)
	}
	return nil
}

// alertOf builds the alert of a change of record r's state. Called only
// from the dispatch loop.
func (l *loop) alertOf(ev task.NotifyEvent, r *record, sched int64, attempt int, status uint8, why string) Alert {
	id := l.tab.id(r)
	f := executor.Fire{TaskID: id, ScheduledAt: time.Unix(0, sched).UTC()}
	return Alert{
		Event: ev, TaskID: id, IdempotencyKey: f.IdempotencyKey(), ScheduledAt: f.ScheduledAt,
		Status: statusNames[status], Error: truncateError(why), Attempt: attempt,
		ConsecutiveFailures: uint64(r.failStreak), Node: l.cfg.NodeID,
	}
}

// alert queues the alert of event ev for record r, when its profile wants
// it. Called only from the dispatch loop, on changes of state only.
func (l *loop) alert(ev task.NotifyEvent, r *record, sched int64, attempt int, status uint8, why string) {
	to := l.profs.list[r.prof].notify
	if l.alerts == nil || !to.wants(ev) {
		return
	}
	a := l.alertOf(ev, r, sched, attempt, status, why)
	l.alerts.enqueue(notice{alert: a, to: to, taskID: a.TaskID})
}

// pauseOnFailure asks for record r's task to be paused when its failure
// streak just reached a multiple of the profile's pause_on_failure K: a
// task resumed while still failing (its streak goes on) is paused again
// after K more failures. Not a task paused already, whose triggers and
// backfills run and fail: its pause, the operator's note and all, stays.
// Called only from the dispatch loop.
func (l *loop) pauseOnFailure(r *record) {
	k := l.profs.list[r.prof].pauseAfter
	if l.alerts == nil || k == 0 || r.failStreak == 0 || r.failStreak%k != 0 || r.flags&flagPaused != 0 {
		return
	}
	l.alerts.enqueue(notice{pause: true, taskID: l.tab.id(r), fails: uint64(r.failStreak)})
}

// notifyGrace bounds how long Close lets queued alerts go out.
const notifyGrace = 5 * time.Second
