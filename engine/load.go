package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

const loadChunk = 4096 // tasks per command to the dispatch loop

// decoder turns stored tasks (etcd's JSON, or a cached shape: shape.go)
// into taskDefs. It shares profiles and shapes within one load, so a
// million tasks with one profile build one executor, and a million cached
// tasks of one shape decode one JSON.
type decoder struct {
	e       *Engine
	profs   map[string]*profile
	shapes  map[string]*shape // by cached value
	key     []byte            // a shape key being built (appendShapeKey)
	profKey []byte            // a profile key being built (appendProfileKey)
}

func (e *Engine) decoder() *decoder {
	return &decoder{e: e, profs: map[string]*profile{}, shapes: map[string]*shape{}}
}

// def decodes a stored task.
func (d *decoder) def(id string, value []byte) (taskDef, error) {
	def, _, err := d.decode(id, value)
	return def, err
}

// decode decodes a stored task and returns, besides, the value to cache
// for it: its shape once another task of that shape was seen, else value.
func (d *decoder) decode(id string, value []byte) (taskDef, []byte, error) {
	if len(value) > 0 && value[0] == shapeMark {
		def, err := d.fromShape(id, value)
		return def, value, err
	}
	t, err := registry.DecodeFiring(id, value)
	if err != nil {
		return taskDef{}, nil, err
	}
	def, key, err := d.build(&t)
	if err != nil {
		return taskDef{}, nil, err
	}
	if key != nil {
		d.key = appendShapeKey(d.key[:0], key, &t)
		if c := d.e.shapes.code(d.key, &t); c != nil {
			return def, c, nil
		}
	}
	return def, value, nil
}

// fromShape decodes a cached shape, value: JSON once per load, then a
// lookup.
func (d *decoder) fromShape(id string, value []byte) (taskDef, error) {
	s := d.shapes[string(value)]
	if s == nil {
		t, err := registry.DecodeFiring(id, value[1:])
		if err != nil {
			return taskDef{}, err
		}
		def, key, err := d.build(&t)
		if err != nil {
			return taskDef{}, err
		}
		if key == nil {
			return taskDef{}, fmt.Errorf("stored task %q: a cached shape with a window", id)
		}
		s = &shape{spec: t.Schedule, zone: t.Timezone, paused: t.Paused, prof: def.prof}
		d.shapes[string(value)] = s
		return def, nil
	}
	// The handle may differ from the shape's first task: H fields hash the id.
	h, err := d.e.scheds.Intern(s.spec, s.zone, id)
	if err != nil {
		return taskDef{}, fmt.Errorf("stored task %q: %w", id, err)
	}
	return d.place(id, h, s.prof, s.paused), nil
}

// place is the def of task id: its schedule, profile and pause, placed in
// its partition.
func (d *decoder) place(id string, h schedule.Handle, prof *profile, paused bool) taskDef {
	hash := xxhash.Sum64String(id)
	return taskDef{id: id, hash: hash, part: int(hash % uint64(d.e.cfg.Partitions)), sched: h, prof: prof, paused: paused}
}

// build turns a decoded task into its def. It also returns the task's
// profile key when its fires depend on nothing but its shape (shape.go),
// else nil; the key is good until the next build.
func (d *decoder) build(t *task.Task) (taskDef, []byte, error) {
	id := t.ID
	spec := t.Schedule
	if _, once, _ := schedule.At(spec, t.Timezone); once {
		spec = atSchedule // bounded to its one second by its window
	}
	h, err := d.e.scheds.Intern(spec, t.Timezone, id)
	if err != nil {
		return taskDef{}, nil, fmt.Errorf("stored task %q: %w", id, err)
	}
	var win *window
	if t.NotBefore != (time.Time{}) || t.NotAfter != (time.Time{}) || t.MaxFires > 0 || spec != t.Schedule {
		win = windowOf(t, d.e.scheds.Get(h), d.e.cfg.Clock.Now())
	}
	d.profKey = appendProfileKey(d.profKey[:0], t)
	profLen := len(d.profKey) // the profile's part, without the window's
	d.profKey = appendWindowKey(d.profKey, h, win, t)
	prof := d.profs[string(d.profKey)]
	if prof == nil {
		key := string(d.profKey)
		if prof, err = d.e.execs.newProfile(key, t); err != nil {
			return taskDef{}, nil, fmt.Errorf("stored task %q: %w", id, err)
		}
		prof.win, prof.defLen = win, profLen
		d.profs[key] = prof
	}
	def := d.place(id, h, prof, t.Paused)
	if !plain(t, spec) {
		return def, nil, nil
	}
	return def, d.profKey[:profLen], nil
}

