package clustertest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Fault kinds. A crash-like fault may repeat up to the bounded lead of the
// faulted node's fires; every other step must repeat nothing.
const (
	FaultKill          = "kill -9"
	FaultPause         = "SIGSTOP past the lease"
	FaultShortPause    = "SIGSTOP shorter than the lease"
	FaultCut           = "cut off from etcd"
	FaultFailedRelease = "release with a failed checkpoint write"
)

// Fault is a crash-like fault of one node.
type Fault struct {
	Node string
	Kind string
	// At is when the fault began; Until when the node came back (restart,
	// SIGCONT, restore), zero while it has not.
	At, Until time.Time
	// Post is how long after At the faulted node may still fire on its own
	// session: a node cut off from etcd keeps dispatching for up to the lead
	// beyond its last acknowledged watermark; a killed or stopped one cannot.
	Post time.Duration
	// Rev is etcd's revision when the fault began (0: unknown). Every lock
	// the node took before is at most Rev, so that the calls of its faulted
	// session are those whose fence is at most Rev.
	Rev int64
}

// Window is what Verify checks: every task of Tasks fires once in every
// scheduled second from From to To (Unix seconds, inclusive), or in those
// Fires says, allowing the bounded-lead repeats of Faults.
type Window struct {
	Tasks    []string
	From, To int64
	Lead     time.Duration
	Faults   []Fault
	// Fires reports whether task fires in the scheduled second sec; nil:
	// every task fires every second.
	Fires func(task string, sec int64) bool
}

// Offense is a fire that broke an invariant, with every call the sink
// received for it.
type Offense struct {
	Key   FireKey
	Calls []Call
}

// Result is what Verify found.
type Result struct {
	Window
	// Expected is the number of fires the window holds (tasks × seconds).
	Expected int
	// Duplicates are fires received more than once without a fault that
	// allows it; Repeats are those a crash-like fault allows.
	Duplicates, Repeats []Offense
	// Missed are fires never received; Around says, per missed fire, which
	// nodes fired the task the second before and the second after.
	Missed []FireKey
	Around map[FireKey]string
	// Last is, per faulted node, the latest scheduled time (Unix ms) it
	// fired on its faulted session; a repeat is allowed within Lead of it.
	Last map[string]int64
	// PerNode counts the window's calls by the node that sent them.
	PerNode map[string]int
}

// OK reports whether the window holds no duplicate and no miss.
func (r *Result) OK() bool { return len(r.Duplicates) == 0 && len(r.Missed) == 0 }

