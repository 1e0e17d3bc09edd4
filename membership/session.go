package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

var (
	// ErrNodeExists is returned by Join when a live node holds the node id.
	// The returned error names the id and wraps ErrNodeExists.
	ErrNodeExists = errors.New("membership: node id is held by a live node")
	// ErrFenced is Session.Err after the fencing deadline passed.
	ErrFenced = errors.New("membership: session fenced: no keep-alive acknowledged before the fencing deadline")
	// ErrLeaseLost is Session.Err after etcd reported the lease expired or
	// revoked.
	ErrLeaseLost = errors.New("membership: session lease expired or was revoked")
	// ErrClosed is Session.Err after Close.
	ErrClosed = errors.New("membership: session closed")
	// ErrHeldByLease is wrapped, with ctx's error, by Join's error when
	// ctx ended while Join waited for another session's lease on the node
	// id to expire: a crashed node's of the same id, as a rule, which
	// lasts up to that node's TTL.
	ErrHeldByLease = errors.New("membership: node id is held by another lease")
)

// nodeExistsError names the contested id; it is ErrNodeExists for errors.Is.
type nodeExistsError struct{ id string }

func (e *nodeExistsError) Error() string {
	return fmt.Sprintf("membership: node id %q is held by a live node", e.id)
}

func (e *nodeExistsError) Unwrap() error { return ErrNodeExists }

// heldError is Join's error when ctx ended while it waited for another
// lease on the node id: ErrHeldByLease and ctx's error for errors.Is.
type heldError struct {
	id  string
	err error
}

func (e *heldError) Error() string {
	return fmt.Sprintf("membership: waiting for node id %q to be released: %v", e.id, e.err)
}

func (e *heldError) Unwrap() []error { return []error{ErrHeldByLease, e.err} }

// revokeTimeout bounds the best-effort revocation of a lease Join granted
// but could not use.
const revokeTimeout = 5 * time.Second

// Session is a node's membership: its lease, its key under the lease, and
// the fencing deadline kept by its own keep-alive loop. It ends, for good,
// when the fencing deadline passes, when etcd reports the lease gone, or on
// Close; a node that wants to go on calls Join again for a new Session.
//
// All methods are safe for concurrent use.
type Session struct {
	cli    *clientv3.Client
	cfg    Config     // defaults applied; cfg.Info is guarded by infoMu
	infoMu sync.Mutex // guards cfg.Info after Join, and orders its writes
	key    string
	lease  clientv3.LeaseID
	log    *slog.Logger

	// base is the origin of the session's monotonic clock: deadline holds
	// nanoseconds since base, so wall-clock jumps cannot move it.
	base     time.Time
	deadline atomic.Int64
	// fenced is set, and never cleared, when the session ends or its
	// deadline is seen to pass.
	fenced atomic.Bool

	ctx     context.Context // canceled when the session ends
	cancel  context.CancelFunc
	done    chan struct{} // closed when the session ends
	endOnce sync.Once
	err     error // why the session ended; written once, before done is closed

	wg      sync.WaitGroup  // keepAliveLoop and fenceLoop
	ka      keepAliveStream // opened by Join, then used by keepAliveLoop only
	mutexes *concurrency.Session

	closeOnce sync.Once
	closeErr  error // written once in Close
}