// prepared is a partition read ahead of its lock (make-before-break): its
// tasks decoded as of revision rev. While a node prepares a partition, its
// previous owner still fires it: the hand-over then costs one request for
// the changes since the read, not the partition's size.
type prepared struct {
	p    int
	rev  int64
	defs []taskDef
	// created is the latest revision at which a task of defs, or of the
	// changes since the read (changesSince), was created, as etcd or the
	// cache said; 0 when not known: no task, or a task cached by a version
	// that did not keep creations (partState.created).
	created int64
}

// prepareBounded is prepareTurn, unless p was prepared ahead of a dead
// node's lease's end (standby.go): once a standby read of p under way
// ended, an acquire takes what it read rather than read p again. Read
// again meanwhile, p's cache would be replaced by whichever read ends
// last, and the standby's, the older, would take back the changes the
// acquire's catch-up and watch had applied.
func (e *Engine) prepareBounded(ctx context.Context, p int) (*prepared, error) {
	prep, err := e.standby.take(ctx, p)
	if prep != nil || err != nil {
		return prep, err // prepared already: no turn to wait for
	}
	return e.prepareTurn(ctx, p)
}

// prepareTurn is prepare, at most preparing at once per node: reading
// and decoding are CPU-bound, and hundreds of partitions prepared at once
// (a join) would take the dispatch loop's turn on the CPU, so that the
// partitions already armed fire late.
func (e *Engine) prepareTurn(ctx context.Context, p int) (*prepared, error) {
	select {
	case e.preparing <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-e.preparing }()
	return e.prepare(ctx, p)
}

// prepare reads partition p ahead of its lock: from the Badger cache when
// it has the partition (docs/design.md, invariant 7: no range read), else with
// a range read, which replaces the cache. Every change the cache is given
// after (changesSince, watch) thus lands on a partition Reset at least
// once, whose task count store.Partition checks: one never synced, or
// cached by a version before counts, reads as revision 0 and is Reset
// here; a failed Reset stops its cache writes until one succeeds
// (dropCache).
func (e *Engine) prepare(ctx context.Context, p int) (*prepared, error) {
	if e.store != nil {
		if prep, err := e.prepareCached(ctx, p); prep != nil || err != nil {
			return prep, err
		}
	}
	return e.rangeLoad(ctx, p, e.decoder())
}

// prepareCached prepares p from the Badger cache, or returns nil when the
// cache cannot serve: it has nothing, cannot be read, holds a task it
// cannot decode (a value corrupted on disk: etcd has the good one), or is
// ahead of etcd (etcd was restored or replaced under it).
func (e *Engine) prepareCached(ctx context.Context, p int) (*prepared, error) {
	d := e.decoder()
	var defs []taskDef
	var created int64 // -1: a task cached without its creation
	rev, err := e.store.Partition(uint32(p), func(id string, value []byte, c int64) error {
		def, err := d.def(id, value)
		if err != nil {
			return fmt.Errorf("cached task %q: %w", id, err)
		}
		def.createRev = c
		defs = append(defs, def)
		if c == 0 || created < 0 {
			created = -1
		} else {
			created = max(created, c)
		}
		return nil
	})
	if err != nil {
		e.log.Warn("reading the partition cache failed; loading from etcd", "partition", p, "err", err)
		return nil, nil
	}
	if rev == 0 {
		return nil, nil
	}
	now, err := e.revs.notAhead(ctx, rev, e.appliedRevision, e.reg.Revision)
	if err != nil {
		return nil, err
	}
	if rev > now {
		// etcd was restored or replaced under the cache: every partition
		// is likely so, and one warning says it (a node holds thousands).
		level := slog.LevelDebug
		if e.revs.warned.CompareAndSwap(false, true) {
			level = slog.LevelWarn
		}
		e.log.Log(ctx, level, "the partition cache is ahead of etcd (restored under it?); loading from etcd, and any other partition so found (logged at debug)",
			"partition", p, "cached", rev, "etcd", now)
		return nil, nil
	}
	return &prepared{p: p, rev: rev, defs: defs, created: max(created, 0)}, nil
}

