package timerwheel

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// MaxID is the largest timer id a Wheel accepts.
const MaxID = 1<<31 - 1

// The wheel has one level of 256 slots for single ticks and ten levels of 64
// slots above it: 8 + 10×6 = 68 bits, more than an int64 tick count needs, so
// no timer is ever too far in the future for the wheel.
const (
	level0Bits  = 8
	level0Slots = 1 << level0Bits
	levelBits   = 6
	levelSlots  = 1 << levelBits
	numLevels   = 11
	numSlots    = level0Slots + (numLevels-1)*levelSlots

	pageBits = 12 // generations of 4096 ids a page: 16 KiB
	pageSize = 1 << pageBits

	blockLen = 128 // items a block: 2 KiB

	// Blocks are allocated in slabs of 64 (about 130 KiB), not one by one:
	// at ten million timers, 80 000 separate blocks cost every garbage
	// collection as many objects to mark and some 27 000 spans to sweep,
	// and 12 % of their memory to size-class rounding.
	slabBits = 6
	slabLen  = 1 << slabBits
)

// item is one timer in a slot. Slots hold items by value in chains of
// blocks, so cascading and expiring a slot reads memory in order instead of
// chasing one pointer per timer.
type item struct {
	at  int64  // the deadline the caller asked for, in nanoseconds
	id  uint32 // the caller's id
	gen uint32 // the id's generation when scheduled; stale once it moved on
}

type block struct {
	items      [blockLen]item
	start, end int32 // items[start:end] are still in the slot
	next       int32 // the slot's next block, or -1
}

type slot struct {
	head, tail int32 // block chain, -1 when empty
	lo, hi     int64 // bounds of the ticks held, above level 0; loose after cancels, never wrong
}

// Expired is a timer delivered by Advance.
type Expired struct {
	ID uint32
	At int64 // the deadline it was scheduled for
}

// Wheel is a hierarchical timing wheel. The zero value is not usable; call
// New. A Wheel is not safe for concurrent use.
//
// A timer's state is its generation: odd while scheduled. Cancel and
// reschedule only bump it, leaving the old item in its slot as stale, to be
// skipped when its slot expires or dropped by a compaction. That keeps
// cancel O(1) without a back-pointer that every cascade would have to update.
type Wheel struct {
	tick  int64 // nanoseconds per tick
	cur   int64 // current tick: every earlier tick has been expired
	n     int   // scheduled timers
	stale int   // items in slots whose timer was cancelled or moved
	// compactMin is how many stale items may pile up before a compaction,
	// however few timers are live.
	compactMin int
	gens       [][]uint32 // generation by id, a page at a time on first use

	slabs   [][]block // pointer-free blocks, slabLen a slab; the GC scans only this slice
	nblocks int32     // blocks handed out so far
	free    int32     // free block chain, -1 when empty

	slots [numSlots]slot
	occ   [numLevels][4]uint64 // slots that may be non-empty; stale bits are cleared lazily
}

// New returns an empty wheel with the given tick length whose clock starts
// at now (nanoseconds). A timer expires on the first Advance that reaches
// the end of the tick containing its deadline, so a deadline on a tick
// boundary is exact. tick must be positive.
func New(tick time.Duration, now int64) (*Wheel, error) {
	if tick <= 0 {
		return nil, fmt.Errorf("timerwheel: tick must be positive, got %v", tick)
	}
	// Ticks are kept non-negative so that their bits order them; nothing
	// fires before 1970.
	w := &Wheel{tick: int64(tick), cur: max(0, floorDiv(now, int64(tick))), free: -1, compactMin: 1 << 16}
	for i := range w.slots {
		w.slots[i] = slot{head: -1, tail: -1}
	}
	return w, nil
}

// Len returns the number of scheduled timers.
func (w *Wheel) Len() int { return w.n }

// Tick returns the tick length.
func (w *Wheel) Tick() time.Duration { return time.Duration(w.tick) }

// Now returns the start of the current tick in nanoseconds: the wheel has
// expired every timer due before it.
func (w *Wheel) Now() int64 { return mulSat(w.cur, w.tick) }

// Schedule arms timer id to expire at the given time (nanoseconds). A timer
// that is already scheduled is moved: Schedule is also reschedule. A deadline
// at or before the wheel's current time expires on the next Advance.
// Schedule panics if id > MaxID: ids are the caller's slab indexes, so a
// larger one is a bug, not input.
func (w *Wheel) Schedule(id uint32, at int64) {
	if id > MaxID {
		panic(fmt.Sprintf("timerwheel: id %d above MaxID", id))
	}
	g := w.gen(id)
	if *g&1 == 1 {
		*g += 2
		w.stale++
		w.maybeCompact()
	} else {
		*g++
		w.n++
	}
	w.insert(item{at: at, id: id, gen: *g}, ceilDiv(at, w.tick))
}

