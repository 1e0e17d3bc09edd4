package store

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// crashChildEnv, when set to a directory, turns the test binary into the
// writer that TestCrash_RevisionNeverAheadOfData kills (see TestMain).
const crashChildEnv = "STORE_CRASH_CHILD_DIR"

// crashTasks is what the child writes at revision rev of partition 1: task
// "k<rev>" and, every third revision, a batch too big for one transaction
// (so the split path is killed midway too), all carrying the revision.
func crashTasks(rev int64) []KV {
	v := []byte(strconv.FormatInt(rev, 10))
	tasks := []KV{{ID: fmt.Sprintf("k%06d", rev), Value: v}}
	if rev%3 == 0 {
		for i := range 300 {
			val := make([]byte, 1000)
			copy(val, v)
			tasks = append(tasks, KV{ID: fmt.Sprintf("big%06d-%03d", rev, i), Value: val})
		}
	}
	return tasks
}

func crashConfig(dir string) Config {
	cfg := DefaultConfig(dir)
	cfg.MemTableSize = 1 << 20
	cfg.ValueThreshold = 1 << 10
	return cfg
}

// crashChild applies revision after revision to partition 1, printing each
// revision once Apply returned, until it is killed.
func crashChild(dir string) {
	s, err := Open(crashConfig(dir))
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	start, err := s.Partition(1, nil)
	if err != nil {
		fmt.Println("partition:", err)
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	for rev := start + 1; ; rev++ {
		if err := s.Apply(1, rev, crashTasks(rev), nil); err != nil {
			fmt.Println("apply:", err)
			os.Exit(2)
		}
		fmt.Fprintln(out, rev)
		out.Flush()
	}
}

// TestCrash_RevisionNeverAheadOfData kills (SIGKILL) a process in the
// middle of Apply calls, some split over several transactions, and checks
// that every task up to the recorded revision is there with its value.
// Data beyond the revision is allowed: a replay of the watch rewrites it.
func TestCrash_RevisionNeverAheadOfData(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill it after a number of revisions that varies by round, so the
		// kill lands at different points of the write.
		lines := bufio.NewScanner(stdout)
		var acked int64
		for n := 0; n < 20+round*17 && lines.Scan(); n++ {
			if acked, err = strconv.ParseInt(lines.Text(), 10, 64); err != nil {
				t.Fatalf("child: %s", lines.Text())
			}
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		if acked == 0 {
			t.Fatalf("round %d: the child applied nothing", round)
		}

		s, err := Open(crashConfig(dir))
		if err != nil {
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				fi, _ := e.Info()
				t.Logf("%s %d", e.Name(), fi.Size())
			}
			t.Fatalf("round %d: Open after kill: %v", round, err)
		}
		rev, n, err := readCrashed(s)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		// Apply returned for acked, so the kill cannot have undone it
		// (the process died, the page cache did not).
		if rev < acked {
			t.Errorf("round %d: revision %d, but Apply of %d had returned", round, rev, acked)
		}
		t.Logf("round %d: killed after revision %d acknowledged; store at %d with %d tasks", round, acked, rev, n)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// readCrashed reads partition 1 of s, written by crashTasks, and returns
// its revision and number of tasks, or an error when a task of a revision
// up to the one recorded is missing or has another value.
func readCrashed(s *Store) (rev int64, n int, err error) {
	got := map[string]string{}
	rev, err = s.Partition(1, func(id string, v []byte, _ int64) error {
		got[id] = string(v)
		return nil
	})
	if err != nil {
		return rev, len(got), err
	}
	for r := int64(1); r <= rev; r++ {
		for _, kv := range crashTasks(r) {
			if got[kv.ID] != string(kv.Value) {
				return rev, len(got), fmt.Errorf("revision %d recorded but task %s of revision %d is %.8q", rev, kv.ID, r, got[kv.ID])
			}
		}
	}
	return rev, len(got), nil
}
