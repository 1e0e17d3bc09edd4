// Package api is a node's HTTP face: the JSON API of docs/api.md ("HTTP API"),
// Prometheus metrics and a small embedded dashboard. Its Go client, used by
// the command line and by nodes to ask each other, is package api/client,
// which also holds the JSON bodies both sides share.
//
// A Server serves one started engine.Engine. It knows nothing of etcd: task
// definitions go through the engine's Registry, task state and execution
// history come from the engine, and what other nodes know (a task's state on
// its owner, their history, their counters) is asked of those nodes over
// HTTP, at the api_addr they publish in their membership record.
//
// # What it guarantees
//
//   - Every error answer is JSON {"error": "..."} with a 4xx or 5xx status,
//     unknown paths (404) and wrong methods (405) included. Task input that
//     the engine refuses is a 400 carrying the engine's message, and changes
//     nothing.
//   - With Config.AuthToken set, every request under /v1 needs
//     "Authorization: Bearer <token>" (compared in constant time); /healthz,
//     /readyz and /metrics stay open unless Config.ProbeAuth, and the
//     dashboard page always does. Config.ReadToken is accepted for GET and
//     HEAD only: every write with it is a 403. Nodes of a cluster are
//     expected to share the token: a node sends its own to its peers. No
//     answer or log line quotes a token.
//   - A write (any method but GET and HEAD) that a browser sends for a
//     page of another origin (Sec-Fetch-Site, or an Origin other than the
//     Host) is a 403, with or without tokens; requests without those
//     headers (programs, peers) are not concerned. Without
//     Config.AuthToken, a request that reached the node on a loopback
//     address is served only to a Host of localhost, *.localhost or an IP
//     address (DNS rebinding). The dashboard runs only its own script
//     (Content-Security-Policy by hash), and no JSON answer is sniffed as
//     HTML (nosniff).
//   - A task that no live node can run (exec without a node running
//     --allow-exec, a handler no node registered) is refused with a 400;
//     one only some nodes can run is written with a Shardcron-Warning.
//   - Task ids in paths are path-escaped segments ("billing%2Finvoice-42");
//     any id the engine accepts round-trips, "/" and spaces included.
//   - A request that needs other nodes (a task's state, history, the node
//     and partition lists) never fails because one of them does not answer:
//     the missing part is left out (and logged), bounded by a short timeout.
//
// # What it does not guarantee
//
//   - Reads that combine nodes are not a snapshot: while partitions move, a
//     partition may be reported "moving", a task's state may be missing,
//     and history merged from several nodes is whatever each had recorded
//     when asked (each node keeps the records of the fires it ran).
//   - Fire rates are averages over about the last 10 s, sampled once a
//     second; counters are since the node started.
//
// # Extension endpoints
//
// Nodes ask each other through these, which docs/api.md's table lists with
// the rest and which are part of the contract too:
//
//	GET /v1/tasks/{id}/state          the task's state if this node owns it, else 404
//	GET /v1/tasks/{id}/history?local=1  this node's own records only
//	GET /v1/failures?local=1          this node's latest failed attempts only
//	GET /v1/tasks:status              the tasks this node owns with a status
//	POST /v1/tasks:states             the states of the tasks this node holds
//	GET /v1/series?scope=self         this node's series only
//	GET /v1/nodes/self                this node's client.Node, with "owned" partitions
//
// Task answers carry ETag: "<version>", usable as If-Match.
package api