// Reschedule is Schedule, named for readability at call sites that move a
// timer.
func (w *Wheel) Reschedule(id uint32, at int64) { w.Schedule(id, at) }

// Cancel disarms timer id. It reports whether the timer was scheduled.
func (w *Wheel) Cancel(id uint32) bool {
	g := w.lookup(id)
	if g == nil || *g&1 == 0 {
		return false
	}
	*g++
	w.n--
	w.stale++
	w.maybeCompact()
	return true
}

// Scheduled reports whether timer id is scheduled.
func (w *Wheel) Scheduled(id uint32) bool {
	g := w.lookup(id)
	return g != nil && *g&1 == 1
}

// Advance moves the wheel's clock to now and appends to dst the timers that
// are due (at <= now), in non-decreasing tick order, each exactly once. It
// appends at most max timers (max <= 0: no limit); when it stops at the
// limit, the rest of the tick stays due and the next call continues there.
// Timers scheduled at or before now while the caller handles the batch are
// due on the next call. A now earlier than the wheel's clock does nothing.
func (w *Wheel) Advance(now int64, max int, dst []Expired) []Expired {
	if max <= 0 {
		max = math.MaxInt
	}
	target := floorDiv(now, w.tick)
	if target < w.cur {
		return dst
	}
	delivered := 0
	for {
		s := &w.slots[w.cur&(level0Slots-1)]
		for s.head >= 0 {
			b := w.block(s.head)
			for ; b.start < b.end; b.start++ {
				if delivered == max {
					return dst
				}
				it := &b.items[b.start]
				g := w.gen(it.id)
				if *g != it.gen {
					w.stale--
					continue
				}
				*g++
				w.n--
				dst = append(dst, Expired{ID: it.id, At: it.at})
				delivered++
			}
			s.head = w.release(s.head)
		}
		s.tail = -1
		w.setOcc(0, int(w.cur&(level0Slots-1)), false)

		next, _, ok := w.nextEvent()
		if !ok || next > target {
			w.moveTo(target)
			return dst
		}
		w.moveTo(next)
	}
}

// NextDeadline returns the earliest time (nanoseconds) at which Advance may
// have a timer to deliver, so that the owner can sleep until then instead of
// ticking. It is never later than the tick of the earliest scheduled timer;
// it may be earlier (cancelled timers leave their slots behind until they
// expire), in which case Advance delivers nothing and NextDeadline moves on.
// ok is false when no timer is scheduled.
func (w *Wheel) NextDeadline() (at int64, ok bool) {
	if w.n == 0 {
		return 0, false
	}
	if w.slots[w.cur&(level0Slots-1)].head >= 0 {
		return mulSat(w.cur, w.tick), true
	}
	next, slot, ok := w.nextEvent()
	if !ok {
		return 0, false // unreachable while n > 0
	}
	if slot >= level0Slots {
		next = max(next, w.slots[slot].lo)
	}
	return mulSat(next, w.tick), true
}

// Peek appends to dst, up to max and without removing them, the timers of
// the next tick that has any, in the order in which Advance will deliver
// them, and returns the time at which that tick is due: the owner can build
// what those timers start before they are due, then check them against
// what Advance delivers. Peek appends nothing (and returns 0) when the
// current tick has timers (they are due already), or when the next tick's
// timers share a slot with other ticks', whose cascade could reorder them.
// A cron burst, every timer on one second, is in one slot of its own.
func (w *Wheel) Peek(max int, dst []Expired) (int64, []Expired) {
	t, s, ok := w.peekSlot()
	if !ok {
		return 0, dst
	}
	n := 0
	for bi := s.head; bi >= 0 && n < max; bi = w.block(bi).next {
		b := w.block(bi)
		for _, it := range b.items[b.start:b.end] {
			if n == max {
				break
			}
			if *w.gen(it.id) == it.gen {
				dst = append(dst, Expired{ID: it.id, At: it.at})
				n++
			}
		}
	}
	if n == 0 {
		return 0, dst
	}
	return mulSat(t, w.tick), dst
}

// PeekLen returns how many timers Peek would append with no max, or more
// (timers cancelled or moved since they were scheduled are counted until
// their slot expires), and when they are due; 0 when Peek cannot read the
// next tick (see Peek). It reads a block, not a timer, at a time: a
// million timers in some 8 000 steps, so that the owner can size what it
// builds from Peek long before the tick.
func (w *Wheel) PeekLen() (at int64, n int) {
	t, s, ok := w.peekSlot()
	if !ok {
		return 0, 0
	}
	for bi := s.head; bi >= 0; bi = w.block(bi).next {
		b := w.block(bi)
		n += int(b.end - b.start)
	}
	return mulSat(t, w.tick), n
}