// Verify counts the calls of every fire of w. A fire received twice is
// allowed only when, for some fault f of w, one of the calls came from
// f.Node (the other may come from any node, f.Node's own next session
// included: a fenced node that rejoins resumes from its last acknowledged
// watermark like any successor), and its scheduled time lies within w.Lead
// before the last time f.Node fired on its faulted session: the latest
// scheduled time, at most f.At + f.Post and within a minute before f.At,
// of a fire received from f.Node (whenever it arrived: a fire taken by a
// worker before SIGSTOP reaches the sink after SIGCONT) with a fence of
// that session (at most f.Rev). A node behind its schedule and back soon
// with a new session fires later times on its new locks: counting those
// moved the window past the repeats of the seconds it was behind on.
func Verify(calls map[FireKey][]Call, w Window) *Result {
	r := &Result{Window: w, Last: make(map[string]int64), Around: make(map[FireKey]string), PerNode: make(map[string]int)}
	last := make([]int64, len(w.Faults))
	for i, f := range w.Faults {
		last[i] = -1
		limit := f.At.Add(f.Post).UnixMilli()
		for k, cs := range calls {
			if k.At > limit || k.At <= last[i] {
				continue
			}
			if k.At <= f.At.Add(-time.Minute).UnixMilli() {
				continue
			}
			for _, c := range cs {
				if c.Node == f.Node && (f.Rev == 0 || c.Fence <= f.Rev) {
					last[i] = k.At
					break
				}
			}
		}
		if last[i] > r.Last[f.Node] {
			r.Last[f.Node] = last[i]
		}
	}
	allowed := func(k FireKey, cs []Call) bool {
		if len(cs) != 2 {
			return false
		}
		for i, f := range w.Faults {
			if (cs[0].Node == f.Node || cs[1].Node == f.Node) &&
				last[i] >= 0 && k.At <= last[i] && k.At >= last[i]-w.Lead.Milliseconds() {
				return true
			}
		}
		return false
	}
	for _, task := range w.Tasks {
		for sec := w.From; sec <= w.To; sec++ {
			if w.Fires != nil && !w.Fires(task, sec) {
				continue
			}
			r.Expected++
			k := FireKey{Task: task, At: sec * 1000}
			cs := calls[k]
			for _, c := range cs {
				r.PerNode[c.Node]++
			}
			switch {
			case len(cs) == 0:
				r.Missed = append(r.Missed, k)
				r.Around[k] = "before: " + nodesOf(calls[FireKey{task, k.At - 1000}]) +
					", after: " + nodesOf(calls[FireKey{task, k.At + 1000}])
			case len(cs) == 1:
			case allowed(k, cs):
				r.Repeats = append(r.Repeats, Offense{k, cs})
			default:
				r.Duplicates = append(r.Duplicates, Offense{k, cs})
			}
		}
	}
	order := func(a, b Offense) int {
		if c := int(a.Key.At - b.Key.At); c != 0 {
			return c
		}
		return strings.Compare(a.Key.Task, b.Key.Task)
	}
	slices.SortFunc(r.Duplicates, order)
	slices.SortFunc(r.Repeats, order)
	slices.SortFunc(r.Missed, func(a, b FireKey) int {
		if c := int(a.At - b.At); c != 0 {
			return c
		}
		return strings.Compare(a.Task, b.Task)
	})
	return r
}

// maxListed is how many offending keys a report lists.
const maxListed = 20

// Format describes the result for a failure message; times are shown as
// offsets from t0, the start of the run, and as wall-clock times.
func (r *Result) Format(t0 time.Time) string {
	var b strings.Builder
	rel := func(t time.Time) string {
		return fmt.Sprintf("T%+.3fs (%s)", t.Sub(t0).Seconds(), t.Format("15:04:05.000"))
	}
	sched := func(ms int64) string { return rel(time.UnixMilli(ms)) }
	fmt.Fprintf(&b, "window: scheduled seconds %s .. %s, %d tasks, %d fires expected\n",
		sched(r.From*1000), sched(r.To*1000), len(r.Tasks), r.Expected)
	fmt.Fprintf(&b, "duplicates: %d, missed: %d, repeats allowed by the bounded lead: %d\n",
		len(r.Duplicates), len(r.Missed), len(r.Repeats))
	for _, f := range r.Faults {
		until := "still faulted"
		if !f.Until.IsZero() {
			until = "back at " + rel(f.Until)
		}
		lastFire := "none"
		if ms, ok := r.Last[f.Node]; ok && ms >= 0 {
			lastFire = sched(ms)
		}
		fmt.Fprintf(&b, "fault: %s %s at %s, %s; its last fire on that session scheduled %s\n",
			f.Node, f.Kind, rel(f.At), until, lastFire)
	}
	offenses := func(title string, os []Offense) {
		if len(os) == 0 {
			return
		}
		// Per scheduled second and per set of nodes, then the first keys.
		bySec := make(map[int64]int)
		byNodes := make(map[string]int)
		for _, o := range os {
			bySec[o.Key.At/1000]++
			var ns []string
			for _, c := range o.Calls {
				ns = append(ns, c.Node)
			}
			byNodes[strings.Join(ns, "+")]++
		}
		fmt.Fprintf(&b, "%s by scheduled second:", title)
		for _, s := range slices.Sorted(maps.Keys(bySec)) {
			fmt.Fprintf(&b, " %s:%d", sched(s*1000), bySec[s])
		}
		fmt.Fprintf(&b, "\n%s by firing nodes (in arrival order):", title)
		for _, k := range slices.Sorted(maps.Keys(byNodes)) {
			fmt.Fprintf(&b, " %s:%d", k, byNodes[k])
		}
		fmt.Fprintf(&b, "\nfirst %s:\n", title)
		for i, o := range os {
			if i == maxListed {
				fmt.Fprintf(&b, "  ... and %d more\n", len(os)-maxListed)
				break
			}
			fmt.Fprintf(&b, "  %s:", o.Key)
			for _, c := range o.Calls {
				fmt.Fprintf(&b, " %s (attempt %s) at %s;", c.Node, c.Attempt, rel(c.Arrived))
			}
			b.WriteString("\n")
		}
	}
	offenses("duplicates", r.Duplicates)
	if len(r.Missed) > 0 {
		bySec := make(map[int64]int)
		byTask := make(map[string]int)
		for _, k := range r.Missed {
			bySec[k.At/1000]++
			byTask[k.Task]++
		}
		b.WriteString("missed by scheduled second:")
		for _, s := range slices.Sorted(maps.Keys(bySec)) {
			fmt.Fprintf(&b, " %s:%d", sched(s*1000), bySec[s])
		}
		fmt.Fprintf(&b, "\nmissed fires belong to %d distinct tasks; first missed:\n", len(byTask))
		for i, k := range r.Missed {
			if i == maxListed {
				fmt.Fprintf(&b, "  ... and %d more\n", len(r.Missed)-maxListed)
				break
			}
			fmt.Fprintf(&b, "  %s (%s)\n", k, r.Around[k])
		}
	}
	return b.String()
}