// Join registers cfg.NodeID: it grants a lease of cfg.TTL and creates the
// node's key under it, holding cfg.Info as JSON, only if the key is absent.
//
// If another lease holds the key, that is a live node with the same id or a
// crashed one whose lease has not expired yet: Join watches the key for the
// holder's remaining TTL plus a second (etcd reports whole seconds). If the
// key goes, Join registers; if the holder's lease has been refreshed in the
// meantime, a live node holds it and Join returns an error naming the id
// that wraps ErrNodeExists. A key without a lease is never released and is
// reported the same way. A node that rejoins after its session ended should
// Close the old Session first, which frees the key at once instead of after
// the old lease's TTL.
//
// ctx bounds the whole of Join, including that wait; it does not bound the
// Session, which lives until it is fenced, loses its lease or is closed.
func Join(ctx context.Context, cfg Config) (*Session, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.applyDefaults()
	if cfg.Info.StartedAt.IsZero() {
		cfg.Info.StartedAt = time.Now().UTC().Truncate(time.Millisecond)
	}
	value, err := json.Marshal(cfg.Info)
	if err != nil {
		return nil, fmt.Errorf("membership: encode node info: %w", err)
	}

	s := &Session{
		cli:  cfg.Client,
		cfg:  cfg,
		key:  nodeKey(cfg.Prefix, cfg.NodeID),
		log:  cfg.Logger.With("node", cfg.NodeID),
		base: time.Now(),
		done: make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	// The keep-alive stream opens before the lease's TTL runs: opening it
	// may wait for a login (keepAliveStream).
	if err := s.ka.open(ctx, s.ctx, s.cli); err != nil {
		s.cancel()
		return nil, err
	}
	lease, granted, ttl, err := s.register(ctx, string(value))
	if err != nil {
		s.ka.close()
		s.cancel()
		return nil, err
	}
	s.lease = lease
	s.log = s.log.With("lease", fmt.Sprintf("%x", int64(lease)))
	// etcd starts the lease's TTL when it receives the grant, after it was
	// sent: the same reasoning as for keep-alives.
	s.deadline.Store(granted + int64(ttl-cfg.FenceMargin))

	// concurrency.NewSession starts the client's own KeepAlive on the lease.
	// That is harmless for fencing, which only counts this session's
	// acknowledged keep-alives (extra ones can only make the lease outlive
	// the deadline), and it stops when s.ctx is canceled: a session that
	// ended leaves nothing refreshing its lease.
	s.mutexes, err = concurrency.NewSession(s.cli,
		concurrency.WithLease(lease),
		concurrency.WithContext(s.ctx),
		concurrency.WithTTL(int(ttl/time.Second)))
	if err == nil && s.mutexes == nil {
		// NewSession returns neither when the client's KeepAlive gives no
		// channel.
		err = errors.New("no keep-alive channel")
	}
	if err != nil {
		s.ka.close()
		s.cancel()
		s.revokeQuietly(lease)
		return nil, fmt.Errorf("membership: session for partition locks: %w", err)
	}

	s.wg.Add(2)
	go s.keepAliveLoop()
	go s.fenceLoop()
	s.log.Info("membership: joined", "key", s.key, "ttl", ttl, "deadline_in", time.Until(s.Deadline()).Round(time.Millisecond))
	return s, nil
}

// register grants a lease and creates the node key under it, waiting out a
// crashed holder. It returns the lease, the monotonic time the grant was
// sent and the TTL etcd granted (it may raise a short TTL to its minimum).
func (s *Session) register(ctx context.Context, value string) (clientv3.LeaseID, int64, time.Duration, error) {
	ttlSeconds := int64(s.cfg.TTL / time.Second)
	for {
		sent := s.now()
		g, err := s.cli.Grant(ctx, ttlSeconds)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("membership: grant lease: %w", err)
		}
		resp, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(s.key), "=", 0)).
			Then(clientv3.OpPut(s.key, value, clientv3.WithLease(g.ID))).
			Else(clientv3.OpGet(s.key)).
			Commit()
		if err != nil {
			s.revokeQuietly(g.ID)
			return 0, 0, 0, fmt.Errorf("membership: register %s: %w", s.key, err)
		}
		if resp.Succeeded {
			return g.ID, sent, time.Duration(g.TTL) * time.Second, nil
		}
		// Held: give our lease back rather than keep it alive while waiting,
		// which may take longer than its TTL.
		s.revokeQuietly(g.ID)
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		if err := s.awaitRelease(ctx, clientv3.LeaseID(kvs[0].Lease), resp.Header.Revision); err != nil {
			return 0, 0, 0, err
		}
	}
}

