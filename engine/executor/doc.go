// Package executor runs one fire of a task: an HTTP request, a command, an
// in-process Go handler, or nothing at all.
//
// It knows nothing of etcd, the timing wheel or scheduling: the engine builds
// an Executor per task from plain values (HTTPSpec, ExecSpec, a handler name)
// and calls Execute once per attempt with a *Fire describing it. Delivery
// (at-least-once across crashes and handoffs, retries, the concurrency
// policy) is the engine's business; an executor runs the fire exactly once
// per Execute call and never retries by itself.
//
// # Guarantees common to all executors
//
//   - Executors are immutable after construction and safe for concurrent use.
//   - Execute honours ctx: when ctx ends (the task's timeout, or a cancel
//     such as the "replace" concurrency policy) it stops the work and returns
//     promptly. The error then wraps ctx.Err() (and the cancel cause, when
//     the canceller gave a distinct one), so the caller tells outcomes apart
//     with errors.Is(err, context.DeadlineExceeded) for a timeout,
//     errors.Is(err, context.Canceled) for a cancel, and anything else is a
//     failure. Execute does not start any work when ctx has already ended
//     (Noop, which has none, succeeds); its error then wraps ErrNotStarted
//     too, so that the caller knows the attempt did nothing.
//   - Execute returns nil exactly when the fire succeeded. Every fire carries
//     its idempotency key, "<task-id>@<scheduled_at unix ms>", and the fencing
//     token, so that receivers can drop the duplicates that at-least-once
//     delivery allows.
//   - Execute leaves nothing running behind it (goroutines, connections
//     aside from the shared idle pool, processes in the command's process
//     group), with the exceptions stated below.
//
// # noop
//
// Noop succeeds at once and does not allocate: it measures the engine alone.
//
// # http
//
// One request per Execute, through an *http.Client shared by all HTTP
// executors of a node (NewClient builds one tuned for that). Success is a 2xx
// answer; any other status is a *StatusError that names the status and quotes
// the start of the response body. Redirects are not followed by NewClient's
// client: a 3xx is a failure that names the Location (following would turn
// a POST into a GET, or repeat a non-idempotent POST at another host with our
// idempotency headers). The request carries the task's headers, then these,
// which the task cannot override: Idempotency-Key, Shardcron-Task,
// Shardcron-Scheduled-At (RFC 3339 with milliseconds, UTC), Shardcron-Attempt
// (1-based), Shardcron-Node and Shardcron-Fence; User-Agent is
// "shardcron/<version>" unless the task sets one. Up to 64 KiB of the
// response body is read and the body closed, so that connections are reused.
// On timeout the request is abandoned (its HTTP/1 connection closed, or its
// HTTP/2 stream reset); whether the server acted on it is unknown, which is
// what the idempotency key is for.
//
// # exec
//
// Runs argv directly, without a shell, in a process group of its own, with
// stdin and stdout on /dev/null and the last 512 bytes of stderr kept for the
// error. Its environment is not the node's (which may hold secrets such as
// SHARDCRON_AUTH_TOKEN): it is PATH and HOME taken from the node, then the
// task's env, then SHARDCRON_IDEMPOTENCY_KEY, SHARDCRON_TASK,
// SHARDCRON_SCHEDULED_AT, SHARDCRON_ATTEMPT, SHARDCRON_NODE and
// SHARDCRON_FENCE, which the task cannot override. Exit status 0 is success;
// anything else is an *ExitError with the status and the stderr tail.
//
// When ctx ends, the whole process group, grandchildren included, is killed
// with SIGKILL. When argv[0] exits by itself, whatever it left running in its
// process group is killed too, so a fire never leaves processes behind. Not
// covered: processes that leave the group on purpose (setsid, daemons), and
// commands still running when the node itself dies (they are not killed; the
// next owner may run the fire again, with the same idempotency key). exec is
// implemented on Unix only; elsewhere NewExec fails.
//
// # Allow-lists
//
// A node may restrict what its executors reach: ExecSpec.Allow (a
// PathAllow of path prefixes commands must lie under) and
// ClientConfig.Allow (a HostAllow of hosts, domains, IPs and CIDRs the
// shared HTTP client may dial). What the spec already says is refused at
// construction; what only the fire knows (the PATH lookup of a bare
// command name, the addresses a host name resolves to) is refused at the
// fire, before anything runs or is sent. Both errors wrap ErrNotAllowed.
//
// # handler
//
// Calls a Go function registered by name in a Handlers set, looked up at each
// Execute (a handler registered after the task was loaded is found). An
// unknown name is an error wrapping ErrNotRegistered; a panicking handler is
// recovered into a *PanicError. The handler must honour ctx itself: the
// executor cannot stop a function that ignores it, and waits for it to return.
package executor
