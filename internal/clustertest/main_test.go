package clustertest

import (
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardcron/shardcron/internal/buildinputs"
)

var (
	tasksFlag = flag.Int("chaos.tasks", 0, "every-second tasks per scenario (0: the short form's 1200)")
	soakFlag  = flag.Duration("chaos.soak", 0, "run TestSoak for this long (0: skip it)")
	seedFlag  = flag.Int64("chaos.seed", 0, "seed of TestSoak's random faults (0: from the clock)")
)

// binary is the shardcron binary, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	flag.Parse()
	path, cleanup, err := BuildBinary()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = path
	code := 0
	func() {
		defer cleanup()
		// goleak.VerifyTestMain would exit; run and check by hand so the
		// binary is removed either way.
		before := goleak.IgnoreCurrent()
		code = m.Run()
		if code == 0 {
			// etcd members (and the idle API connections of the node
			// processes) leave net/http keep-alive connections behind.
			if err := goleak.Find(before,
				goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
				goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
				goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
				goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead")); err != nil {
				fmt.Fprintln(os.Stderr, "goleak:", err)
				code = 1
			}
		}
	}()
	os.Exit(code)
}

// newCluster starts a cluster for a scenario with the package's flags
// applied.
func newCluster(t *testing.T, o Options) *Cluster {
	t.Helper()
	// So that go test reruns this when the binary\'s sources change.
	if _, err := buildinputs.Open(); err != nil {
		t.Fatal(err)
	}
	o.Binary = binary
	if o.Tasks == 0 {
		o.Tasks = *tasksFlag
	}
	if o.Seed == 0 {
		o.Seed = time.Now().UnixNano()
	}
	return New(t, o)
}