func nodesOf(cs []Call) string {
	if len(cs) == 0 {
		return "nobody"
	}
	var ns []string
	for _, c := range cs {
		ns = append(ns, c.Node)
	}
	return strings.Join(ns, "+")
}

// Fold is a run of missed fires of one task followed by a later fire of it:
// what a misfire policy leaves of fires released later than the misfire
// threshold (fire_once runs the latest missed time, skip the next one after
// now; the node counts one misfire either way).
type Fold struct {
	Task   string
	Missed []FireKey // the run, oldest first
	Next   FireKey   // the task's next fire received after the run
	By     string    // the node that sent Next: the one that counted the misfire
	// Late is how long after the fold's first missed time (the first after
	// the task's last fire received before the run) Next arrived: a misfire
	// policy folds only fires released later than the misfire threshold,
	// and Next went out when the node folded them.
	Late time.Duration
}

// Folds splits missed fires (as Verify lists them) into folds, closed by a
// later fire of their task received by the sink, and tails, after which the
// sink received no fire of the task at all.
func Folds(calls map[FireKey][]Call, missed []FireKey) (folds []Fold, tails []FireKey) {
	byTask := make(map[string][]FireKey)
	for _, k := range missed {
		byTask[k.Task] = append(byTask[k.Task], k)
	}
	later := make(map[string][]int64) // per task, the scheduled times received, ascending
	for k := range calls {
		if _, ok := byTask[k.Task]; ok {
			later[k.Task] = append(later[k.Task], k.At)
		}
	}
	for _, task := range slices.Sorted(maps.Keys(byTask)) {
		ks := byTask[task]
		slices.SortFunc(ks, func(a, b FireKey) int { return int(a.At - b.At) })
		got := later[task]
		slices.Sort(got)
		var run []FireKey
		for i, k := range ks {
			run = append(run, k)
			if i+1 < len(ks) && ks[i+1].At == k.At+1000 {
				continue // the run goes on
			}
			j, _ := slices.BinarySearch(got, k.At+1)
			if j == len(got) {
				tails = append(tails, run...)
			} else {
				next := FireKey{task, got[j]}
				// The fold began after the task's last fire received before
				// the run, which may lie before the window checked.
				began := run[0].At
				if k, _ := slices.BinarySearch(got, run[0].At); k > 0 {
					began = got[k-1] + 1000
				}
				first := calls[next][0]
				folds = append(folds, Fold{Task: task, Missed: run, Next: next, By: first.Node,
					Late: first.Arrived.Sub(time.UnixMilli(began))})
			}
			run = nil
		}
	}
	return folds, tails
}