// peekSlot returns the slot that holds the next tick with timers, and that
// tick, if Peek can read it (see Peek).
func (w *Wheel) peekSlot() (t int64, s *slot, ok bool) {
	if w.n == 0 || w.slots[w.cur&(level0Slots-1)].head >= 0 {
		return 0, nil, false
	}
	t, i, ok := w.nextEvent()
	if !ok {
		return 0, nil, false
	}
	s = &w.slots[i]
	if i >= level0Slots {
		if s.lo != s.hi {
			return 0, nil, false
		}
		t = s.lo // spliced whole into the empty lower slots on its way down
	}
	return t, s, true
}

// gen returns the generation of id, allocating its page on first use.
func (w *Wheel) gen(id uint32) *uint32 {
	p := int(id >> pageBits)
	if p >= len(w.gens) {
		w.gens = append(w.gens, make([][]uint32, p+1-len(w.gens))...)
	}
	if w.gens[p] == nil {
		w.gens[p] = make([]uint32, pageSize)
	}
	return &w.gens[p][id&(pageSize-1)]
}

// lookup returns the generation of id, or nil if its page was never used.
func (w *Wheel) lookup(id uint32) *uint32 {
	p := int(id >> pageBits)
	if p >= len(w.gens) || w.gens[p] == nil {
		return nil
	}
	return &w.gens[p][id&(pageSize-1)]
}

// block returns block i.
func (w *Wheel) block(i int32) *block { return &w.slabs[i>>slabBits][i&(slabLen-1)] }

// alloc returns an empty block, reusing freed ones: in steady state the
// wheel allocates nothing.
func (w *Wheel) alloc() int32 {
	i := w.free
	if i >= 0 {
		w.free = w.block(i).next
	} else {
		i = w.nblocks
		w.nblocks++
		if int(i>>slabBits) == len(w.slabs) {
			w.slabs = append(w.slabs, make([]block, slabLen))
		}
	}
	b := w.block(i)
	b.start, b.end, b.next = 0, 0, -1
	return i
}

// release frees block i and returns the block that followed it.
func (w *Wheel) release(i int32) int32 {
	b := w.block(i)
	next := b.next
	b.next = w.free
	w.free = i
	return next
}

// place returns the level and slot that tick t belongs in, given the current
// tick: the level of the highest bit in which t differs from cur. Every
// timer on a level shares the current tick's digits above that level and
// has a larger digit on it, which is what lets moveTo cascade a single slot.
func (w *Wheel) place(t int64) (level, slot int) {
	x := uint64(t ^ w.cur)
	if x < level0Slots {
		return 0, int(t & (level0Slots - 1))
	}
	level = (bits.Len64(x)-level0Bits-1)/levelBits + 1
	digit := int(uint64(t)>>shift(level)) & (levelSlots - 1)
	return level, level0Slots + (level-1)*levelSlots + digit
}

// insert appends it to the slot for tick t; a tick in the past is due now.
func (w *Wheel) insert(it item, t int64) {
	t = max(t, w.cur)
	level, i := w.place(t)
	s := &w.slots[i]
	if level > 0 {
		if s.head < 0 {
			s.lo, s.hi = t, t
		} else {
			s.lo, s.hi = min(s.lo, t), max(s.hi, t)
		}
	}
	if s.head < 0 {
		s.head = w.alloc()
		s.tail = s.head
		w.setOcc(level, i, true)
	}
	b := w.block(s.tail)
	if b.end == blockLen {
		nb := w.alloc()
		b.next = nb
		s.tail = nb
		b = w.block(nb)
	}
	b.items[b.end] = it
	b.end++
}

// nextEvent finds the first tick after cur at which a slot may need work:
// the next non-empty slot of level 0 in this rotation, or else the start of
// the next non-empty slot of the lowest level that has one.
func (w *Wheel) nextEvent() (tick int64, slot int, ok bool) {
	for level := range numLevels {
		sh := shift(level)
		digit := int(uint64(w.cur)>>sh) & (slotsAt(level) - 1)
		for {
			d, found := w.nextBit(level, digit+1)
			if !found {
				break
			}
			slot := d
			if level > 0 {
				slot = level0Slots + (level-1)*levelSlots + d
			}
			if w.slots[slot].head < 0 { // emptied by a compaction
				w.setOcc(level, slot, false)
				continue
			}
			width := sh + bitsAt(level)
			high := uint64(w.cur) >> width << width // 0 when width is 64 or more
			return int64(high | uint64(d)<<sh), slot, true
		}
	}
	return 0, 0, false
}