// revisions shares reads of etcd's revision between the partitions
// prepared from the cache: a warm restart asks about once a second, not
// once per partition (each read waited behind the acquires' writes).
type revisions struct {
	sem  chan struct{} // a slot: one read at a time, which the others then share
	rev  int64         // the last revision read, under sem
	read time.Time     // when, under sem: the wall clock's, as it dates a read of etcd, not a fire

	warned atomic.Bool // a partition was found ahead of etcd, and the log said so
}

func newRevisions() *revisions { return &revisions{sem: make(chan struct{}, 1)} }

// notAhead returns a revision etcd had at most revisionFresh ago, or now,
// that is at least cached when etcd has it: a cache synced to cached is then
// not ahead of etcd (restored or replaced under it). A cached revision past
// the last one read is always checked with a new read. It asks applied
// first (the revision the etcd member answering has applied: a local
// read, which waits for no consensus), then, when that is behind cached
// (a lagging member), current (the cluster's).
func (r *revisions) notAhead(ctx context.Context, cached int64, applied, current func(context.Context) (int64, error)) (int64, error) {
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-r.sem }()
	if cached <= r.rev && time.Since(r.read) < revisionFresh {
		return r.rev, nil
	}
	now, err := applied(ctx)
	if err != nil || now < cached {
		if now, err = current(ctx); err != nil {
			return 0, err
		}
	}
	r.rev, r.read = now, time.Now()
	return now, nil
}

// appliedRevision returns the revision the etcd member this node talks to
// has applied, with a serializable read: every revision up to it was
// committed by the cluster.
func (e *Engine) appliedRevision(ctx context.Context) (int64, error) {
	resp, err := e.cli.Get(ctx, e.keys.checkpoint(0), clientv3.WithCountOnly(), clientv3.WithSerializable())
	if err != nil {
		return 0, fmt.Errorf("read the applied revision: %w", err)
	}
	return resp.Header.Revision, nil
}

// arm hands a prepared partition's tasks (a.prep) to the loop, brought up
// to date with a.touched (catchup.go) up to revision a.rev, resuming after
// a.resume: every task is armed from the resume point as etcd had it when
// the partition became ours. a.applied, when not 0, is the revision up to
// which the previous owner armed the partition's changes, which decides
// its one-shots (decideApplied) and which tasks its fires and health are
// of (heldHanded); which of a.handed's end_waits and retries hold goes by
// the revision they came with (heldEndWaits, heldRetries).
func (e *Engine) arm(ctx context.Context, a *arming) error {
	prep, touched, resume, applied, rev := a.prep, a.touched, a.resume, a.applied, a.rev
	p := prep.p
	defs := prep.defs
	// One-shots as read before their changes: one held at the same time,
	// written before resume, was the previous owner's to decide (fired or
	// missed), and a write since after resume (a label, a pause and a
	// resume) must not fire it again (startOf). The watch path fires a
	// one-shot again only when a write changes its time. Not needed where
	// applied says what the previous owner had (decideApplied).
	var before map[string]*window
	if len(touched) > 0 {
		defs = slices.DeleteFunc(defs, func(d taskDef) bool {
			_, ok := touched[d.id]
			if w := d.prof.win; ok && applied == 0 && w != nil && w.once && w.written <= resume {
				if before == nil {
					before = map[string]*window{}
				}
				before[d.id] = w
			}
			return ok
		})
		d := e.decoder()
		for id, value := range touched {
			if value == nil {
				continue // deleted
			}
			if def, err := d.def(id, value); err != nil {
				e.log.Warn("skipping a task change", "partition", p, "err", err)
			} else {
				if w, b := def.prof.win, before[id]; w != nil && w.once && b != nil && b.from == w.from {
					def.decided = true
				}
				defs = append(defs, def)
			}
		}
	}
	a.defs = defs
	var err error
	if applied != 0 {
		err = e.decideApplied(ctx, a)
	} else {
		err = e.decideOneShots(ctx, p, defs, resume, rev, before)
	}
	if err != nil {
		return err
	}
	if err := e.heldEndWaits(ctx, a); err != nil {
		return err
	}
	if err := e.heldHanded(ctx, a); err != nil {
		return err
	}
	if err := e.heldRetries(ctx, a); err != nil {
		return err
	}
	// Not known (no task read, or one cached by a version that did not
	// keep creations): every trigger older than the acquisition is read.
	created := prep.created
	if created == 0 {
		created = rev
	}
	return e.send(ctx, loadCmd{part: p, fence: a.fence, resume: resume, rev: rev, created: created, handed: *a.handed}, defs)
}

