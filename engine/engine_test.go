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
	end := time.Now()
	n.stop(t)
	if d := log.duplicates(); len(d) > 0 {
		t.Fatalf("duplicate fires: %v", d)
	}
	for i := range tasks {
		id := fmt.Sprintf("every-second-%02d", i)
		noGap(t, log, id)
		firedThrough(t, log, id, end)
	}
}
