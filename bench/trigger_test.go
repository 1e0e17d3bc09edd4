package bench

import (
	"testing"
)

// TestRun_Trigger triggers every task of a node at once, each task keyed
// (the handler executor): each trigger fires once, and the owner deletes
// every trigger key once its fire started.
func TestRun_Trigger(t *testing.T) {
	cfg := small(Trigger)
	cfg.Tasks, cfg.Executor = 200, ExecHandler
	r, m := runJSON(t, cfg)
	checkFields(t, m, Fields[Trigger])
	checkConsistent(t, cfg, r)
	if r.KeyedTasks != cfg.Tasks || r.ExpectedFires != uint64(cfg.Tasks) {
		t.Errorf("keyed_tasks %d, expected_fires %d: want every task keyed and triggered (%d)", r.KeyedTasks, r.ExpectedFires, cfg.Tasks)
	}
	if r.Fires != uint64(cfg.Tasks) || r.Duplicates != 0 || r.Missed != 0 {
		t.Errorf("fires %d, duplicates %d, missed %d: want each of %d triggers fired once", r.Fires, r.Duplicates, r.Missed, cfg.Tasks)
	}
	if r.TriggerKeysLeft != 0 || r.TriggerKeysGoneMs < r.LastFireMs {
		t.Errorf("%d trigger keys left, gone at %.1f ms, last fire at %.1f ms: want none left, gone after the last fire",
			r.TriggerKeysLeft, r.TriggerKeysGoneMs, r.LastFireMs)
	}
	if r.TriggerMs <= 0 || r.TriggersPerSec <= 0 || r.LastFireMs <= 0 {
		t.Errorf("trigger_ms %.1f, triggers_per_sec %.1f, last_fire_ms %.1f: want the call and its fires timed",
			r.TriggerMs, r.TriggersPerSec, r.LastFireMs)
	}
	if r.Note != "" {
		t.Errorf("note %q, want none", r.Note)
	}
}