// heldEndWaits keeps in waits (a.handed.endWaits: the tasks whose last
// fire ended while paused on the partition's previous owner) only the
// tasks of a.defs that owner had, having armed the partition's changes up
// to applied (a.handed.endWaitsApplied). One deleted and put again since
// is another task, which that end says nothing of: marked by its id, it
// was deleted at its resume, even one paused through its time that never
// fired, which one owner (whose delete took the mark with the record)
// keeps. A definition read
// at or before applied is that owner's; of the others, etcd's history
// tells (registry.HeldAt). One whose history etcd no longer holds loses
// its mark, logged: left ended rather than deleted unsure.
func (e *Engine) heldEndWaits(ctx context.Context, a *arming) error {
	applied, waits := a.handed.endWaitsApplied, a.handed.endWaits
	if len(waits) == 0 {
		return nil
	}
	dec := e.decoder()
	for i := range a.defs {
		d := &a.defs[i]
		if !waits[d.id] || a.heldAsRead(d, applied) {
			continue
		}
		had, err := e.heldDef(ctx, a.prep.p, d, dec, "a delete_after_fire task whose last fire ended while it was paused stays after its resume",
			func(ctx context.Context) ([]byte, error) { return e.reg.HeldAt(ctx, d.id, a.rev, applied) })
		if err != nil {
			return err
		}
		// Edited since that owner had it: an edit since the last fire
		// ended wins, as upsert's on one owner does.
		if had == nil || !sameTask(had.sched, had.prof, d.sched, d.prof) {
			delete(waits, d.id)
		}
	}
	return nil
}

// heldHanded keeps in a.handed's lists by task id (after, pending,
// health) only the tasks of a.defs that the partition's previous owner
// had, having armed its changes up to a.applied (createdAfter). One
// deleted and put again since is another task, which they say nothing of:
// by its id alone, it took the retry and the fire the previous owner
// handed over unrun, resumed after that owner's last fire, and inherited
// its failures. Nothing is known without a.applied: the lists go by id.
func (e *Engine) heldHanded(ctx context.Context, a *arming) error {
	applied, handed := a.applied, a.handed
	if applied == 0 || len(handed.after) == 0 && len(handed.pending) == 0 && len(handed.health) == 0 {
		return nil
	}
	named := make(map[string]bool, len(handed.after)+len(handed.pending)+len(handed.health))
	for id := range handed.after {
		named[id] = true
	}
	for id := range handed.health {
		named[id] = true
	}
	for _, f := range handed.pending {
		named[f.ID] = true
	}
	others, err := e.createdAfter(ctx, a, applied, named)
	if err != nil || len(others) == 0 {
		return err
	}
	for id := range others {
		delete(handed.after, id)
		delete(handed.health, id)
	}
	// A new list: the one read may be the checkpoint this node kept in
	// memory (resume), which an acquire undone reads again.
	var pending []pendingFire
	for _, f := range handed.pending {
		if !others[f.ID] {
			pending = append(pending, f)
		}
	}
	handed.pending = pending
	return nil
}

// heldRetries adds to a.handed's pending fires the retries a crashed or
// fenced session's watermark carried (handedTo.retries) of the tasks of
// a.defs that session had, having armed the partition's changes up to the
// revision they came with (createdAfter): the retry of a task deleted and
// put again since is not the new task's. Those that came with no revision
// are dropped: nothing tells whose they are. So is a fire of the schedule
// (one that waited for the running one) due after a.resume, the point the
// partition is armed from: the schedule fires it again.
func (e *Engine) heldRetries(ctx context.Context, a *arming) error {
	handed := a.handed
	rets := handed.retries
	if rets.Applied == 0 || len(rets.Fires) == 0 {
		return nil
	}
	named := make(map[string]bool, len(rets.Fires))
	for _, f := range rets.Fires {
		named[f.ID] = true
	}
	others, err := e.createdAfter(ctx, a, rets.Applied, named)
	if err != nil {
		return err
	}
	// A new list, as heldHanded's.
	pending := slices.Clip(handed.pending)
	for _, f := range rets.Fires {
		if !others[f.ID] && (!f.scheduled() || f.Due.UnixNano() <= a.resume) {
			pending = append(pending, f)
		}
	}
	handed.pending = pending
	return nil
}