// awaitRelease waits while the lease holder keeps the node key. It returns
// nil once the key changed (deleted or replaced: try again), an error
// wrapping ErrNodeExists once the holder has refreshed its lease while we
// waited, or ctx's error.
func (s *Session) awaitRelease(ctx context.Context, holder clientv3.LeaseID, rev int64) error {
	if holder == clientv3.NoLease {
		return &nodeExistsError{id: s.cfg.NodeID}
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := s.cli.Watch(wctx, s.key, clientv3.WithRev(rev+1))

	for first := true; ; first = false {
		ttl, err := s.cli.TimeToLive(ctx, holder)
		if err != nil {
			return fmt.Errorf("membership: node id %q is held; look up its lease: %w", s.cfg.NodeID, err)
		}
		if !first && ttl.TTL > 0 {
			// The holder's remaining TTL has fully elapsed since the first
			// look and the lease is still alive: someone refreshes it.
			return &nodeExistsError{id: s.cfg.NodeID}
		}
		// etcd truncates the remaining TTL to whole seconds: the lease
		// expires within TTL+1 s unless refreshed. After that, an expired
		// lease (TTL <= 0) is being revoked through raft: look again each
		// second until the key goes.
		wait := time.Second
		if first && ttl.TTL > 0 {
			wait += time.Duration(ttl.TTL) * time.Second
			s.log.Info("membership: node id is held by another lease; waiting for it to expire",
				"holder", fmt.Sprintf("%x", int64(holder)), "wait", wait)
		}
		changed, err := waitKeyChange(ctx, &wch, wait)
		if err != nil {
			return &heldError{id: s.cfg.NodeID, err: err}
		}
		if changed {
			return nil
		}
	}
}

// waitKeyChange waits up to d for an event on *wch. A failed watch is
// dropped (*wch = nil): the caller's lease checks still decide, only later.
func waitKeyChange(ctx context.Context, wch *clientv3.WatchChan, d time.Duration) (bool, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-timer.C:
			return false, nil
		case wr, ok := <-*wch:
			switch {
			case !ok || wr.Err() != nil:
				*wch = nil
			case len(wr.Events) > 0:
				return true, nil
			}
		}
	}
}

// now is the session's monotonic clock: nanoseconds since base.
func (s *Session) now() int64 { return int64(time.Since(s.base)) }

// keepAliveLoop refreshes the lease every KeepAliveInterval and moves the
// fencing deadline on each acknowledgement. Each keep-alive waits at most one
// interval for its answer; a failed one is retried after a quarter interval.
func (s *Session) keepAliveLoop() {
	defer s.wg.Done()
	defer s.ka.close()
	interval := s.cfg.KeepAliveInterval
	retry := max(interval/4, 10*time.Millisecond)
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-timer.C:
		}
		err := s.ka.open(s.ctx, s.ctx, s.cli)
		sent := s.now()
		var ttl int64
		if err == nil {
			ttl, err = s.ka.keepAlive(s.lease, interval)
		}
		switch {
		case err == nil && ttl > 0:
			s.extend(sent + int64(time.Duration(ttl)*time.Second-s.cfg.FenceMargin))
			timer.Reset(max(0, time.Duration(sent+int64(interval)-s.now())))
		case s.ctx.Err() != nil:
			return
		case err == nil: // etcd answers TTL 0 for a lease it does not know
			s.end(ErrLeaseLost)
			return
		default:
			s.log.Warn("membership: keep-alive failed", "err", err,
				"fenced_in", time.Until(s.Deadline()).Round(time.Millisecond))
			timer.Reset(retry)
		}
	}
}

// keepAliveStream is the session's lease keep-alive gRPC stream, kept open
// from one keep-alive to the next. On an etcd with password authentication
// every stream the client opens costs a login first (clientv3 calls
// Authenticate for each: a bcrypt on etcd, queued behind every other
// login), and clientv3's KeepAliveOnce opens a stream for each keep-alive:
// with it, a join that opened other streams (watches) fenced the node. The
// stream is opened again only after a failure, one login at a time, and
// opening it is bounded by the session, not by a keep-alive's timeout: a
// login abandoned only queues another. Not safe for concurrent use.
type keepAliveStream struct {
	cancel context.CancelFunc // ends the stream; nil when closed
	stream pb.Lease_LeaseKeepAliveClient
}

// open opens the stream under life unless it is open. ctx bounds only the
// opening.
func (k *keepAliveStream) open(ctx, life context.Context, cli *clientv3.Client) error {
	if k.stream != nil {
		return nil
	}
	sctx, cancel := context.WithCancel(life)
	stop := context.AfterFunc(ctx, cancel)
	stream, err := clientv3.RetryLeaseClient(cli).LeaseKeepAlive(sctx)
	if !stop() || err != nil {
		cancel()
		if err == nil {
			err = ctx.Err()
		}
		return fmt.Errorf("membership: open a lease keep-alive stream: %w", err)
	}
	k.cancel, k.stream = cancel, stream
	return nil
}

