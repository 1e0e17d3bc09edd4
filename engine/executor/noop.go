package executor

import "context"

// Noop does nothing and succeeds, whatever ctx, without allocating. It
// measures the engine's own cost.
var Noop Executor = noop{}

type noop struct{}

func (noop) Execute(context.Context, *Fire) error { return nil }