// createdAfter returns the tasks of defs that named names and that were
// created after applied. A creation read from etcd or the cache says
// which; a definition read at or before applied (from a cache that did
// not keep its creation, at its read) and unchanged since was created at
// or before it; the creation of the others (changed since the read) is
// read from etcd.
func (e *Engine) createdAfter(ctx context.Context, a *arming, applied int64, named map[string]bool) (map[string]bool, error) {
	others := map[string]bool{}
	var ask []string
	for i := range a.defs {
		d := &a.defs[i]
		switch {
		case !named[d.id]:
		case d.createRev != 0:
			if d.createRev > applied {
				others[d.id] = true
			}
		case !a.heldAsRead(d, applied):
			ask = append(ask, d.id)
		}
	}
	for chunk := range slices.Chunk(ask, registry.MaxTxnOps) {
		rctx, cancel := context.WithTimeout(ctx, etcdTimeout)
		created, _, err := e.reg.Created(rctx, chunk)
		cancel()
		if err != nil {
			return nil, err
		}
		for id, c := range created {
			if c == 0 || c > applied { // 0: deleted since, which the watch brings
				others[id] = true
			}
		}
	}
	return others, nil
}

// decideApplied decides the one-shots of a.defs whose time is not after
// resume (a.resume) by what the partition's previous owner had of them,
// having armed its changes up to revision applied (a.applied), and not by
// their updated_at, the writing node's clock: one it had at that time
// fired there or was decided by its misfire policy (taskDef.decided); one
// it never had so (put after applied, or whose time a write after it
// moved) is armed at its time as the watch arms a put (taskDef.put). By
// updated_at, a put that reached that owner only after its release (so
// that it never armed it), stamped before the release's mark by a node
// whose clock was behind, was taken as decided and fired nowhere; one that
// owner fired, stamped after the mark by a node whose clock was ahead, was
// taken as a put and fired again. A definition read from etcd at or before
// applied, or read from a cache synced to it and unchanged since, was that
// owner's as it is; of the others, a read of what changed after applied
// tells those a cache read past it left unknown (registry.ChangesAt), and
// etcd's history of each task changed, up to a.rev, what that owner had
// (registry.HeldAt). One whose history etcd no longer holds is armed as a
// put: a miss would be worse than a repeat.
func (e *Engine) decideApplied(ctx context.Context, a *arming) error {
	p, defs, touched, resume, applied := a.prep.p, a.defs, a.touched, a.resume, a.applied
	var ask []int   // the one-shots of defs its previous owner may not have had as they are
	cached := false // some of them come from a read of the cache past applied
	for i := range defs {
		d := &defs[i]
		w := d.prof.win
		if w == nil || !w.once || w.from > resume {
			continue
		}
		if !a.heldAsRead(d, applied) {
			ask = append(ask, i)
			_, changed := touched[d.id]
			cached = cached || !changed && d.modRev == 0
			continue
		}
		d.decided, d.put = true, false
	}
	if len(ask) == 0 {
		return nil
	}
	var since map[string][]byte
	if cached {
		// All of the partition's tasks at rev: ChangesAt then reads no ids.
		had := make(map[string]bool, len(defs))
		for i := range defs {
			had[defs[i].id] = true
		}
		rctx, cancel := context.WithTimeout(ctx, etcdTimeout)
		var err error
		since, _, err = e.reg.ChangesAt(rctx, p, had, applied, a.rev)
		cancel()
		if err != nil {
			return err
		}
	}
	dec := e.decoder()
	for _, i := range ask {
		d := &defs[i]
		_, changed := touched[d.id]
		if _, after := since[d.id]; !changed && d.modRev == 0 && !after {
			d.decided, d.put = true, false // read from the cache, unchanged since applied
			continue
		}
		had, err := e.heldItsTime(ctx, p, d, dec, func(ctx context.Context) ([]byte, error) {
			return e.reg.HeldAt(ctx, d.id, a.rev, applied)
		})
		if err != nil {
			return err
		}
		d.decided, d.put = had, !had
	}
	return nil
}