// nextBit returns the first occupied digit >= from on a level.
func (w *Wheel) nextBit(level, from int) (int, bool) {
	words := w.occ[level][:slotsAt(level)/64]
	for i := from >> 6; i < len(words); i++ {
		word := words[i]
		if i == from>>6 {
			word &^= 1<<(from&63) - 1
		}
		if word != 0 {
			return i<<6 + bits.TrailingZeros64(word), true
		}
	}
	return 0, false
}

// setOcc sets or clears the occupancy bit of a slot (a global slot index).
func (w *Wheel) setOcc(level, slot int, on bool) {
	d := slot
	if level > 0 {
		d = (slot - level0Slots) & (levelSlots - 1)
	}
	if on {
		w.occ[level][d>>6] |= 1 << (d & 63)
	} else {
		w.occ[level][d>>6] &^= 1 << (d & 63)
	}
}

// moveTo sets the current tick to t > cur. The caller guarantees that no
// timer is due before t. Only one slot can then hold timers that now belong
// lower: the slot on the level of the highest digit that changed, at t's
// digit. Its timers are cascaded, by splicing its whole chain when its
// bounds fall in one lower slot, as they do when cron piles a burst onto one
// second.
func (w *Wheel) moveTo(t int64) {
	x := uint64(t ^ w.cur)
	w.cur = t
	if x < level0Slots {
		return
	}
	level := (bits.Len64(x)-level0Bits-1)/levelBits + 1
	digit := int(uint64(t)>>shift(level)) & (levelSlots - 1)
	i := level0Slots + (level-1)*levelSlots + digit
	s := w.slots[i]
	w.slots[i] = slot{head: -1, tail: -1}
	w.setOcc(level, i, false)
	if s.head < 0 {
		return
	}
	// Every timer here is at or after t, so ticks between two that share a
	// lower slot share it too.
	lvLo, slLo := w.place(s.lo)
	if lvHi, slHi := w.place(s.hi); lvLo == lvHi && slLo == slHi {
		w.splice(lvLo, slLo, s)
		return
	}
	for bi := s.head; bi >= 0; bi = w.release(bi) {
		b := w.block(bi)
		for _, it := range b.items[b.start:b.end] {
			w.insert(it, ceilDiv(it.at, w.tick)) // stale items move too: checking them would cost a random read each
		}
	}
}

// splice appends the chain of s, whose ticks are within s.lo..s.hi, to
// slot i.
func (w *Wheel) splice(level, i int, s slot) {
	d := &w.slots[i]
	if d.head < 0 {
		d.head, d.tail, d.lo, d.hi = s.head, s.tail, s.lo, s.hi
		w.setOcc(level, i, true)
		return
	}
	w.block(d.tail).next = s.head
	d.tail = s.tail
	d.lo, d.hi = min(d.lo, s.lo), max(d.hi, s.hi)
}

// maybeCompact drops stale items once they outnumber live timers (and a
// floor), so that cancel-heavy use cannot grow the wheel without bound. Its
// O(items) cost is paid at most once per that many cancels.
func (w *Wheel) maybeCompact() {
	if w.stale < max(w.n, w.compactMin) {
		return
	}
	for i := range w.slots {
		s := &w.slots[i]
		if s.head < 0 {
			continue
		}
		// Rewrite the chain in place: live items move forward, emptied
		// blocks at the end are freed.
		wb, wi := s.head, w.block(s.head).start
		lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
		for bi := s.head; bi >= 0; bi = w.block(bi).next {
			b := w.block(bi)
			for _, it := range b.items[b.start:b.end] {
				if *w.gen(it.id) != it.gen {
					continue
				}
				dst := w.block(wb)
				if wi == blockLen {
					wb, wi = dst.next, 0
					dst = w.block(wb)
					dst.start = 0
				}
				dst.items[wi] = it
				wi++
				dst.end = wi
				t := max(ceilDiv(it.at, w.tick), w.cur)
				lo, hi = min(lo, t), max(hi, t)
			}
		}
		if lo > hi { // nothing live: free the chain
			for bi := s.head; bi >= 0; bi = w.release(bi) {
			}
			*s = slot{head: -1, tail: -1}
			continue // nextEvent clears the occupancy bit
		}
		for bi := w.block(wb).next; bi >= 0; bi = w.release(bi) {
		}
		w.block(wb).next = -1
		s.tail, s.lo, s.hi = wb, lo, hi
	}
	w.stale = 0
}

func shift(level int) uint {
	if level == 0 {
		return 0
	}
	return uint(level0Bits + (level-1)*levelBits)
}

func bitsAt(level int) uint {
	if level == 0 {
		return level0Bits
	}
	return levelBits
}

func slotsAt(level int) int { return 1 << bitsAt(level) }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a > 0 {
		q++
	}
	return q
}

func mulSat(t, tick int64) int64 {
	if t > math.MaxInt64/tick {
		return math.MaxInt64
	}
	return t * tick
}