// keepAlive sends one keep-alive for lease on the open stream and returns
// the TTL etcd answered (0: etcd does not know the lease), waiting at most
// timeout. A keep-alive that fails or times out closes the stream, so that
// a late answer is never taken for the next keep-alive's.
func (k *keepAliveStream) keepAlive(lease clientv3.LeaseID, timeout time.Duration) (int64, error) {
	timer := time.AfterFunc(timeout, k.cancel)
	err := k.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(lease)})
	var resp *pb.LeaseKeepAliveResponse
	if err == nil {
		resp, err = k.stream.Recv()
	}
	timedOut := !timer.Stop()
	if timedOut || err != nil {
		k.close()
	}
	switch {
	case timedOut && err != nil:
		return 0, fmt.Errorf("membership: keep-alive: no answer within %v", timeout)
	case err != nil:
		return 0, fmt.Errorf("membership: keep-alive: %w", err)
	}
	return resp.TTL, nil
}

// close ends the stream, if open.
func (k *keepAliveStream) close() {
	if k.cancel != nil {
		k.cancel()
	}
	*k = keepAliveStream{}
}

// extend moves the deadline forward to d, unless the session is fenced: a
// late acknowledgement never revives a fenced session.
func (s *Session) extend(d int64) {
	if s.Fenced() {
		return
	}
	for {
		cur := s.deadline.Load()
		if d <= cur || s.deadline.CompareAndSwap(cur, d) {
			return
		}
	}
}

// fenceLoop ends the session when the deadline passes, so that Done closes
// even if nobody calls Fenced.
func (s *Session) fenceLoop() {
	defer s.wg.Done()
	timer := time.NewTimer(s.untilDeadline())
	defer timer.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-timer.C:
			if s.Fenced() {
				return
			}
			// The deadline moved while the timer ran: it only moves forward.
			timer.Reset(s.untilDeadline())
		}
	}
}

func (s *Session) untilDeadline() time.Duration {
	return max(0, time.Duration(s.deadline.Load()-s.now()))
}

// end ends the session for reason, once: Fenced turns true, Done closes and
// the keep-alives (ours and the concurrency session's) stop.
func (s *Session) end(reason error) {
	s.endOnce.Do(func() {
		s.err = reason
		s.fenced.Store(true)
		close(s.done)
		s.cancel()
		if !errors.Is(reason, ErrClosed) { // Close logs once it revoked
			s.log.Warn("membership: session ended", "reason", reason)
		}
	})
}

// Fenced reports whether the node must stop dispatching: the fencing
// deadline has passed or the session has ended. Once true it stays true. It
// costs two atomic loads and a monotonic clock reading; callers check it
// before every dispatch batch.
func (s *Session) Fenced() bool {
	if s.fenced.Load() {
		return true
	}
	if s.now() < s.deadline.Load() {
		return false
	}
	s.end(ErrFenced)
	return true
}

// Deadline is the fencing deadline: the send time of the last acknowledged
// keep-alive (or of the grant) plus the TTL etcd granted minus FenceMargin.
// It carries a monotonic clock reading, so comparing it with time.Now() is
// immune to wall-clock jumps. It only moves forward, and stops moving when
// the session ends.
func (s *Session) Deadline() time.Time {
	return s.base.Add(time.Duration(s.deadline.Load()))
}

// Done is closed when the fencing deadline passes or the session ends (lease
// lost, Close); no fire may be dispatched after that. Err says why.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while Done is open, then ErrFenced, ErrLeaseLost or ErrClosed.
func (s *Session) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Lease is the session's etcd lease: the node key and every partition lock
// taken through Mutexes live under it.
func (s *Session) Lease() clientv3.LeaseID { return s.lease }

// NodeID is the id the session registered.
func (s *Session) NodeID() string { return s.cfg.NodeID }

// Key is the node key the session registered, under its lease: a write
// conditioned on clientv3.LeaseValue(Key()) equal to Lease() succeeds only
// while the session's lease lives.
func (s *Session) Key() string { return nodeKey(s.cfg.Prefix, s.cfg.NodeID) }

// Leave marks the node as leaving (NodeInfo.Leaving) in its key, which
// stays under the lease: the other nodes leave it out of the ring and take
// its partitions over while it still fires them. Close removes the key.
func (s *Session) Leave(ctx context.Context) error {
	s.infoMu.Lock()
	defer s.infoMu.Unlock()
	info := s.cfg.Info
	info.Leaving = true
	return s.putInfo(ctx, info, "mark %s as leaving")
}