// arming is what an acquire arms a prepared partition with (arm): prep's
// read, brought up to date with touched (the tasks changed since it, their
// last value, nil when deleted) up to revision rev, the tasks then armed
// (defs), the fence and resume point of the load, and what the previous
// owner handed over (handed), which is judged against defs (decideApplied,
// heldEndWaits, heldHanded, heldRetries).
type arming struct {
	prep    *prepared
	defs    []taskDef // prep's read brought up to date with touched: set by arm
	touched map[string][]byte
	rev     int64
	fence   int64
	resume  int64 // the watermark the partition resumes after (unix ns)
	// applied is the revision up to which the previous owner armed the
	// partition's changes; 0 when not known (resumed.applied).
	applied int64
	// handed is what the previous owner handed over: arm keeps of it what
	// holds for defs (heldEndWaits, heldHanded), and adds to its pending
	// fires the retries that do (heldRetries).
	handed *handedTo
}

// heldAsRead reports whether d, of prep's read, is as an owner that armed
// the partition's changes up to revision applied had it: read from etcd
// at or before applied (from the cache, which keeps no modification
// revision, at prep's), and not changed since (touched).
func (a *arming) heldAsRead(d *taskDef, applied int64) bool {
	read := d.modRev
	if read == 0 {
		read = a.prep.rev
	}
	_, changed := a.touched[d.id]
	return !changed && read <= applied
}

// heldItsTime reports whether one-shot d held its time in the version of
// it that read returns from etcd's history (heldDef): what its previous
// owner had. A version etcd no longer holds says no: the one-shot fires
// by its misfire policy, as a put.
func (e *Engine) heldItsTime(ctx context.Context, p int, d *taskDef, dec *decoder, read func(context.Context) ([]byte, error)) (bool, error) {
	old, err := e.heldDef(ctx, p, d, dec, "a one-shot written while its partition changed hands fires by its misfire policy", read)
	if old == nil || err != nil {
		return false, err
	}
	return old.prof.win != nil && old.prof.win.once && old.prof.win.from == d.prof.win.from, nil
}

// heldDef returns task d as its partition's previous owner had it: the
// version that read returns from etcd's history, decoded by dec (nil:
// none). A version etcd no longer holds, or one dec cannot read, is none
// too, logged with then, what becomes of d for want of it.
func (e *Engine) heldDef(ctx context.Context, p int, d *taskDef, dec *decoder, then string, read func(context.Context) ([]byte, error)) (*taskDef, error) {
	rctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	value, err := read(rctx)
	cancel()
	switch {
	case errors.Is(err, registry.ErrVersionGone):
		e.log.Warn(then+": what its previous owner had is no longer in etcd's history", "partition", p, "task", d.id, "err", err)
		return nil, nil
	case err != nil || value == nil:
		return nil, err
	}
	had, err := dec.def(d.id, value)
	if err != nil {
		e.log.Warn(then+": what its previous owner had is unreadable", "partition", p, "task", d.id, "err", err)
		return nil, nil
	}
	return &had, nil
}

// decideOneShots, where the revision the previous owner applied is not
// known (resume says when: decideApplied otherwise), marks as decided
// (taskDef.decided) the one-shots of defs that no read before their last
// write showed (known: those a read did), whose time is not after resume
// and which were written after it, but held that time as last written at
// or before it: etcd's history of the task, up to rev, tells what the
// previous owner knew. A partition read
// after such a write (not prepared ahead, or prepared late) cannot tell a
// write that changed something else (a label, a pause and a resume) from
// a put, and fired the one-shot again. One whose history etcd no longer
// holds (compacted) is taken for a put and fires, as a put does: a miss
// would be worse than a repeat.
func (e *Engine) decideOneShots(ctx context.Context, p int, defs []taskDef, resume, rev int64, known map[string]*window) error {
	at := time.Unix(0, resume)
	var dec *decoder
	for i := range defs {
		d := &defs[i]
		w := d.prof.win
		if w == nil || !w.once || d.decided || w.written <= resume || w.from > resume || known[d.id] != nil {
			continue
		}
		if dec == nil {
			dec = e.decoder()
		}
		held, err := e.heldItsTime(ctx, p, d, dec, func(ctx context.Context) ([]byte, error) {
			return e.reg.WrittenBy(ctx, d.id, rev, at)
		})
		if err != nil {
			return err
		}
		d.decided = held
	}
	return nil
}

