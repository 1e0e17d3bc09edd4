// Command shardcron runs a shardcron node and talks to one: see docs/api.md for
// the commands, their flags and the HTTP API they use.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"
)

const usage = `shardcron: a distributed cron scheduler for fleets of millions of tasks.

Usage:
  shardcron server   [flags]     run a node (the main job)
  shardcron task     put|get|list|export|delete|pause|resume|trigger|backfill|history|failures ...
  shardcron import   FILE        bulk-load tasks from JSON Lines ('-' = stdin)
  shardcron nodes                members, their partitions and task counts
  shardcron ready                exit 0 if the node is ready (health checks)
  shardcron bench    SCENARIO    the benchmark harness
  shardcron version              this binary's version and Go release

Run 'shardcron COMMAND --help' for a command's flags.
Client commands reach a node at --server (env SHARDCRON_SERVER,
default http://127.0.0.1:8080) with --token (env SHARDCRON_TOKEN).
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "server":
		return runServer(rest, stdout, stderr)
	case "task":
		return runTask(rest, stdin, stdout, stderr)
	case "import":
		return runImport(rest, stdin, stdout, stderr)
	case "nodes":
		return runNodes(rest, stdout, stderr)
	case "ready":
		return runReady(rest, stdout, stderr)
	case "bench":
		return runBench(rest, stdout, stderr)
	case "version", "--version":
		return runVersion(rest, stdout, stderr)
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 && rest[0] != "help" && !strings.HasPrefix(rest[0], "-") {
			// As 'shardcron task help list' is 'task list --help'.
			return run(append(rest, "--help"), stdin, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "shardcron: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
}