// Publish replaces what the node publishes under its key (its
// capabilities, say) with info. The id, the start time and the leaving
// mark stay the session's: info cannot change them.
func (s *Session) Publish(ctx context.Context, info NodeInfo) error {
	s.infoMu.Lock()
	defer s.infoMu.Unlock()
	info.ID, info.StartedAt, info.Leaving = s.cfg.Info.ID, s.cfg.Info.StartedAt, s.cfg.Info.Leaving
	return s.putInfo(ctx, info, "publish the node info of %s")
}

// Info returns what the node publishes under its key.
func (s *Session) Info() NodeInfo {
	s.infoMu.Lock()
	defer s.infoMu.Unlock()
	return s.cfg.Info
}

// putInfo writes info under the node key, on the condition that the key is
// still the session's, and keeps it as the session's on success. what
// names the operation for the error, with a %s for the node id. The
// caller holds infoMu.
func (s *Session) putInfo(ctx context.Context, info NodeInfo, what string) error {
	value, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("membership: encode node info: %w", err)
	}
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(s.key), "=", int64(s.lease))).
		Then(clientv3.OpPut(s.key, string(value), clientv3.WithLease(s.lease))).
		Commit()
	if err != nil {
		return fmt.Errorf("membership: "+what+": %w", s.cfg.NodeID, err)
	}
	if !resp.Succeeded {
		s.end(ErrLeaseLost)
		return ErrLeaseLost
	}
	s.cfg.Info = info
	return nil
}

// Lost ends the session because the caller learned that its lease is gone
// (a write conditioned on it failed, or its node key vanished): Fenced is
// true at once, without waiting for the keep-alives to notice.
func (s *Session) Lost() { s.end(ErrLeaseLost) }

// Mutexes is a concurrency.Session bound to the session's lease, for the
// partition locks (concurrency.NewMutex). Its Ctx is canceled and its Done
// closed when this Session ends, after which locks taken through it are
// only as good as the lease (Fenced is true by then). Do not Close or
// Orphan it: Close on this Session revokes the lease, which releases every
// lock at once.
//
// It runs the etcd client's own keep-alive on the lease besides ours. The
// fencing deadline ignores those keep-alives, so they can only make the
// lease outlive the deadline (the safe direction), and they stop when this
// Session ends.
func (s *Session) Mutexes() *concurrency.Session { return s.mutexes }

// Close ends the session (if it has not ended), stops its goroutines and
// revokes the lease, so the node key and every lock held under the lease go
// at once: a graceful leave. The revocation waits at most TTL, after which
// an unreachable etcd will have expired the lease anyway; its error is
// returned (a lease that is already gone is not an error). Close logs
// "membership: session closed" once the revocation is over, with its
// outcome: not before, while the node still waits for etcd. Close is
// idempotent: later calls return the first call's result.
func (s *Session) Close() error {
	s.closeOnce.Do(func() {
		s.end(ErrClosed)
		s.wg.Wait()
		<-s.mutexes.Done()
		start := time.Now()
		if err := s.cli.Ctx().Err(); err != nil {
			// A closed client would retry the revoke until the timeout.
			s.closeErr = fmt.Errorf("membership: revoke lease %x: client closed: %w", int64(s.lease), err)
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.TTL)
			s.closeErr = Revoke(ctx, s.cli, s.lease)
			cancel()
		}
		if s.closeErr != nil {
			s.log.Warn("membership: session closed; its lease was not revoked and expires on its own within its TTL",
				"ttl", s.cfg.TTL, "waited", time.Since(start).Round(time.Millisecond), "err", s.closeErr)
			return
		}
		s.log.Info("membership: session closed, its lease revoked")
	})
	return s.closeErr
}

// revokeQuietly revokes a lease Join granted but cannot use. A failure only
// leaves the lease to expire on its own.
func (s *Session) revokeQuietly(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
	defer cancel()
	if err := Revoke(ctx, s.cli, id); err != nil {
		s.log.Debug("membership: revoke unused lease", "err", err)
	}
}

// Revoke revokes lease id, and with it every key held under it. A lease
// etcd no longer has (expired, or revoked before) is not an error.
func Revoke(ctx context.Context, cli *clientv3.Client, id clientv3.LeaseID) error {
	_, err := cli.Revoke(ctx, id)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) && !errors.Is(err, rpctypes.ErrGRPCLeaseNotFound) {
		return fmt.Errorf("membership: revoke lease %x: %w", int64(id), err)
	}
	return nil
}