// dropCache forgets a partition's cache after a failed write: a cache that
// missed a change must not be trusted, so the next load reads etcd. Until a
// range read resets it, nothing more is written to it: a later write would
// record a revision over a partial cache.
func (e *Engine) dropCache(p int, err error) {
	e.log.Warn("caching task changes failed; the partition will be reloaded from etcd next time", "partition", p, "err", err)
	e.stats.cacheFailed.Add(1)
	e.uncached[p].Store(true)
	if err := e.store.Drop(uint32(p)); err != nil {
		e.log.Warn("dropping the partition cache failed", "partition", p, "err", err)
	}
}

// caching reports whether partition p's changes go to the Badger cache.
func (e *Engine) caching(p int) bool { return e.store != nil && !e.uncached[p].Load() }

// send hands defs, the tasks of load's partition as of its revision, to
// the loop in chunks of load (its partition, fence, resume point,
// revisions and hand-over), and waits until it took them all.
func (e *Engine) send(ctx context.Context, load loadCmd, defs []taskDef) error {
	first := true
	for first || len(defs) > 0 {
		n := min(len(defs), loadChunk)
		c := load
		c.defs, c.first, c.more, c.done = defs[:n], first, n < len(defs), make(chan struct{})
		defs = defs[n:]
		first = false
		if err := e.call(ctx, &c); err != nil {
			return err
		}
		if len(defs) == 0 {
			select {
			case <-c.done:
			case <-e.loopDone:
				return ErrClosed
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// rangeLoad reads partition p from etcd in pages at one revision and
// replaces its cache.
func (e *Engine) rangeLoad(ctx context.Context, p int, d *decoder) (*prepared, error) {
	e.loads.Add(1)
	prep := &prepared{p: p}
	var kvs []store.KV
	rev, err := e.reg.ReadPartition(ctx, p, func(id string, value []byte, modRev, createRev int64) {
		def, cached, err := d.decode(id, value)
		if err != nil {
			e.log.Warn("skipping a stored task", "partition", p, "err", err)
			return
		}
		def.modRev, def.createRev = modRev, createRev
		prep.defs = append(prep.defs, def)
		prep.created = max(prep.created, createRev)
		if e.store != nil {
			kvs = append(kvs, store.KV{ID: id, Value: cached, Created: createRev})
		}
	})
	if err != nil {
		return nil, err
	}
	if e.store != nil {
		if err := e.store.Reset(uint32(p), rev, kvs); err != nil {
			e.dropCache(p, err)
		} else {
			e.uncached[p].Store(false)
		}
	}
	prep.rev = rev
	return prep, nil
}

// watch follows partition p's tasks after revision rev until ctx ends,
// applying every change to the cache and the loop. If etcd compacted past
// the revision, it reloads the partition.
func (e *Engine) watch(ctx context.Context, p int, rev int64) {
	var wch clientv3.WatchChan
	var b backoff
	var noted time.Time // when a progress notification last moved the cached revision
	for ctx.Err() == nil {
		if wch == nil {
			wch = e.reg.WatchPartition(ctx, p, rev)
		}
		for resp := range wch {
			if resp.CompactRevision != 0 {
				e.log.Info("the partition's revision was compacted; reloading it", "partition", p, "revision", rev)
				prep, err := e.rangeLoad(ctx, p, e.decoder())
				if err != nil {
					break
				}
				if e.call(ctx, &eventsCmd{part: p, upserts: prep.defs, replace: true, rev: prep.rev, created: prep.created}) != nil {
					return
				}
				rev = prep.rev
				break
			}
			if err := resp.Err(); err != nil {
				if ctx.Err() == nil {
					e.log.Warn("partition watch failed; restarting it", "partition", p, "err", err)
				}
				break
			}
			if resp.IsProgressNotify() {
				// A quiet partition's cache stays synced to etcd's revision,
				// so that it outlives compactions (at most once a minute);
				// so does the revision the loop armed its changes up to,
				// which a release hands over: the next owner, read from
				// this cache, then knows that this node had its one-shots
				// as read (decideApplied).
				if e.caching(p) && resp.Header.Revision > rev && time.Since(noted) > time.Minute {
					if err := e.store.Apply(uint32(p), resp.Header.Revision, nil, nil); err == nil {
						rev, noted = resp.Header.Revision, time.Now()
						if e.call(ctx, &eventsCmd{part: p, rev: rev}) != nil {
							return
						}
					}
				}
				continue
			}
			if len(resp.Events) == 0 {
				continue
			}
			if e.apply(ctx, p, resp.Events) != nil {
				return
			}
			rev = resp.Events[len(resp.Events)-1].Kv.ModRevision
			b.reset()
		}
		wch = nil
		if !b.wait(ctx) {
			return
		}
	}
}

// apply hands a batch of watch events to the cache and the loop, in
// order: a run of events on distinct keys at a time (applyRun), so that
// two changes of one task reach the loop one after the other, as from two
// deliveries. A run ends before a revision's events, never among them,
// so that it is every change up to its revision and none after: a task
// created after it would be taken for one put again (events), its record
// and the retries of its attempts under way dropped. Kept to the last of
// its key, a pause and its resume were the resume alone, a write that is
// not a pause, so an edit that kept an ended delete_after_fire task; and
// a delete and a put again were one put, which the loop tells from an
// edit by its creation (events), but the history of the task deleted
// stayed, under the new task's id.
func (e *Engine) apply(ctx context.Context, p int, events []*clientv3.Event) error {
	ids := make([]string, len(events))
	seen := make(map[string]bool, len(events))
	from := 0
	for i, ev := range events {
		ids[i] = e.reg.PartitionID(p, ev.Kv.Key)
		if !seen[ids[i]] {
			seen[ids[i]] = true
			continue
		}
		// ev's key is in the run: the run ends before ev's revision,
		// whose events before ev (a transaction's) go with it.
		to := i
		for to > from && events[to-1].Kv.ModRevision == ev.Kv.ModRevision {
			to--
		}
		if err := e.applyRun(ctx, p, events[from:to], ids[from:to], ev.Kv.ModRevision-1); err != nil {
			return err
		}
		clear(seen)
		for _, id := range ids[to : i+1] {
			seen[id] = true
		}
		from = to
	}
	return e.applyRun(ctx, p, events[from:], ids[from:], events[len(events)-1].Kv.ModRevision)
}

// applyRun hands events, a run of watch events on distinct keys (those
// of the tasks ids), to the cache and the loop, as every change of the
// partition up to revision rev.
func (e *Engine) applyRun(ctx context.Context, p int, events []*clientv3.Event, ids []string, rev int64) error {
	d := e.decoder()
	c := &eventsCmd{part: p, rev: rev}
	var puts []store.KV
	for i, ev := range events {
		id := ids[i]
		if ev.Type == mvccpb.DELETE {
			c.deletes = append(c.deletes, id)
			continue
		}
		def, cached, err := d.decode(id, ev.Kv.Value)
		if err != nil {
			// Left out, as a read of the partition leaves it out: the
			// definition before it no longer fires, nor does a start from
			// the cache, which would hold it under this revision.
			e.log.Warn("a task changed to what this node cannot read; it does not fire until a readable change",
				"partition", p, "err", err)
			c.drops = append(c.drops, id)
			continue
		}
		def.createRev = ev.Kv.CreateRevision
		c.upserts = append(c.upserts, def)
		c.created = max(c.created, ev.Kv.CreateRevision)
		puts = append(puts, store.KV{ID: id, Value: cached, Created: ev.Kv.CreateRevision})
	}
	if e.caching(p) {
		if err := e.store.Apply(uint32(p), c.rev, puts, slices.Concat(c.deletes, c.drops)); err != nil {
			e.dropCache(p, err)
		}
	}
	if len(c.deletes) == 0 || e.store == nil {
		return e.call(ctx, c)
	}
	// Applied before the history goes, so that a run under way of a
	// deleted task is known to the loop when it ends (deletedRuns).
	c.applied = make(chan struct{})
	if _, err := request(ctx, e, c, c.applied); err != nil {
		return err
	}
	// The owner's records of a deleted task go with it; other nodes' expire.
	for _, id := range c.deletes {
		if err := e.store.DeleteHistory(ctx, id); err != nil && ctx.Err() == nil {
			e.log.Warn("deleting the history of a deleted task failed", "task", id, "err", err)
		}
	}
	return nil
}
