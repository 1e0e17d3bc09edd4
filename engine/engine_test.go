package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
)

func TestEngine_EverySecondNoDuplicateNoGap(t *testing.T) {
	c := etcdtest.Start(t)
	log := newFireLog()
	n := startNode(t, c, "", log.handler, nil)
	const tasks = 20
	for i := range tasks {
		putTask(t, n.e.Registry(), handlerTask(fmt.Sprintf("every-second-%02d", i), "* * * * * *"))
	}
	etcdtest.WaitFor(t, 15*time.Second, func() bool {
		for i := range tasks {
			if len(log.forTask(fmt.Sprintf("every-second-%02d", i))) < 4 {
				return false
			}
		}
		return true
	})
	n.stop(t)
	if d := log.duplicates(); len(d) > 0 {
		t.Fatalf("duplicate fires: %v", d)
	}
	for i := range tasks {
		id := fmt.Sprintf("every-second-%02d", i)
		got := log.forTask(id)
		for j := 1; j < len(got); j++ {
			if got[j].Sub(got[j-1]) != time.Second {
				t.Fatalf("%s: fires %v then %v: a gap or a repeat", id, got[j-1], got[j])
			}
		}
	}
}
