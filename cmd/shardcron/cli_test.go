package main

// Tests of the client commands (task, import, nodes, version), run
// in-process: flag parsing, output formats, import's line bookkeeping and
// exit codes, and the commands against a real node (engine, embedded etcd
// and the api package's handler on an httptest server).

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/shardcron/shardcron/api"
	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/childproc"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

// cliResult is what one command run printed and returned.
type cliResult struct {
	code           int
	stdout, stderr string
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// cli runs a client command in-process, as main's dispatch would.
func cli(stdin string, args ...string) cliResult {
	var out, errb bytes.Buffer
	in := strings.NewReader(stdin)
	var code int
	switch args[0] {
	case "task":
		code = runTask(args[1:], in, &out, &errb)
	case "import":
		code = runImport(args[1:], in, &out, &errb)
	case "nodes":
		code = runNodes(args[1:], &out, &errb)
	case "version":
		code = runVersion(args[1:], &out, &errb)
	case "ready":
		code = runReady(args[1:], &out, &errb)
	default:
		panic("cli: unknown command " + args[0])
	}
	return cliResult{code, out.String(), errb.String()}
}

// wantCLI checks the exit code and that stdout and stderr contain the
// given parts ("" for none).
func wantCLI(t *testing.T, r cliResult, code int, stdout, stderr []string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\n%s", r.code, code, r)
	}
	for _, s := range stdout {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("stdout lacks %q\n%s", s, r)
		}
	}
	for _, s := range stderr {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("stderr lacks %q\n%s", s, r)
		}
	}
}

// deadServer returns the URL of a server that is not there: a connection
// to it is refused, and no other test can take its port meanwhile.
func deadServer(t *testing.T) string {
	return "http://" + etcdtest.RefusedAddr(t)
}

// --- flags -------------------------------------------------------------------

// buildPut parses 'task put' arguments into a task, or the usage error.
func buildPut(t *testing.T, args ...string) (*task.Task, string) {
	t.Helper()
	c := newCommand("shardcron task put", taskPutHelp, io.Discard, io.Discard)
	var cf clientFlags
	var p putFlags
	p.register(c)
	cf.register(c)
	if _, code, done := c.parse(args); done {
		return nil, fmt.Sprintf("parse: exit %d", code)
	}
	set := map[string]bool{}
	c.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return p.build(set)
}

func TestTaskPut_FlagsBuildTask(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want *task.Task
	}{{
		name: "http with everything",
		args: []string{"--id", "billing/invoice-42", "--schedule", "0 */5 * * * *", "--timezone", "Europe/Berlin",
			"--url", "http://127.0.0.5/hook", "--method", "PUT", "--header", "X-Team=billing", "--header", "X-Eq=a=b",
			"--body", `{"k":1}`, "--task-timeout", "30s", "--max-attempts", "3", "--backoff", "1s",
			"--max-backoff", "1m", "--misfire", "fire_all", "--catchup-window", "5m", "--concurrency", "forbid",
			"--jitter", "2s", "--paused", "--label", "team=billing", "--label", "tier=1"},
		want: &task.Task{
			ID: "billing/invoice-42", Schedule: "0 */5 * * * *", Timezone: "Europe/Berlin",
			Executor: task.Executor{Type: task.ExecutorHTTP, URL: "http://127.0.0.5/hook", Method: "PUT",
				Headers: map[string]string{"X-Team": "billing", "X-Eq": "a=b"}, Body: `{"k":1}`},
			Timeout:       task.Duration(30 * time.Second),
			Retry:         task.Retry{MaxAttempts: 3, Backoff: task.Duration(time.Second), MaxBackoff: task.Duration(time.Minute)},
			Misfire:       task.MisfireFireAll,
			CatchupWindow: task.Duration(5 * time.Minute),
			Concurrency:   task.ConcurrencyForbid,
			Jitter:        task.Duration(2 * time.Second),
			Paused:        true,
			Labels:        map[string]string{"team": "billing", "tier": "1"},
		},
	}, {
		name: "exec argv in order",
		args: []string{"--id", "backup", "--schedule", "@daily", "--command", "/usr/bin/backup",
			"--command", "--full", "--command", "a b", "--env", "MODE=x=y"},
		want: &task.Task{ID: "backup", Schedule: "@daily", Executor: task.Executor{Type: task.ExecutorExec,
			Command: []string{"/usr/bin/backup", "--full", "a b"}, Env: map[string]string{"MODE": "x=y"}}},
	}, {
		name: "handler with payload",
		args: []string{"--id", "h1", "--schedule", "@every 30s", "--handler", "sync", "--payload", `{"a":[1,2]}`},
		want: &task.Task{ID: "h1", Schedule: "@every 30s", Executor: task.Executor{Type: task.ExecutorHandler,
			Name: "sync", Payload: json.RawMessage(`{"a":[1,2]}`)}},
	}, {
		name: "noop, defaults left to the server",
		args: []string{"--id", "n", "--schedule", "* * * * *", "--noop"},
		want: &task.Task{ID: "n", Schedule: "* * * * *", Executor: task.Executor{Type: task.ExecutorNoop}},
	}, {
		name: "a window, a count and deletion",
		args: []string{"--id", "w", "--schedule", "@hourly", "--noop", "--not-before", "2027-01-01T00:00:00Z",
			"--not-after", "2027-02-01T00:00:00+01:00", "--max-fires", "3", "--delete-after-fire", "--dry-run"},
		want: &task.Task{ID: "w", Schedule: "@hourly", Executor: task.Executor{Type: task.ExecutorNoop},
			NotBefore: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2027, 2, 1, 0, 0, 0, 0, time.FixedZone("", 3600)),
			MaxFires: 3, DeleteAfterFire: true},
	}, {
		name: "flags after --if-match and zero jitter allowed",
		args: []string{"--noop", "--jitter", "0s", "--if-match", "7", "--schedule", "@hourly", "--id", "j"},
		want: &task.Task{ID: "j", Schedule: "@hourly", Executor: task.Executor{Type: task.ExecutorNoop}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, msg := buildPut(t, tt.args...)
			if msg != "" {
				t.Fatalf("usage error %q", msg)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("task\n got %+v\nwant %+v", got, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("the built task does not validate: %v", err)
			}
		})
	}
}

func TestTaskPut_FlagErrors(t *testing.T) {
	base := []string{"--id", "a", "--schedule", "@hourly"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"nothing", nil, "missing --id, --schedule and an executor"},
		{"no executor", base, "missing an executor (--url, --command, --handler or --noop)"},
		{"no schedule", []string{"--id", "a", "--noop"}, "missing --schedule"},
		{"two executors", append(base, "--noop", "--url", "http://x/"), "--url and --noop: a task has one executor"},
		{"payload not JSON", append(base, "--handler", "h", "--payload", "abc"), `--payload: "abc" is not JSON`},
		{"zero attempts", append(base, "--noop", "--max-attempts", "0"), "--max-attempts: 0 is less than 1"},
		{"zero timeout", append(base, "--noop", "--task-timeout", "0s"), "--task-timeout: 0s is not more than 0"},
		{"negative jitter", append(base, "--noop", "--jitter", "-1s"), "--jitter: -1s is negative"},
		{"header without =", append(base, "--url", "http://x/", "--header", "X"), "parse: exit 2"},
		{"bad duration", append(base, "--noop", "--backoff", "soon"), "parse: exit 2"},
		{"not a time", append(base, "--noop", "--not-before", "tomorrow"), `--not-before: "tomorrow" is not an RFC 3339 time`},
		{"zero fires", append(base, "--noop", "--max-fires", "0"), "--max-fires: 0 is less than 1"},
		{"label twice", append(base, "--noop", "--label", "team=a", "--label", "team=b"), "parse: exit 2"}, // it kept the last
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, msg := buildPut(t, tt.args...)
			if !strings.Contains(msg, tt.want) {
				t.Fatalf("usage error %q, want it to contain %q", msg, tt.want)
			}
		})
	}
}

func TestCommand_ParseFlagsAnywhere(t *testing.T) {
	tests := []struct {
		args     []string
		wantPos  []string
		wantBody string
		wantAll  bool
	}{
		{[]string{"a", "--all"}, []string{"a"}, "", true},
		{[]string{"--all", "a", "b", "--body", "x"}, []string{"a", "b"}, "x", true},
		{[]string{"a", "--", "--all", "-"}, []string{"a", "--all", "-"}, "", false},
		{[]string{"--body", "--", "b", "--all"}, []string{"b"}, "--", true}, // "--" as a flag's value
		{[]string{"-", "--all"}, []string{"-"}, "", true},                   // stdin
		{[]string{"--all", "--", "x"}, []string{"x"}, "", true},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			c := newCommand("test", "Usage: test", io.Discard, io.Discard)
			var body string
			var all bool
			c.fs.StringVar(&body, "body", "", "")
			c.fs.BoolVar(&all, "all", false, "")
			pos, _, done := c.parse(tt.args)
			if done {
				t.Fatal("parse failed")
			}
			if !reflect.DeepEqual(pos, tt.wantPos) || body != tt.wantBody || all != tt.wantAll {
				t.Fatalf("pos %q body %q all %v; want %q %q %v", pos, body, all, tt.wantPos, tt.wantBody, tt.wantAll)
			}
		})
	}
}

// resolveClientFlags parses args as a client command's flags and resolves
// them with the environment: the flags and resolve's usage error.
func resolveClientFlags(t *testing.T, args ...string) (clientFlags, string) {
	t.Helper()
	c := newCommand("x", "", io.Discard, io.Discard)
	var cf clientFlags
	cf.register(c)
	if _, _, done := c.parse(args); done {
		t.Fatalf("parse %q failed", args)
	}
	return cf, cf.resolve(c)
}

// A token given both directly and as a file is refused naming each where
// it came from, once: the message named both variables whichever way the
// two came, the command line included.
func TestClientFlags_TokenBothSetNamesWhereEachCameFrom(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"--token", "x", "--token-file", "f"}, "--token and --token-file are both set: give one"},
		{map[string]string{envName("token"): "x", envName("token-file"): "f"}, nil, "SHARDCRON_TOKEN and SHARDCRON_TOKEN_FILE are both set: give one"},
		{map[string]string{envName("token"): "x"}, []string{"--token-file", "f"}, "SHARDCRON_TOKEN and --token-file are both set: give one"},
		{map[string]string{envName("token-file"): "f"}, []string{"--token", "x"}, "--token and SHARDCRON_TOKEN_FILE are both set: give one"},
	} {
		t.Run(c.want, func(t *testing.T) {
			for _, k := range []string{envName("token"), envName("token-file")} {
				t.Setenv(k, c.env[k]) // empty is unset to resolve
			}
			if _, msg := resolveClientFlags(t, c.args...); msg != c.want {
				t.Errorf("got %q", msg)
			}
		})
	}
}

// The client's TLS files are refused by the variables that gave them, as
// the server's are: they said --cert, --key and --cacert, which the
// command line did not give.
func TestClientFlags_TLSRefusedAsGiven(t *testing.T) {
	dir := t.TempDir()
	bad, none := filepath.Join(dir, "bad.pem"), filepath.Join(dir, "none.pem")
	writeFile(t, bad, []byte("not a certificate"))
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string // the start of the refusal
	}{
		{nil, []string{"--cert", bad}, "--cert and --key go together"},
		{map[string]string{envName("key"): bad}, nil, "--cert and SHARDCRON_KEY go together"},
		{nil, []string{"--cacert", none}, "--cacert: open " + none},
		{map[string]string{envName("cacert"): none}, nil, "SHARDCRON_CACERT: open " + none},
		{nil, []string{"--cert", bad, "--key", bad}, "--cert " + bad + ", --key " + bad + ": "},
		{map[string]string{envName("cert"): bad}, []string{"--key", bad}, "SHARDCRON_CERT " + bad + ", --key " + bad + ": "},
	} {
		t.Run(c.want, func(t *testing.T) {
			for _, k := range []string{envName("cacert"), envName("cert"), envName("key")} {
				t.Setenv(k, c.env[k]) // empty is unset to resolve
			}
			if _, msg := resolveClientFlags(t, c.args...); !strings.HasPrefix(msg, c.want) {
				t.Errorf("got %q", msg)
			}
		})
	}
}

// A token with a control character in it, and a token the node refuses,
// are named by where the token came from: the flag or variable, and its
// file. The refusal listed every source ("the token (--token,
// --token-file or SHARDCRON_TOKEN) holds ..."), and the node's refusal
// named --token or SHARDCRON_TOKEN, when resolve knew which one it was.
func TestClientFlags_TokenNamedByItsSource(t *testing.T) {
	dir := t.TempDir()
	bell, wrong := filepath.Join(dir, "bell"), filepath.Join(dir, "wrong")
	writeFile(t, bell, []byte("s3\acret\n"))
	writeFile(t, wrong, []byte("wrong\n"))
	for _, c := range []struct {
		env     map[string]string
		args    []string
		refused string // resolve's refusal; "": the token is sent
		hint    string // what a 401 adds when the token is sent
	}{
		{nil, []string{"--token", "s3cret\n"},
			"the token given by --token holds the control character U+000A at byte 6: a trailing newline from a file? --token-file drops it", ""},
		{map[string]string{envName("token"): "s3cret\n"}, nil,
			"the token given by SHARDCRON_TOKEN holds the control character U+000A at byte 6: a trailing newline from a file? SHARDCRON_TOKEN_FILE drops it", ""},
		{nil, []string{"--token-file", bell}, "the token read from --token-file " + bell + " holds the control character U+0007 at byte 2", ""},
		{map[string]string{envName("token-file"): bell}, nil, "the token read from SHARDCRON_TOKEN_FILE " + bell + " holds the control character U+0007 at byte 2", ""},
		{nil, []string{"--token", "wrong"}, "", "the node refused the token given by --token"},
		{map[string]string{envName("token"): "wrong"}, nil, "", "the node refused the token given by SHARDCRON_TOKEN"},
		{nil, []string{"--token-file", wrong}, "", "the node refused the token read from --token-file " + wrong},
		{map[string]string{envName("token-file"): wrong}, nil, "", "the node refused the token read from SHARDCRON_TOKEN_FILE " + wrong},
		{nil, nil, "", "the node requires a token: pass --token or --token-file, or set SHARDCRON_TOKEN or SHARDCRON_TOKEN_FILE"},
	} {
		t.Run(c.refused+c.hint, func(t *testing.T) {
			for _, k := range []string{envName("token"), envName("token-file")} {
				t.Setenv(k, c.env[k]) // empty is unset to resolve
			}
			cf, msg := resolveClientFlags(t, c.args...)
			if msg != c.refused {
				t.Fatalf("refused %q, want %q", msg, c.refused)
			}
			if c.refused != "" {
				return
			}
			msg = describeError(&cf, "", &client.Error{Status: http.StatusUnauthorized, Message: "not this node's auth token"})
			if want := "shardcron: not this node's auth token\n" + c.hint; msg != want {
				t.Errorf("a 401 says %q, want %q", msg, want)
			}
		})
	}
}

// A --token-file that cannot be read is refused by the variable that
// named it, as the server's secrets' files are: it said --token-file,
// which the command line did not give.
func TestClientFlags_TokenFileRefusedAsGiven(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none")
	t.Setenv(envName("token-file"), missing)
	if _, msg := resolveClientFlags(t); !strings.HasPrefix(msg, "SHARDCRON_TOKEN_FILE: open "+missing) {
		t.Errorf("got %q, want SHARDCRON_TOKEN_FILE named", msg)
	}
	if _, msg := resolveClientFlags(t, "--token-file", missing+"2"); !strings.HasPrefix(msg, "--token-file: open "+missing+"2") {
		t.Errorf("got %q, want --token-file named", msg)
	}
}

// A --server that SHARDCRON_SERVER gave is named by it, in its refusal
// and where an error names the address: they said --server, which the
// command line did not give.
func TestClientFlags_ServerNamedAsGiven(t *testing.T) {
	foreign := &client.Error{Status: http.StatusNotFound, Message: "404 page not found", Foreign: true}
	unresolved := &net.DNSError{Err: "no such host", Name: "node.invalid", IsNotFound: true}
	for _, given := range []string{"--server", envName("server")} {
		t.Run(given, func(t *testing.T) {
			var args []string
			set := func(v string) {
				if given == envName("server") {
					t.Setenv(envName("server"), v)
				} else {
					args = []string{"--server", v}
				}
			}
			set("ftp://x")
			if _, msg := resolveClientFlags(t, args...); !strings.HasPrefix(msg, given+`: "ftp://x" is not an http or https URL`) {
				t.Errorf("refused %q, want %s named", msg, given)
			}
			set("http://node.invalid:8080")
			cf, msg := resolveClientFlags(t, args...)
			if msg != "" {
				t.Fatal(msg)
			}
			if msg := describeError(&cf, "", fmt.Errorf("get: %w", unresolved)); !strings.Contains(msg, "cannot resolve the host of "+given+" http://node.invalid:8080: ") {
				t.Errorf("unresolved: %q, want %s named", msg, given)
			}
			if msg := describeError(&cf, "", foreign); !strings.HasSuffix(msg, "\nis "+given+" the address of a node's API (its --listen)?") {
				t.Errorf("foreign: %q, want %s named", msg, given)
			}
		})
	}
}

func TestClientFlags_ServerAndEnv(t *testing.T) {
	t.Setenv(envName("server"), "127.0.0.7:9000/")
	t.Setenv(envName("token"), "from-env")
	cf, msg := resolveClientFlags(t)
	if msg != "" || cf.server != "http://127.0.0.7:9000" || cf.token != "from-env" {
		t.Fatalf("from env: %+v %q", cf, msg)
	}
	cf, msg = resolveClientFlags(t, "--server", "https://node:1/", "--token", "flag")
	if msg != "" || cf.server != "https://node:1" || cf.token != "flag" {
		t.Fatalf("flags win over env: %+v %q", cf, msg)
	}
	for _, bad := range [][]string{{"--server", "ftp://x"}, {"--output", "yaml"}, {"--timeout", "0s"}} {
		if _, msg := resolveClientFlags(t, bad...); msg == "" {
			t.Errorf("%q: no usage error", bad)
		}
	}
	// A query, a fragment or a user in --server is refused: paths were
	// appended after them ("/?x=1/v1/tasks/hello"), and a password is
	// never quoted back.
	for _, tc := range []struct{ server, want string }{
		{"http://127.0.0.1:18765?x=1", "has a query"},
		{"http://127.0.0.1:18765/?", "has a query"},
		{"127.0.0.1:18765/?x=1", "has a query"},
		{"http://127.0.0.1:18765#top", "has a fragment"},
		{"http://127.0.0.1:18765/#", "has a fragment"},
		{"http://admin:hunter2@127.0.0.1:18765", "holds a user name or password"},
		{"http://admin@127.0.0.1:18765", "holds a user name or password"},
		// A port out of range was a runtime error (exit 1) at the dial:
		// "dial tcp: address 99999: invalid port".
		{"127.0.0.1:99999", "port 99999 is not within 1-65535"},
		{"https://node:0", "port 0 is not within 1-65535"},
	} {
		_, msg := resolveClientFlags(t, "--server", tc.server)
		if !strings.Contains(msg, "--server: ") || !strings.Contains(msg, tc.want) || strings.Contains(msg, "hunter2") {
			t.Errorf("--server %q: %q, want a usage error that it %s, no password", tc.server, msg, tc.want)
		}
	}
	if cf, msg := resolveClientFlags(t, "--server", "https://node:1/base/"); msg != "" || cf.server != "https://node:1/base" {
		t.Errorf("a path: %q %q, want it kept", cf.server, msg)
	}
}

// --- help and usage errors ----------------------------------------------------

func TestHelp_EveryCommand(t *testing.T) {
	commands := map[string][]string{
		"task put":      {"without --paused (or \"paused\": true) is resumed", "--task-timeout", "--if-match", "-f, --file FILE", "--header K=V", "--command ARG", "--label K=V", "Examples:", "at most 24h (server default 1m)", "at most 100 (server default 1)", "at most 1h"},
		"task get":      {"ID"},
		"task list":     {"--prefix", "--label K=V", "--limit", "--all", "[--cursor C]", "--status S", "failing, paused or stale"},
		"task failures": {"--limit", "show the N latest failures (1-1000) (default 20)", "newest first"},
		"task export":   {"--prefix", "--label K=V", "JSON Lines", "one etcd revision"},
		"task delete":   {"ID"},
		"task pause":    {"ID", "--note TEXT"},
		"task resume":   {"ID"},
		"task trigger":  {"ID", "--body BODY", "--payload JSON"},
		"task backfill": {"--from TIME", "--to TIME", "--concurrency N", "10000", "--cancel"},
		"task history":  {"--limit", "show the N latest records (1-1000) (default 20)"},
		"import":        {"--batch", "(default 1000)", "--in-flight", "(default 4)", "once (default 4)", "--quiet, -q\n", "JSON Lines", `is resumed by a line without "paused": true`},
		"nodes":         {"PARTITIONS"},
		"version":       {"--output"},
		"ready":         {"/readyz", "--server"},
	}
	for name, parts := range commands {
		for _, h := range []string{"--help", "-h"} {
			t.Run(name+" "+h, func(t *testing.T) {
				r := cli("", append(strings.Fields(name), h)...)
				wantCLI(t, r, 0, append(parts, "Usage: shardcron "+name, "Example"), nil)
				if r.stderr != "" {
					t.Errorf("help wrote to stderr: %q", r.stderr)
				}
				if name != "version" {
					for _, s := range []string{"Client flags:", "--server URL", "(default http://127.0.0.1:8080)",
						envName("server"), envName("token"), "--timeout", "(default 30s)", "--output", "(default table)"} {
						if !strings.Contains(r.stdout, s) {
							t.Errorf("help lacks %q:\n%s", s, r.stdout)
						}
					}
				}
			})
		}
	}
	for _, args := range [][]string{{"task", "--help"}, {"task", "help"}, {"task", "-h"}} {
		wantCLI(t, cli("", args...), 0, []string{"Subcommands:", "history", "Example"}, nil)
	}
	wantCLI(t, cli("", "task", "help", "list"), 0, []string{"Usage: shardcron task list"}, nil)
}

// TestHelp_APIDocNamesEveryFlag: docs/api.md, which scripts go by, names
// every flag that a client command's --help lists (the bulk forms' --yes
// was missing), as TestServer_HelpExplainsFlags checks the server's.
func TestHelp_APIDocNamesEveryFlag(t *testing.T) {
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	flagLine := regexp.MustCompile(`(?m)^  (-{1,2}[a-z-]+)`)
	for _, name := range clientCommands {
		r := cli("", append(strings.Fields(name), "--help")...)
		flags := flagLine.FindAllStringSubmatch(r.stdout, -1)
		if len(flags) == 0 {
			t.Fatalf("%s --help lists no flag:\n%s", name, r.stdout)
		}
		for _, m := range flags {
			named := regexp.MustCompile(`(^|[^-a-z])` + m[1] + `([^a-z-]|$)`)
			if !named.Match(doc) {
				t.Errorf("docs/api.md does not name %s of %s", m[1], name)
			}
		}
	}
}

// clientCommands are the commands that talk to a node, and version.
var clientCommands = []string{"task put", "task get", "task list", "task export", "task delete", "task pause",
	"task resume", "task trigger", "task backfill", "task history", "task failures", "import", "nodes", "ready", "version"}

// TestHelp_FlagsShowTheirUsageLinesValue: a flag that a command's usage
// lines (and docs/api.md, which writes them alike) show with a value,
// "[--note TEXT]", is listed with that value among the command's flags,
// not as Go names its type ("--note string", "--limit int").
func TestHelp_FlagsShowTheirUsageLinesValue(t *testing.T) {
	given := regexp.MustCompile(`(--[a-z-]+) ([A-Z][A-Z=]*)\b`)
	for _, name := range clientCommands {
		r := cli("", append(strings.Fields(name), "--help")...)
		usage, _, _ := strings.Cut(r.stdout, "\n\n")
		for _, m := range given.FindAllStringSubmatch(usage, -1) {
			line := regexp.MustCompile(`(?m)^  (-[a-z], )?` + m[1] + `( [^ \n]+)?$`).FindStringSubmatch(r.stdout)
			if line == nil {
				t.Errorf("%s --help: the usage shows %s %s, and no flag %s is listed", name, m[1], m[2], m[1])
			} else if strings.TrimSpace(line[2]) != m[2] {
				t.Errorf("%s --help: the usage shows %s %s, the flags %s%s", name, m[1], m[2], m[1], line[2])
			}
		}
	}
}

// TestHelp_OfACommand: 'shardcron help COMMAND' is 'shardcron COMMAND
// --help', as 'shardcron task help SUBCOMMAND' is; it printed the list of
// commands whatever followed.
func TestHelp_OfACommand(t *testing.T) {
	for args, want := range map[string]string{
		"help task":      "Usage: shardcron task SUBCOMMAND",
		"help task list": "Usage: shardcron task list",
		"help import":    "Usage: shardcron import",
		"help server":    "Usage: shardcron server",
		"help":           "shardcron: a distributed cron scheduler",
		"--help":         "shardcron: a distributed cron scheduler",
	} {
		var out, errb bytes.Buffer
		if code := run(strings.Fields(args), nil, &out, &errb); code != exitOK || !strings.HasPrefix(out.String(), want) {
			t.Errorf("shardcron %s: exit %d, stdout %q, stderr %q; want exit 0 and %q", args, code, out.String(), errb.String(), want)
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"help", "frob"}, nil, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), `unknown command "frob"`) {
		t.Errorf("shardcron help frob: exit %d, stderr %q; want a usage error", code, errb.String())
	}
}

// TestUsage_MatchesAPIDoc: the commands and arguments that 'shardcron
// --help' lists are those of docs/api.md's list of commands ('bench
// [flags]' stood there for 'bench SCENARIO', which the command requires).
func TestUsage_MatchesAPIDoc(t *testing.T) {
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	// The arguments end where the descriptions start, at column 31.
	synopses := func(text, indent string) []string {
		var out []string
		for _, line := range strings.Split(text, "\n") {
			if rest, ok := strings.CutPrefix(line, indent+"shardcron "); ok {
				syn := "shardcron " + rest
				out = append(out, strings.Join(strings.Fields(syn[:min(len(syn), 31)]), " "))
			}
		}
		return out
	}
	_, block, _ := strings.Cut(string(doc), "## The binary: `shardcron`\n\n```\n")
	block, _, _ = strings.Cut(block, "```")
	want := synopses(block, "")
	if got := synopses(usage, "  "); len(want) < 7 || !slices.Equal(got, want) {
		t.Errorf("shardcron --help lists\n%s\ndocs/api.md\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestUsageErrors_ExitTwo(t *testing.T) {
	dead := deadServer(t)
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"task"}, []string{"missing subcommand", "Subcommands:"}},
		{[]string{"task", "frob"}, []string{`unknown subcommand "frob"`}},
		{[]string{"task", "put", "--bogus"}, []string{"shardcron task put: flag provided but not defined: --bogus", "Run 'shardcron task put --help' for usage."}},
		{[]string{"task", "put"}, []string{"missing --id, --schedule and an executor"}},
		{[]string{"task", "put", "-f", "x.json", "--id", "a"}, []string{"--id cannot be combined with -f"}},
		{[]string{"task", "put", "--id", "a", "extra"}, []string{`unexpected argument "extra"`}},
		{[]string{"task", "get"}, []string{"missing the task ID", "Run 'shardcron task get --help'"}},
		{[]string{"task", "get", "a", "b"}, []string{"want one task ID, got 2 arguments"}},
		// Each argument quoted: "a b" and "c" read as three when joined.
		{[]string{"task", "get", "a b", "c"}, []string{`want one task ID, got 2 arguments: "a b" "c"`}},
		{[]string{"task", "get", "a", "--output", "yaml"}, []string{`--output: "yaml" is not table or json`}},
		{[]string{"task", "delete"}, []string{"missing the task ID"}},
		{[]string{"task", "pause", "--timeout"}, []string{"flag needs an argument: --timeout"}},
		{[]string{"task", "resume", "--server", "ftp://x", "a"}, []string{"--server"}},
		{[]string{"task", "get", "hello", "--server", "http://127.0.0.1:18765?x=1"}, []string{`--server: "http://127.0.0.1:18765?x=1" has a query`}},
		{[]string{"task", "trigger"}, []string{"missing the task ID"}},
		{[]string{"task", "pause", "a", "--label", "team=x"}, []string{"give a task ID or a selector", `"a"`}},
		{[]string{"task", "resume", "--dry-run", "a"}, []string{"--dry-run and --yes go with a selector"}},
		{[]string{"task", "delete", "--all", "--prefix", "x"}, []string{"--all chooses every task"}},
		{[]string{"task", "trigger", "--label", "novalue"}, []string{"want KEY=VALUE"}},
		{[]string{"task", "history", "a", "--limit", "0"}, []string{"--limit: 0 is not from 1 to 1000"}},
		{[]string{"task", "history", "a", "--limit", "5000"}, []string{"--limit: 5000 is not from 1 to 1000"}},
		{[]string{"task", "list", "--limit", "10001"}, []string{"--limit: 10001 is not within 0-10000"}},
		{[]string{"task", "list", "--limit", "-1"}, []string{"--limit: -1 is not within 0-10000"}},
		{[]string{"task", "delete", "--all", "--if-match", "3"}, []string{"--if-match applies to one task"}},
		{[]string{"task", "delete", "a", "--if-match", "-1"}, []string{"--if-match: -1 is not a version"}},
		// 0 given is no condition the API takes: leaving the flag out is how to ask for none.
		{[]string{"task", "delete", "a", "--if-match", "0"}, []string{"--if-match: 0 is not a version (versions start at 1; leave the flag out for none)"}},
		{[]string{"task", "put", "--id", "a", "--if-match", "0"}, []string{"--if-match: 0 is not a version (versions start at 1; leave the flag out for none)"}},
		{[]string{"task", "trigger", "a", "--body", "x", "--payload", "1"}, []string{"--body (http tasks) and --payload (handler tasks) exclude each other"}},
		{[]string{"task", "trigger", "a", "--payload", "{x"}, []string{`--payload: "{x" is not JSON`}},
		{[]string{"task", "backfill", "a", "--to", "2026-01-01T00:00:00Z"}, []string{"missing --from"}},
		{[]string{"task", "backfill", "a", "--from", "yesterday", "--to", "2026-01-01T00:00:00Z"}, []string{`--from: "yesterday" is not an RFC 3339 time`}},
		{[]string{"task", "backfill", "a", "--from", "2025-01-01T00:00:00Z", "--to", "2026-01-01T00:00:00Z", "--concurrency", "0"}, []string{"--concurrency: 0 is not within 1-32"}},
		{[]string{"task", "list", "extra"}, []string{`unexpected argument "extra"`}},
		{[]string{"task", "list", "--label", "novalue"}, []string{"want KEY=VALUE"}},
		{[]string{"task", "export", "--label", "bad key=1"}, []string{`invalid value "bad key=1" for flag --label: key "bad key": want 1-63 bytes`}},
		{[]string{"task", "pause", "--label", "tëam=1"}, []string{`key "tëam"`}},
		{[]string{"import"}, []string{"missing FILE"}},
		{[]string{"import", "a", "b"}, []string{"want one FILE, got 2"}},
		{[]string{"import", "a b", "c"}, []string{`want one FILE, got 2 arguments: "a b" "c"`}},
		{[]string{"task", "pause", "--prefix", ""}, []string{"--prefix is empty"}},
		// A prefix no id can start with, as a label key no task can carry:
		// the node refused it, exit 1, the export after "export stopped".
		{[]string{"task", "export", "--prefix", "a\x01"}, []string{`invalid value "a\x01" for flag --prefix: want the start of a task id: "a\x01" contains the control character U+0001`}},
		{[]string{"task", "list", "--prefix", strings.Repeat("a", 257)}, []string{"for flag --prefix: want the start of a task id: 257 bytes, more than 256"}},
		// A cursor is the last id of a page: one no id can be, as a
		// prefix, was the node's refusal, exit 1.
		{[]string{"task", "list", "--cursor", "a\x01"}, []string{`invalid value "a\x01" for flag --cursor: not the last id of a page ("a\x01" contains the control character U+0001)`}},
		{[]string{"task", "pause", "--prefix", "a\xff"}, []string{`for flag --prefix: want the start of a task id: "a\xff" is not valid UTF-8`}},
		// Both ends of a flag's range are usage errors: the end the task
		// model checks (Validate) as the one the flag checks itself.
		{[]string{"task", "put", "--id", "a", "--schedule", "@hourly", "--noop", "--task-timeout", "0s"}, []string{"--task-timeout: 0s is not more than 0"}},
		{[]string{"task", "put", "--id", "a", "--schedule", "@hourly", "--noop", "--task-timeout", "100000h"}, []string{"--task-timeout (timeout): "}},
		{[]string{"task", "put", "--id", "a", "--schedule", "@hourly", "--noop", "--max-fires", "10001"}, []string{"--max-fires (max_fires): "}},
		{[]string{"import", "--batch", "0", "-"}, []string{"--batch: 0 is not within 1-10000"}},
		{[]string{"nodes", "extra"}, []string{`unexpected argument "extra"`}},
		{[]string{"ready", "extra"}, []string{`unexpected argument "extra"`}},
		{[]string{"version", "--output", "xml"}, []string{`--output: "xml"`}},
		{[]string{"version", "--server", "x"}, []string{"flag provided but not defined: --server"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			// A dead server: nothing must be sent anyway.
			args := slices.Clone(tt.args)
			switch {
			case args[0] == "task" && len(args) > 1:
				args = slices.Insert(args, 2, "--server", dead)
			case args[0] == "import" || args[0] == "nodes":
				args = slices.Insert(args, 1, "--server", dead)
			}
			r := cli("", args...)
			wantCLI(t, r, 2, nil, tt.want)
			if r.stdout != "" {
				t.Errorf("usage error wrote to stdout: %q", r.stdout)
			}
		})
	}
}

func TestRuntimeErrors_ExitOne(t *testing.T) {
	dead := deadServer(t)
	hint := "is a node running at " + dead + "? start one with: shardcron server"
	for _, args := range [][]string{
		{"task", "get", "a"}, {"task", "list"}, {"task", "delete", "a"}, {"task", "pause", "a"},
		{"task", "resume", "a"}, {"task", "trigger", "a"}, {"task", "history", "a"}, {"nodes"},
		{"task", "put", "--id", "a", "--schedule", "@hourly", "--noop"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			r := cli("", append(args, "--server", dead)...)
			wantCLI(t, r, 1, nil, []string{"shardcron: ", "connection refused", hint})
		})
	}
	// Something that is not a shardcron node at --server: said so, with
	// what it answered, not taken for a task not found or dumped whole.
	foreign := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/nodes" {
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, "<html><head><title>Directory listing</title></head><body>"+strings.Repeat("x", 4000)+"</body></html>")
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(foreign.Close)
	for args, want := range map[string]string{
		"task get hello": `answered HTTP 404, not as a shardcron node does ("404 page not found")`,
		"nodes":          `answered HTTP 200, not as a shardcron node does (an HTML page, "Directory listing")`,
	} {
		r := cli("", append(strings.Fields(args), "--server", foreign.URL)...)
		wantCLI(t, r, 1, nil, []string{"shardcron: ", foreign.URL + " " + want, "is --server the address of a node's API (its --listen)?"})
		if strings.Contains(r.stderr, "xxxx") {
			t.Errorf("%s: the answer dumped:\n%s", args, r)
		}
	}
	t.Run("invalid task from flags is a usage error", func(t *testing.T) {
		r := cli("", "task", "put", "--server", dead, "--id", "a", "--schedule", "61 * * * *", "--noop")
		wantCLI(t, r, 2, nil, []string{`shardcron task put: task "a": --schedule (schedule): `})
		if strings.Contains(r.stderr, "connection refused") {
			t.Errorf("an invalid task was sent:\n%s", r)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		r := cli("", "task", "put", "--server", dead, "-f", filepath.Join(t.TempDir(), "none.json"))
		wantCLI(t, r, 1, nil, []string{"shardcron: open ", "no such file"})
	})
	t.Run("file without id", func(t *testing.T) {
		r := cli(`{"schedule":"@hourly"}`, "task", "put", "--server", dead, "-f", "-")
		wantCLI(t, r, 1, nil, []string{`shardcron: stdin: the task has no "id"`})
	})
	t.Run("file of an array", func(t *testing.T) {
		r := cli(`[{"id":"a"}]`, "task", "put", "--server", dead, "-f", "-")
		wantCLI(t, r, 1, nil, []string{"shardcron: stdin: not a task: want one JSON object (shardcron import takes many"})
		r = cli(`{"id":`, "task", "put", "--server", dead, "-f", "-")
		wantCLI(t, r, 1, nil, []string{"shardcron: stdin: malformed JSON at byte"})
	})
	// A JSON Lines file of several tasks was "malformed JSON at byte 21:
	// invalid character '{' after top-level value".
	t.Run("file of JSON Lines", func(t *testing.T) {
		r := cli("{\"id\":\"a\"}\n{\"id\":\"b\"}\n", "task", "put", "--server", dead, "-f", "-")
		wantCLI(t, r, 1, nil, []string{"shardcron: stdin: not a task: more than one JSON value, want one JSON object (shardcron import takes many"})
		r = cli(`{"id":"a"} x`, "task", "put", "--server", dead, "-f", "-")
		wantCLI(t, r, 1, nil, []string{"shardcron: stdin: malformed JSON at byte 12"})
	})
	t.Run("import of a directory", func(t *testing.T) {
		dir := t.TempDir()
		r := cli("", "import", "--server", dead, dir)
		wantCLI(t, r, 1, nil, []string{"shardcron: " + dir + " is a directory: give a JSON Lines file"})
		if strings.Contains(r.stdout, "imported") {
			t.Errorf("a summary of an import that never began:\n%s", r)
		}
	})
	t.Run("import of a missing file", func(t *testing.T) {
		r := cli("", "import", "--server", dead, filepath.Join(t.TempDir(), "none.jsonl"))
		wantCLI(t, r, 1, nil, []string{"no such file"})
	})
	t.Run("import with no node", func(t *testing.T) {
		r := cli(`{"id":"a"}`+"\n", "import", "--server", dead, "-")
		wantCLI(t, r, 1, []string{"imported 0 tasks, 0 errors"}, []string{"shardcron: import: cannot connect", hint})
	})
}

func TestVersion(t *testing.T) {
	r := cli("", "version")
	wantCLI(t, r, 0, []string{"shardcron dev (go1."}, nil)
	r = cli("", "version", "--output", "json")
	var v struct{ Version, Go, OS, Arch string }
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Version != "dev" || !strings.HasPrefix(v.Go, "go") {
		t.Fatalf("version json %q: %+v %v", r.stdout, v, err)
	}
}

// --- output -------------------------------------------------------------------

func TestOutput_Tables(t *testing.T) {
	at := time.Date(2025, 12, 2, 14, 5, 0, 0, time.UTC)
	p := 7
	tasks := []*task.Task{{
		ID: "billing/invoice-42", Schedule: "0 */5 * * * *", Timezone: "Europe/Berlin", Version: 1234,
		Executor: task.Executor{Type: task.ExecutorHTTP, URL: "http://127.0.0.5/hook", Method: "POST"},
		State:    &task.State{Owner: "n1", NextFireAt: at},
	}, {
		ID: "b", Schedule: "@daily", Timezone: "UTC", Paused: true, Version: 9, Partition: &p,
		Executor: task.Executor{Type: task.ExecutorExec, Command: []string{"/bin/echo", "a b"}},
	}}
	execs := []task.Execution{{
		TaskID: "a", ScheduledAt: at, StartedAt: at.Add(3 * time.Millisecond), FinishedAt: at.Add(1503 * time.Millisecond),
		Attempt: 2, Node: "n1", Status: task.ExecutionFailed, Error: "HTTP 500:\nboom",
	}, {TaskID: "a", ScheduledAt: at.Add(-time.Minute + 250*time.Millisecond), Attempt: 1, Node: "n2", Status: task.ExecutionSkipped}}
	nodes := []client.Node{
		{ID: "n1", APIAddr: "127.0.0.1:8080", Version: "v1", StartedAt: at, Partitions: 512, Owned: make([]int, 512), Tasks: 1000, FireRate: 12.345, Ready: true},
		{ID: "n2", APIAddr: "127.0.0.2:8080", Version: "v1", StartedAt: at, Partitions: 512, Owned: make([]int, 100), Tasks: 10, Ready: false},
		{ID: "n3", Partitions: 0, Error: "timeout"},
		{ID: "n4", APIAddr: "127.0.0.4:8080", Version: "v1", StartedAt: at, Partitions: 0, Error: "connection refused", Leaving: true},
	}
	for _, tt := range []struct {
		name  string
		write func(io.Writer) error
		want  string
	}{{
		name:  "task table",
		write: func(w io.Writer) error { return writeTaskTable(w, tasks) },
		want: "" +
			"ID                  SCHEDULE       TZ             EXECUTOR                         PAUSED  NEXT FIRE             VERSION\n" +
			"billing/invoice-42  0 */5 * * * *  Europe/Berlin  http POST http://127.0.0.5/hook  no      2025-12-02T14:05:00Z  1234\n" +
			"b                   @daily         UTC            exec /bin/echo \"a b\"             yes     -                     9\n",
	}, {
		name:  "history table",
		write: func(w io.Writer) error { return writeHistoryTable(w, execs) },
		want: "" +
			"SCHEDULED                ATTEMPT  STATUS   NODE  DURATION  ERROR\n" +
			"2025-12-02T14:05:00Z     2        failed   n1    1.5s      HTTP 500: boom\n" +
			"2025-12-02T14:04:00.25Z  1        skipped  n2    -         -\n",
	}, {
		name: "history table with output",
		write: func(w io.Writer) error {
			return writeHistoryTable(w, []task.Execution{{ScheduledAt: execs[0].ScheduledAt, Attempt: 1, Status: "failed",
				Node: "n1", Error: "exit status 1", Output: "line 1\n\x1b[2Jline 2\n"}})
		},
		want: "" +
			"SCHEDULED             ATTEMPT  STATUS  NODE  DURATION  ERROR\n" +
			"2025-12-02T14:05:00Z  1        failed  n1    -         exit status 1\n" +
			"\n--- output of 2025-12-02T14:05:00Z, attempt 1 (failed) ---\nline 1\n\uFFFD[2Jline 2\n",
	}, {
		name:  "nodes table",
		write: func(w io.Writer) error { return writeNodesTable(w, nodes) },
		want: "" +
			"ID  ADDR            VERSION  STARTED               PARTITIONS  TASKS  FIRES/S  STATE\n" +
			"n1  127.0.0.1:8080  v1       2025-12-02T14:05:00Z  512         1000   12.3     ready\n" +
			"n2  127.0.0.2:8080  v1       2025-12-02T14:05:00Z  100/512     10     0.0      starting\n" +
			"n3  -               -        -                     0           -      -        no answer\n" +
			"n4  127.0.0.4:8080  v1       2025-12-02T14:05:00Z  0           -      -        leaving\n",
	}} {
		var b bytes.Buffer
		if err := tt.write(&b); err != nil {
			t.Fatal(err)
		}
		if b.String() != tt.want {
			t.Errorf("%s:\n%s\nwant:\n%s", tt.name, b.String(), tt.want)
		}
	}

	var b bytes.Buffer
	tsk := *tasks[0]
	tsk.Labels = map[string]string{"tier": "1", "team": "billing"}
	tsk.Executor.Headers = map[string]string{"X-Team": "billing"}
	tsk.Retry = task.Retry{MaxAttempts: 3, Backoff: task.Duration(time.Second), MaxBackoff: task.Duration(time.Minute)}
	tsk.Partition = &p
	if err := writeTaskDetail(&b, &tsk); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"ID:               billing/invoice-42\n",
		"Executor:         http POST http://127.0.0.5/hook\n",
		"  Headers:        X-Team=billing\n",
		"Retry:            3 attempts, backoff 1s, max backoff 1m0s\n",
		"Labels:           team=billing, tier=1\n",
		"Partition:        7\n",
		"Version:          1234\n",
		"Owner:            n1\n",
		"Next fire:        2025-12-02T14:05:00Z\n",
	} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("task detail lacks %q:\n%s", line, b.String())
		}
	}
}

// task get of a task whose owner did not answer names the owner and why,
// without counters that would read as zero; one without an owner says so.
func TestOutput_OwnerThatDidNotAnswer(t *testing.T) {
	tsk := &task.Task{ID: "t", Schedule: "* * * * * *", Executor: task.Executor{Type: task.ExecutorNoop},
		State: &task.State{Owner: "n2", OwnerError: "dial tcp 127.0.0.1:1: connection refused"}}
	var b bytes.Buffer
	if err := writeTaskDetail(&b, tsk); err != nil {
		t.Fatal(err)
	}
	if want := "Owner:            n2 (did not answer: dial tcp 127.0.0.1:1: connection refused; its state is not shown)\n"; !strings.Contains(b.String(), want) {
		t.Errorf("task detail lacks %q:\n%s", want, b.String())
	}
	if strings.Contains(b.String(), "Fires:") {
		t.Errorf("task detail shows counters its owner did not give:\n%s", b.String())
	}
	// The error as the peer client gives it, whose cause comes last: it
	// was cut to 72 characters, "dial tcp 127.0.0.1:…", the cause gone.
	tsk.State.OwnerError = `Get "http://127.0.0.1:39405/v1/tasks/billing%2Finvoice-42/state": dial tcp 127.0.0.1:39405: connect: connection refused`
	b.Reset()
	if err := writeTaskDetail(&b, tsk); err != nil {
		t.Fatal(err)
	}
	if want := "dial tcp 127.0.0.1:39405: connect: connection refused; its state is not shown)\n"; !strings.Contains(b.String(), want) {
		t.Errorf("task detail lacks %q:\n%s", want, b.String())
	}
	tsk.State = nil
	b.Reset()
	if err := writeTaskDetail(&b, tsk); err != nil {
		t.Fatal(err)
	}
	if want := "Owner:            - (no node owns its partition right now)\n"; !strings.Contains(b.String(), want) {
		t.Errorf("task detail lacks %q:\n%s", want, b.String())
	}
}

// A backfill's line in task get: one that its owner has not recorded
// progress of yet says so (it read "through -" and "recorded by -").
func TestOutput_Backfill(t *testing.T) {
	from, to := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 1, 1, 0, 9, 0, 0, time.UTC)
	b := &task.Backfill{From: from, To: to, Concurrency: 2, Fires: 10, State: task.BackfillRunning}
	if got, want := backfillText(b), "running: 0 of 10 fires done (2026-01-01T00:00:00Z to 2026-01-01T00:09:00Z, 2 at a time, no progress recorded yet)"; got != want {
		t.Errorf("before any progress:\n%s\nwant\n%s", got, want)
	}
	b.Done, b.Through, b.Node = 3, from.Add(2*time.Minute), "node-a"
	if got, want := backfillText(b), "running: 3 of 10 fires done, through 2026-01-01T00:02:00Z (2026-01-01T00:00:00Z to 2026-01-01T00:09:00Z, 2 at a time, progress recorded by node-a)"; got != want {
		t.Errorf("after some:\n%s\nwant\n%s", got, want)
	}
}

// task backfill --cancel asks the node to cancel the running backfill and
// says how far it got; with a range or a concurrency it is a usage error,
// before any request.
func TestTaskBackfill_Cancel(t *testing.T) {
	var asked []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.Method+" "+r.URL.EscapedPath())
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(r.URL.Path, "/one/") {
			io.WriteString(w, `{"from":"2026-01-01T00:00:00Z","to":"2026-01-01T00:00:00Z","concurrency":1,"fires":1,"done":0,"state":"canceled"}`)
			return
		}
		io.WriteString(w, `{"from":"2026-01-01T00:00:00Z","to":"2026-01-01T00:09:00Z","concurrency":2,"fires":10,"done":3,"state":"canceled"}`)
	}))
	defer ts.Close()
	r := cli("", "task", "backfill", "reports/daily", "--cancel", "--server", ts.URL)
	wantCLI(t, r, 0, []string{`backfill of task "reports/daily" canceled: 3 of its 10 fires done`}, nil)
	if want := []string{"POST /v1/tasks/reports%2Fdaily/backfill:cancel"}; !slices.Equal(asked, want) {
		t.Errorf("asked %v, want %v", asked, want)
	}
	r = cli("", "task", "backfill", "reports/daily", "--cancel", "--from", "2026-01-01T00:00:00Z", "--concurrency", "2", "--server", ts.URL)
	wantCLI(t, r, 2, nil, []string{"--cancel stops the running backfill: leave out --concurrency and --from"})
	if len(asked) != 1 {
		t.Errorf("a usage error sent a request: %v", asked)
	}
	wantCLI(t, cli("", "task", "backfill", "one", "--cancel", "--server", ts.URL), 0,
		[]string{`backfill of task "one" canceled: 0 of its 1 fire done`}, nil)
}

// task history warns on stderr of the nodes that did not answer, whose
// records are missing, and keeps them in its JSON: the answer without
// them read as complete, the owner's newest records silently left out.
func TestTaskHistory_WarnsOfPartialAnswer(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"executions":[{"task_id":"a","scheduled_at":"2026-01-01T00:00:00Z","attempt":1,"node":"n1","status":"ok"}],`+
			`"partial":["n2: connection refused"]}`)
	}))
	defer ts.Close()
	r := cli("", "task", "history", "a", "--server", ts.URL)
	wantCLI(t, r, 0, []string{"2026-01-01T00:00:00Z", "n1"},
		[]string{"warning: partial answer, the records of a node are missing: n2: connection refused"})
	r = cli("", "task", "history", "a", "--server", ts.URL, "--output", "json")
	wantCLI(t, r, 0, []string{`"partial": [`, `"n2: connection refused"`}, []string{"warning: partial answer"})
}

// emptyAnswers serves list, history and failures answers with no row,
// their "partial" member the JSON partial (empty: none).
func emptyAnswers(t *testing.T, partial string) *httptest.Server {
	if partial != "" {
		partial = `,"partial":` + partial
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/tasks":
			io.WriteString(w, `{"tasks":[],"next_cursor":""`+partial+`}`)
		case "/v1/tasks/a/history":
			io.WriteString(w, `{"executions":[]`+partial+`}`)
		case "/v1/failures":
			io.WriteString(w, `{"failures":[]`+partial+`}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(ts.Close)
	return ts
}

// An answer with no row says so on stdout, exit 0: task history of a
// task that has not run printed the table's header alone, as list and
// failures did, which read as an answer cut short. Their JSON is as
// before, an empty array.
func TestEmptyAnswers_SaySoOnALine(t *testing.T) {
	ts := emptyAnswers(t, "")
	for _, tc := range []struct {
		args     []string
		line     string
		jsonName string
	}{
		{[]string{"task", "history", "a"}, `no execution records of task "a" yet`, "executions"},
		{[]string{"task", "list"}, "no tasks yet", "tasks"},
		{[]string{"task", "list", "--prefix", "nothing/"}, "no tasks match", "tasks"},
		{[]string{"task", "list", "--status", "failing"}, "no tasks match", "tasks"},
		{[]string{"task", "failures"}, "no failed attempts since the nodes started", "failures"},
	} {
		args := append(tc.args, "--server", ts.URL)
		if r := cli("", args...); r.code != 0 || r.stdout != tc.line+"\n" || r.stderr != "" {
			t.Errorf("%v:\n%s\nwant exit 0 and %q on stdout alone", tc.args, r, tc.line)
		}
		r := cli("", append(args, "--output", "json")...)
		var doc map[string]json.RawMessage
		if err := json.Unmarshal([]byte(r.stdout), &doc); r.code != 0 || err != nil || string(doc[tc.jsonName]) != "[]" {
			t.Errorf("%v --output json: %v\n%s\nwant %q: []", tc.args, err, r, tc.jsonName)
		}
	}
}

// An empty answer that is partial says that it is empty on the nodes
// that answered: 'no tasks match' or 'no failed attempts since the nodes
// started' was false, as the node that did not answer may hold some.
func TestEmptyAnswers_PartialSaysWhereItLooked(t *testing.T) {
	ts := emptyAnswers(t, `["n2: connection refused"]`)
	for _, tc := range []struct {
		args []string
		line string
	}{
		{[]string{"task", "history", "a"}, `no execution records of task "a" on the nodes that answered`},
		{[]string{"task", "list"}, "no tasks on the nodes that answered"},
		{[]string{"task", "list", "--status", "failing"}, "no tasks match on the nodes that answered"},
		{[]string{"task", "failures"}, "no failed attempts on the nodes that answered, since they started"},
	} {
		r := cli("", append(tc.args, "--server", ts.URL)...)
		wantCLI(t, r, 0, nil, []string{"warning: partial answer", "n2: connection refused"})
		if r.stdout != tc.line+"\n" {
			t.Errorf("%v: stdout %q, want %q alone", tc.args, r.stdout, tc.line)
		}
	}
}

// A partial answer's entry that is no node's (partitions no node held,
// a member list not read) is warned of as it reads: each was said to be
// "the tasks of a node" missing, partitions 2-3,5 too.
func TestPartialAnswer_EntriesThatAreNoNodesAreNotCalledOne(t *testing.T) {
	const partitions = "partitions 2-3,5 were held by no node that answered, throughout its scan (moving, or their owner did not answer): their tasks may be missing"
	const members = "the member list could not be read: etcdserver: request timed out"
	ts := emptyAnswers(t, fmt.Sprintf(`[%q, %q, %q]`, "n2: connection refused", partitions, members))
	for _, tc := range []struct {
		args []string
		what string
	}{
		{[]string{"task", "list", "--status", "failing"}, "tasks"},
		{[]string{"task", "history", "a"}, "records"},
		{[]string{"task", "failures"}, "failures"},
	} {
		r := cli("", append(tc.args, "--server", ts.URL)...)
		want := "warning: partial answer, the " + tc.what + " of a node are missing: n2: connection refused\n" +
			"warning: partial answer: " + partitions + "\n" +
			"warning: partial answer: " + members + "\n"
		if r.code != 0 || r.stderr != want {
			t.Errorf("%v:\n%s\nwant exit 0 and stderr\n%s", tc.args, r, want)
		}
	}
}

func TestOutput_Truncate(t *testing.T) {
	if got := truncate("a\nb  c", 10); got != "a b c" {
		t.Errorf("truncate joins lines: %q", got)
	}
	if got := truncate("héllo wörld", 5); got != "héll…" {
		t.Errorf("truncate cuts runes: %q", got)
	}
	// An error, a note, a peer's answer may hold what a target or a
	// certificate wrote: no escape sequence reaches the terminal.
	var out strings.Builder
	err := writeHistoryTable(&out, []task.Execution{{Attempt: 1, Status: "failed",
		Error: "http: 500 \x1b]0;owned\x07\x1b[2J\u009b31m x509: certificate is valid for \x1b[1mevil"}})
	if err != nil {
		t.Fatal(err)
	}
	if i := strings.IndexFunc(out.String(), func(r rune) bool { return r != '\n' && unicode.IsControl(r) }); i >= 0 {
		t.Errorf("the history table holds the control character %U: %q", []rune(out.String()[i:])[0], out.String())
	}
	if got := truncate("a\x1b[2Jb\x00", 20); got != "a\uFFFD[2Jb\uFFFD" {
		t.Errorf("truncate keeps control characters: %q", got)
	}
}

// --- import -----------------------------------------------------------------------

func TestLineReader(t *testing.T) {
	long := `{"id":"` + strings.Repeat("x", task.MaxTaskSize) + `"}`
	exact := `{"id":"` + strings.Repeat("y", task.MaxTaskSize-9) + `"}` // 64 KiB exactly
	if len(exact) != task.MaxTaskSize {
		t.Fatalf("exact is %d bytes", len(exact))
	}
	input := strings.Join([]string{
		"\xef\xbb\xbf" + `{"id":"a"}`, // 1, after a byte order mark
		``,                            // 2 blank
		`# a comment`,                 // 3
		"  {\"id\":\"b\"}\r",          // 4 spaces and CRLF
		`[1]`,                         // 5 not an object
		`{"id":`,                      // 6 malformed
		long,                          // 7 too long
		exact + "\r",                  // 8 the limit, with CRLF
		exact + "z",                   // 9 one byte over (fits the buffer, then refused)
		`{"id":"c"}`,                  // 10, no newline at the end
	}, "\n")
	type item struct {
		line int
		data string
		err  string
	}
	want := []item{
		{1, `{"id":"a"}`, ""}, {2, "", ""}, {3, "", ""}, {4, `{"id":"b"}`, ""},
		{5, "", "must be a JSON object"}, {6, "", "malformed JSON"}, {7, "", "more than the limit of 65536"},
		{8, exact, ""}, {9, "", "65537 bytes of JSON, more than the limit"}, {10, `{"id":"c"}`, ""},
	}
	lr := newLineReader(strings.NewReader(input))
	var got []item
	for {
		data, line, lerr, err := lr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		it := item{line: line, data: string(data)}
		if lerr != nil {
			if lerr.Line != line {
				t.Errorf("line error numbered %d at line %d", lerr.Line, line)
			}
			it.err = lerr.Error
		}
		got = append(got, it)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d items, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.line != w.line || g.data != w.data || (w.err == "") != (g.err == "") || !strings.Contains(g.err, w.err) {
			t.Errorf("item %d: line %d data %.20q err %q; want line %d data %.20q err containing %q",
				i, g.line, g.data, g.err, w.line, w.data, w.err)
		}
	}
}

// A line that ends within a task, or holds a JSON array, says that import
// reads JSON Lines and how to make them: a task put over several lines
// (as --output json prints it) was 46 lines of "malformed JSON at byte
// N", none saying why.
func TestCheckJSONObject_SaysImportReadsJSONLines(t *testing.T) {
	const within = "the line ends within a task (import reads JSON Lines, one whole task a line: jq -c . FILE"
	const array = "not an array (jq -c '.[]' FILE writes its tasks one a line)"
	for _, tt := range []struct{ line, want, not string }{
		{`{`, "malformed JSON at byte 1: unexpected end of JSON input: " + within, ""},
		{`{"id": "a",`, within, ""},
		{`[{"id": "a"},`, within, ""},
		{`[{"id": "a"}, {"id": "b"}]`, "a task must be a JSON object, one per line, " + array, ""},
		{`[1]`, array, ""},
		{`"id": "a",`, "malformed JSON", "import reads JSON Lines"},
		{`{"id": "a"}}`, "malformed JSON at byte 12", "import reads JSON Lines"},
		{`5`, "a task must be a JSON object, one per line", "array"},
		{`{"id": "a"}`, "", ""},
	} {
		got := checkJSONObject([]byte(tt.line))
		if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) || tt.not != "" && strings.Contains(got, tt.not) {
			t.Errorf("%s: %q, want it to say %q (and not %q)", tt.line, got, tt.want, tt.not)
		}
	}
}

func TestImport_MapBatchErrors(t *testing.T) {
	lines := []int{3, 7, 9}
	got := mapBatchErrors(lines, []task.BatchError{
		{Index: 0, Error: "line 1: schedule: bad"}, // the server's own line numbering is dropped
		{Index: 1, Error: "line 1: id: keeps a prefix that is not its own"},
		{Index: 2, Error: "no prefix"},
		{Index: 5, Error: "out of range"},
	})
	want := []lineError{
		{Line: 3, Error: "schedule: bad"}, {Line: 7, Error: "line 1: id: keeps a prefix that is not its own"},
		{Line: 9, Error: "no prefix"}, {Line: 0, Error: "out of range"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

// fakeBatchServer answers POST /v1/tasks:batch like a node, refusing items
// whose id starts with "bad" and warning of those whose id starts with
// "warn". before, when set, may answer first.
func fakeBatchServer(t *testing.T, before func(w http.ResponseWriter, lines [][]byte) bool) (*httptest.Server, *fakeBatches) {
	fb := &fakeBatches{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		lines := bytes.Split(bytes.TrimSuffix(body, []byte("\n")), []byte("\n"))
		fb.mu.Lock()
		fb.requests++
		fb.mu.Unlock()
		if before != nil && before(w, lines) {
			return
		}
		res := client.BatchResult{Errors: []task.BatchError{}}
		for i, l := range lines {
			var tsk struct{ ID string }
			_ = json.Unmarshal(l, &tsk)
			if strings.HasPrefix(tsk.ID, "bad") {
				res.Errors = append(res.Errors, task.BatchError{Index: i, Error: fmt.Sprintf("line %d: schedule: refused", i+1)})
				continue
			}
			if strings.HasPrefix(tsk.ID, "warn") {
				res.Warnings = append(res.Warnings, client.BatchWarning{Index: i, Warning: "only some nodes can run it"})
			}
			res.Written++
			fb.mu.Lock()
			fb.ids = append(fb.ids, tsk.ID)
			fb.mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	}))
	t.Cleanup(ts.Close)
	return ts, fb
}

type fakeBatches struct {
	mu       sync.Mutex // guards requests and ids
	requests int
	ids      []string
}

// checkImport imports input through url in batches of 2 and checks the
// exit code, the summary on stdout and the lines on stderr.
func checkImport(t *testing.T, url, input string, wantCode int, wantSummary, wantStderr string) {
	t.Helper()
	im, out, errb := testImporter(t, url, 2)
	if code := im.run(context.Background(), strings.NewReader(input), "test"); code != wantCode {
		t.Errorf("exit %d, want %d", code, wantCode)
	}
	if got := out.String(); got != wantSummary {
		t.Errorf("summary %q, want %q", got, wantSummary)
	}
	if got := errb.String(); got != wantStderr {
		t.Errorf("stderr:\n%s\nwant:\n%s", got, wantStderr)
	}
}

func testImporter(t *testing.T, url string, batch int) (*importer, *bytes.Buffer, *bytes.Buffer) {
	cf := &clientFlags{server: url, output: outputTable, timeout: 10 * time.Second}
	var out, errb bytes.Buffer
	return &importer{cf: cf, client: client.NewClient(url, ""), batch: batch, maxBytes: maxImportBatchBytes,
		retries: 3, backoff: time.Millisecond, stdout: &out, stderr: &errb}, &out, &errb
}

// jsonl builds JSON Lines of tasks with these ids ("" for a blank line).
func jsonl(ids ...string) string {
	var b strings.Builder
	for _, id := range ids {
		if id != "" {
			fmt.Fprintf(&b, `{"id":%q,"schedule":"@hourly","executor":{"type":"noop"}}`, id)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Warnings are printed by input line among the errors, counted in the
// summary and listed in the JSON one, and fail nothing by themselves.
func TestImport_Warnings(t *testing.T) {
	ts, _ := fakeBatchServer(t, nil)
	checkImport(t, ts.URL, jsonl("a", "warn1", "", "warn2", "bad1"), exitError, "imported 3 tasks, 1 error, 2 warnings\n",
		"line 2: warning: only some nodes can run it\nline 4: warning: only some nodes can run it\nline 5: schedule: refused\n")

	im, out, _ := testImporter(t, ts.URL, 2)
	im.cf.output = outputJSON
	if code := im.run(context.Background(), strings.NewReader(jsonl("a", "warn1")), "test"); code != exitOK {
		t.Errorf("exit %d, want 0", code)
	}
	var sum struct {
		Warnings []map[string]any `json:"warnings"`
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil || len(sum.Warnings) != 1 ||
		sum.Warnings[0]["line"] != float64(2) || sum.Warnings[0]["warning"] != "only some nodes can run it" {
		t.Errorf("JSON summary %s (%v), want one warning {line 2, warning}", out, err)
	}
}

// The summary says how many of the tasks written were left alone,
// identical to what was stored.
func TestImport_CountsUnchanged(t *testing.T) {
	ts, _ := fakeBatchServer(t, func(w http.ResponseWriter, lines [][]byte) bool {
		_ = json.NewEncoder(w).Encode(client.BatchResult{Written: len(lines), Unchanged: len(lines) - 1, Errors: []task.BatchError{}})
		return true
	})
	checkImport(t, ts.URL, jsonl("a", "b", "c", "d"), exitOK, "imported 4 tasks (2 unchanged), 0 errors\n", "")
	im, out, _ := testImporter(t, ts.URL, 2)
	im.cf.output = outputJSON
	if code := im.run(context.Background(), strings.NewReader(jsonl("a", "b")), "test"); code != exitOK || !strings.Contains(out.String(), `"unchanged": 1`) {
		t.Errorf("exit %d, JSON summary %s; want 1 unchanged", code, out)
	}
}

// A batch split in two whose second half fails for good stops the import;
// what its first half wrote is reported, warnings included.
func TestImport_SplitBatchFailingReportsItsFirstHalf(t *testing.T) {
	ts, _ := fakeBatchServer(t, func(w http.ResponseWriter, lines [][]byte) bool {
		switch {
		case len(lines) > 1:
			http.Error(w, `{"error":"too large"}`, http.StatusRequestEntityTooLarge)
		case bytes.Contains(lines[0], []byte(`"fail"`)):
			http.Error(w, `{"error":"bad request handling"}`, http.StatusNotImplemented)
		default:
			return false
		}
		return true
	})
	im, out, errb := testImporter(t, ts.URL, 2)
	if code := im.run(context.Background(), strings.NewReader(jsonl("warn1", "fail")), "test"); code != exitError {
		t.Errorf("exit %d, want 1", code)
	}
	if !strings.HasPrefix(out.String(), "imported 1 task, 0 errors, 1 warning") {
		t.Errorf("summary %q", out)
	}
	if !strings.Contains(errb.String(), "line 1: warning: only some nodes can run it") {
		t.Errorf("the first half's warning is missing:\n%s", errb)
	}
}

func TestImport_LineNumbersAcrossBatches(t *testing.T) {
	ts, fb := fakeBatchServer(t, nil)
	input := jsonl("a", "", "bad1", "b") + "# comment\n" + "not json\n" + jsonl("c", "bad2", "d")
	// lines: 1 a, 2 blank, 3 bad1, 4 b, 5 comment, 6 not json, 7 c, 8 bad2, 9 d
	checkImport(t, ts.URL, input, exitError, "imported 4 tasks, 3 errors\n",
		"line 3: schedule: refused\nline 6: malformed JSON at byte 2: invalid character 'o' in literal null (expecting 'u')\nline 8: schedule: refused\n")
	if fb.requests != 3 || !reflect.DeepEqual(fb.ids, []string{"a", "b", "c", "d"}) {
		t.Errorf("requests %d ids %v", fb.requests, fb.ids)
	}
}

func TestImport_RetriesTransientFailures(t *testing.T) {
	var mu sync.Mutex
	fails := 2
	ts, fb := fakeBatchServer(t, func(w http.ResponseWriter, lines [][]byte) bool {
		mu.Lock()
		defer mu.Unlock()
		if fails > 0 {
			fails--
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":"the node is shutting down"}`)
			return true
		}
		return false
	})
	im, out, errb := testImporter(t, ts.URL, 10)
	if code := im.run(context.Background(), strings.NewReader(jsonl("a", "b")), "test"); code != exitOK {
		t.Fatalf("exit %d; stderr %s", code, errb)
	}
	if out.String() != "imported 2 tasks, 0 errors\n" || fb.requests != 3 {
		t.Fatalf("summary %q after %d requests", out, fb.requests)
	}

	// Past the retries, the import stops with the server's message.
	mu.Lock()
	fails = 100
	mu.Unlock()
	im, _, errb = testImporter(t, ts.URL, 1)
	if code := im.run(context.Background(), strings.NewReader(jsonl("a", "b")), "test"); code != exitError {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(errb.String(), "shardcron: import: the node is shutting down") {
		t.Errorf("stderr %q", errb)
	}
}

// Ctrl-C stops an import as a batch that fails for good does: it says
// after which line it stopped, prints what it wrote and exits 1. The
// process died of the signal with nothing printed (exit 130), the
// operator left to guess how far it got.
func TestImport_InterruptSaysWhereItStopped(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	ts, _ := fakeBatchServer(t, func(w http.ResponseWriter, lines [][]byte) bool {
		if bytes.Contains(lines[0], []byte(`"id":"b"`)) {
			close(arrived)
			<-release
		}
		return false
	})
	defer close(release) // before the server's Close, which waits for the handler
	in := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(in, []byte(jsonl("a", "b", "c")), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath, "import", "--server", ts.URL, "--batch", "1", "--in-flight", "1", in)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	interruptOnce(t, cmd, arrived, "the second batch never came")
	if want := "shardcron: import stopped after line 1: interrupted"; !strings.HasPrefix(errb.String(), want) {
		t.Errorf("stderr %q, want it to begin %q", errb.String(), want)
	}
	if out.String() != "imported 1 task, 0 errors\n" {
		t.Errorf("stdout %q, want the summary of the line written", out.String())
	}
}

// A signal stops an import that waits for its input, a pipe that has
// nothing more to give yet: the import read on, deaf to SIGINT and
// SIGTERM until the next batch's lines came or the pipe closed, and only
// a second signal, which kills it, ended it.
func TestImport_InterruptWhileWaitingForInput(t *testing.T) {
	ts, _, arrived := firstBatchSignal(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Close()
	cmd := exec.Command(binPath, "import", "--server", ts.URL, "--batch", "1", "--in-flight", "2", "-")
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pr, &out, &errb
	cmd.SysProcAttr = childproc.Attr()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close() // the child's now
	if _, err := io.WriteString(pw, jsonl("a")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the first batch never came")
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		pw.Close() // the input's end lets it finish
		<-exited
		t.Fatalf("the import went on waiting for its input after SIGINT; once the pipe closed:\nstdout %q\nstderr %q", out.String(), errb.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != exitError {
		t.Errorf("exit %d (%v), want %d", code, cmd.ProcessState, exitError)
	}
	// The signal may come before the answer of line 1 or after it.
	if !strings.HasPrefix(errb.String(), "shardcron: import") || !strings.Contains(errb.String(), ": interrupted") {
		t.Errorf("stderr %q, want where the import stopped: interrupted", errb.String())
	}
}

// A slow producer's lines are written as they come: a batch not yet full
// is sent once its first line has waited importFlush. Nothing was sent
// until --batch lines (1000) came or the input ended, so one line then a
// stall wrote nothing for as long as the pipe stayed open.
func TestImport_PartialBatchIsSentWhileTheInputStalls(t *testing.T) {
	ts, fb, arrived := firstBatchSignal(t)
	pr, pw := io.Pipe()
	exited := make(chan cliResult, 1)
	go func() {
		var out, errb bytes.Buffer
		code := runImport([]string{"--server", ts.URL, "-"}, pr, &out, &errb)
		exited <- cliResult{code, out.String(), errb.String()}
	}()
	if _, err := io.WriteString(pw, jsonl("a")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case r := <-exited:
		t.Fatalf("the import ended with its input open:\n%s", r)
	case <-time.After(30 * time.Second):
		pw.Close()
		t.Fatalf("the line was not sent while the input stalled; once it closed:\n%s", <-exited)
	}
	pw.Close()
	wantCLI(t, <-exited, 0, []string{"imported 1 task, 0 errors"}, nil)
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if !slices.Equal(fb.ids, []string{"a"}) {
		t.Errorf("written %q, want [a]", fb.ids)
	}
}

// firstBatchSignal is a fakeBatchServer that takes every batch, and a
// channel closed when the first comes.
func firstBatchSignal(t *testing.T) (*httptest.Server, *fakeBatches, <-chan struct{}) {
	arrived := make(chan struct{})
	var once sync.Once
	ts, fb := fakeBatchServer(t, func(http.ResponseWriter, [][]byte) bool {
		once.Do(func() { close(arrived) })
		return false
	})
	return ts, fb, arrived
}

// interruptOnce runs cmd, a client command, until ready (or fails the
// test with never), then sends it SIGINT, waits for it and checks that
// it exited 1, as a command stopped before its end does.
func interruptOnce(t *testing.T, cmd *exec.Cmd, ready <-chan struct{}, never string) {
	t.Helper()
	cmd.SysProcAttr = childproc.Attr()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal(never)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != exitError {
		t.Errorf("exit %d (%v), want %d", code, cmd.ProcessState, exitError)
	}
}

// TestImport_InFlightInLineOrder: with two batches in flight, the first
// answered last, the errors are still reported in line order; and when a
// batch fails for good, the import stops after the lines before it,
// though the batch in flight after it was written too.
func TestImport_InFlightInLineOrder(t *testing.T) {
	release := make(chan struct{}) // closed when the second batch arrived
	var once sync.Once
	ts, fb := fakeBatchServer(t, func(w http.ResponseWriter, lines [][]byte) bool {
		switch {
		case bytes.Contains(lines[0], []byte(`"a"`)): // the first batch waits for the second
			select {
			case <-release:
			case <-time.After(5 * time.Second):
				w.WriteHeader(http.StatusBadRequest)
				_, _ = io.WriteString(w, `{"error":"the batches were not in flight together"}`)
				return true
			}
		case bytes.Contains(lines[0], []byte(`"bad2"`)):
			once.Do(func() { close(release) })
		case bytes.Contains(lines[0], []byte(`"down"`)):
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":"the node is shutting down"}`)
			return true
		}
		return false
	})
	im, out, errb := testImporter(t, ts.URL, 2)
	im.inFlight = 2
	code := im.run(context.Background(), strings.NewReader(jsonl("a", "bad1", "bad2", "b", "c", "d")), "test")
	if code != exitError || out.String() != "imported 4 tasks, 2 errors\n" ||
		errb.String() != "line 2: schedule: refused\nline 3: schedule: refused\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errb)
	}

	im, out, errb = testImporter(t, ts.URL, 1)
	im.inFlight = 2
	code = im.run(context.Background(), strings.NewReader(jsonl("x", "down", "y")), "test")
	if code != exitError || !strings.Contains(errb.String(), "import stopped after line 1") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errb)
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if !slices.Contains(fb.ids, "x") || out.String() != fmt.Sprintf("imported %d tasks, 0 errors\n", 1+btoi(slices.Contains(fb.ids, "y"))) {
		t.Fatalf("ids %v, stdout %q", fb.ids, out)
	}
}

// An id given again in a later batch is written after the line that gave
// it before, though batches are in flight together (the import waits for
// the earlier), and the later line says it replaced the earlier, unless
// one of the two was refused. A repeat within a batch is left to the
// server.
func TestImport_IDGivenAgainInALaterBatch(t *testing.T) {
	line := func(id, version string) string {
		return fmt.Sprintf(`{"id":%q,"schedule":"@hourly","executor":{"type":"noop"},"description":%q}`+"\n", id, version)
	}
	var mu sync.Mutex
	var written []string         // the lines' id and version, in the order written
	later := make(chan struct{}) // closed once a batch after the first was written
	var once sync.Once
	ts, _ := fakeBatchServer(t, func(w http.ResponseWriter, lines [][]byte) bool {
		var tsk struct{ ID, Description string }
		_ = json.Unmarshal(lines[0], &tsk)
		switch tsk.Description {
		case "v1": // answered after a later batch was written, if one is sent
			select {
			case <-later:
			case <-time.After(500 * time.Millisecond):
			}
		case "refused":
			_ = json.NewEncoder(w).Encode(client.BatchResult{Errors: []task.BatchError{{Index: 0, Error: "schedule: refused"}}})
			return true
		}
		mu.Lock()
		written = append(written, tsk.ID+" "+tsk.Description)
		mu.Unlock()
		if tsk.Description != "v1" {
			once.Do(func() { close(later) })
		}
		return false
	})
	im, out, errb := testImporter(t, ts.URL, 1)
	im.inFlight = 4
	// lines: 1 a v1, 2 c refused, 3 blank, 4 a v2, 5 b refused, 6 c v2
	input := line("a", "v1") + line("c", "refused") + "\n" + line("a", "v2") + line("b", "refused") + line("c", "v2")
	if code := im.run(context.Background(), strings.NewReader(input), "test"); code != exitError {
		t.Errorf("exit %d, want 1", code)
	}
	if i, j := slices.Index(written, "a v1"), slices.Index(written, "a v2"); i < 0 || j < i {
		t.Errorf("written in the order %v, want a v1 before a v2", written)
	}
	if want := "line 2: schedule: refused\nline 4: warning: task \"a\" was given before, on line 1: this line replaces it\nline 5: schedule: refused\n"; errb.String() != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", errb, want)
	}
	if want := "imported 3 tasks, 2 errors, 1 warning\n"; out.String() != want {
		t.Errorf("summary %q, want %q", out, want)
	}

	im, out, errb = testImporter(t, ts.URL, 2)
	if code := im.run(context.Background(), strings.NewReader(line("d", "v2")+line("d", "v3")), "test"); code != exitOK {
		t.Errorf("exit %d, want 0", code)
	}
	if errb.String() != "" || out.String() != "imported 1 task, 0 errors\n" {
		t.Errorf("a repeat within a batch: stdout %q, stderr %q; want the server's word only, and one task", out, errb)
	}
}

// A task given on several lines of one batch is one task imported: the
// server writes its last line and counts each line it wrote, which the
// summary counted as that many tasks. So are an id's lines in the two
// halves of a batch split for its size, each written by a request of its
// own; a line refused is not counted.
func TestImport_IDRepeatedInABatchCountsOnce(t *testing.T) {
	line := func(id, version string) string {
		return fmt.Sprintf(`{"id":%q,"schedule":"@hourly","executor":{"type":"noop"},"description":%q}`+"\n", id, version)
	}
	for _, c := range []struct {
		name  string
		split bool
		input string
		want  string
	}{
		{"one request", false, line("a", "v1") + line("b", "v1") + line("a", "v2") + line("bad", "v1") + line("a", "v3"), "imported 2 tasks, 1 error\n"},
		{"split in two", true, line("a", "v1") + line("b", "v1") + line("a", "v2") + line("c", "v1"), "imported 3 tasks, 0 errors\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts, _ := fakeBatchServer(t, func(w http.ResponseWriter, lines [][]byte) bool {
				if c.split && len(lines) > 2 {
					w.WriteHeader(http.StatusRequestEntityTooLarge)
					_, _ = io.WriteString(w, `{"error":"batch body is too large"}`)
					return true
				}
				return false
			})
			im, out, _ := testImporter(t, ts.URL, 10)
			im.run(context.Background(), strings.NewReader(c.input), "test")
			if out.String() != c.want {
				t.Errorf("summary %q, want %q", out, c.want)
			}
		})
	}
}

// A line the client refuses (malformed, over 64 KiB) whose id it can read
// voids the earlier lines of that id in its batch, as the server does with
// a later item it refuses: none of them is written.
func TestImport_LaterLineRefusedHereVoidsTheEarlierInItsBatch(t *testing.T) {
	var mu sync.Mutex
	var sent []string
	ts, _ := fakeBatchServer(t, func(w http.ResponseWriter, lines [][]byte) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range lines {
			sent = append(sent, task.PeekID(l))
		}
		return false
	})
	im, out, errb := testImporter(t, ts.URL, 10)
	line := func(id string) string {
		return fmt.Sprintf(`{"id":%q,"schedule":"@hourly","executor":{"type":"noop"}}`+"\n", id)
	}
	huge := fmt.Sprintf(`{"id":"x","description":%q}`+"\n", strings.Repeat("d", task.MaxTaskSize))
	// y's refused line is not its last: the line after it replaces the one
	// before, as on the server.
	input := line("a") + line("x") + line("b") + `{"id":"a","schedule":` + "\n" + line("c") + huge +
		line("y") + `{"id":"y",` + "\n" + line("y")
	if code := im.run(context.Background(), strings.NewReader(input), "test"); code != exitError {
		t.Errorf("exit %d, want 1", code)
	}
	if !slices.Equal(sent, []string{"b", "c", "y", "y"}) {
		t.Errorf("sent %q, want b, c and y twice", sent)
	}
	for _, want := range []string{
		`line 1: not written: task "a" comes again on line 4, which was refused`,
		`line 2: not written: task "x" comes again on line 6, which was refused`,
		"line 4: malformed JSON", "line 6: task is about", "line 8: malformed JSON",
	} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb)
		}
	}
	if want := "imported 3 tasks, 5 errors\n"; out.String() != want { // y once
		t.Errorf("summary %q, want %q", out, want)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestImport_SplitsTooLargeBatches(t *testing.T) {
	ts, fb := fakeBatchServer(t, func(w http.ResponseWriter, lines [][]byte) bool {
		if len(lines) > 2 {
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			_, _ = io.WriteString(w, `{"error":"batch body is too large"}`)
			return true
		}
		return false
	})
	im, out, errb := testImporter(t, ts.URL, 7)
	code := im.run(context.Background(), strings.NewReader(jsonl("a", "b", "bad", "c", "d", "e", "f")), "test")
	if code != exitError || out.String() != "imported 6 tasks, 1 error\n" || errb.String() != "line 3: schedule: refused\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errb)
	}
	if !reflect.DeepEqual(fb.ids, []string{"a", "b", "c", "d", "e", "f"}) {
		t.Errorf("ids %v", fb.ids)
	}
}

func TestImport_BatchRefusedAsAWhole(t *testing.T) {
	ts, _ := fakeBatchServer(t, func(w http.ResponseWriter, lines [][]byte) bool {
		if bytes.Contains(lines[0], []byte(`"x1"`)) {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":"no"}`)
			return true
		}
		return false
	})
	im, out, errb := testImporter(t, ts.URL, 2)
	code := im.run(context.Background(), strings.NewReader(jsonl("x1", "x2", "y")), "test")
	if code != exitError || out.String() != "imported 1 task, 2 errors\n" || errb.String() != "line 1: no\nline 2: no\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errb)
	}
}

func TestImport_ProgressBarAndJSONSummary(t *testing.T) {
	ts, _ := fakeBatchServer(t, nil)
	im, out, errb := testImporter(t, ts.URL, 2)
	im.cf.output = outputJSON
	var bar bytes.Buffer
	im.bar = newImportBar(&bar, 5)
	code := im.run(context.Background(), strings.NewReader(jsonl("a", "bad", "b", "c", "d")), "test")
	if code != exitError {
		t.Errorf("exit %d", code)
	}
	var sum struct {
		Imported   int
		ErrorCount int `json:"error_count"`
		Errors     []lineError
		Completed  bool
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
		t.Fatalf("summary %q: %v", out, err)
	}
	if sum.Imported != 4 || sum.ErrorCount != 1 || !reflect.DeepEqual(sum.Errors, []lineError{{Line: 2, Error: "schedule: refused"}}) || !sum.Completed {
		t.Errorf("summary %+v", sum)
	}
	if errb.Len() != 0 {
		t.Errorf("JSON output printed line errors to stderr too: %q", errb)
	}
	if !strings.Contains(bar.String(), "importing") || !strings.Contains(bar.String(), "lines") {
		t.Errorf("bar output %q", bar.String())
	}

	// Unknown total (stdin): a spinner with a count.
	bar.Reset()
	im, _, _ = testImporter(t, ts.URL, 2)
	im.bar = newImportBar(&bar, -1)
	if code := im.run(context.Background(), strings.NewReader(jsonl("a", "b", "c")), "test"); code != exitOK {
		t.Errorf("exit %d", code)
	}
	if !strings.Contains(bar.String(), "importing") {
		t.Errorf("spinner output %q", bar.String())
	}
}

func TestCountLines(t *testing.T) {
	for in, want := range map[string]int64{"": 0, "a": 1, "a\n": 1, "a\nb": 2, "\n\n": 2} {
		if got, err := countLines(strings.NewReader(in)); err != nil || got != want {
			t.Errorf("countLines(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

// --- against a real node --------------------------------------------------------

// cliNode is a node served in-process: an engine on an embedded etcd and
// the api package's handler on an httptest server.
type cliNode struct {
	url  string
	e    *engine.Engine
	etcd *etcdtest.Cluster
}

// taskRevisions returns the mod revision of every task key in etcd.
func (n *cliNode) taskRevisions(t *testing.T) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := n.etcd.Client.Get(ctx, engine.DefaultPrefix+"/tasks/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int64, len(r.Kvs))
	for _, kv := range r.Kvs {
		out[string(kv.Key)] = kv.ModRevision
	}
	return out
}

// startCLINode starts a node and, with token set, a second API server on
// it that requires the token (tokenURL). Everything stops when the test
// ends, and no goroutine may outlive it.
func startCLINode(t *testing.T, token string) (n *cliNode, tokenURL string) {
	t.Helper()
	// Goroutines that ran before the node (other tests') are not its
	// leaks. Registered first, the check runs after every other cleanup.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		goleak.VerifyNone(t, before,
			// As in the engine's and api's tests: idle HTTP connections'
			// reader goroutines end asynchronously after Close.
			goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
	})
	c := etcdtest.Start(t)
	st, err := store.Open(store.DefaultConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(nil)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	cfg := engine.DefaultConfig("cli-node")
	cfg.APIAddr = ts.Listener.Addr().String()
	cfg.Version = "test"
	cfg.Partitions = 16
	cfg.LeaseTTL = 2 * time.Second
	cfg.Workers, cfg.Queue, cfg.BatchSize = 4, 1024, 256
	cfg.DrainTimeout = 5 * time.Second
	cfg.Logger = log
	e, err := engine.New(cfg, c.Client, st)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Config{Engine: e, Version: "test", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ts.Config.Handler = srv.Handler()
	ts.Start()
	var tts *httptest.Server
	var tsrv *api.Server
	if token != "" {
		if tsrv, err = api.New(api.Config{Engine: e, AuthToken: token, Version: "test", Logger: log}); err != nil {
			t.Fatal(err)
		}
		tts = httptest.NewServer(tsrv.Handler())
		tokenURL = tts.URL
	}
	t.Cleanup(func() {
		ts.Close()
		_ = srv.Close()
		if tts != nil {
			tts.Close()
			_ = tsrv.Close()
		}
		if err := e.Close(); err != nil {
			t.Errorf("close engine: %v", err)
		}
		if err := st.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	etcdtest.WaitFor(t, 30*time.Second, e.Ready)
	return &cliNode{url: ts.URL, e: e, etcd: c}, tokenURL
}

func TestCLI_AgainstNode(t *testing.T) {
	n, tokenURL := startCLINode(t, "s3cret")
	srv := []string{"--server", n.url}
	run := func(stdin string, args ...string) cliResult { return cli(stdin, append(args, srv...)...) }
	getTask := func(t *testing.T, id string) *task.Task {
		t.Helper()
		r := run("", "task", "get", id, "--output", "json")
		wantCLI(t, r, 0, nil, nil)
		var tsk task.Task
		if err := json.Unmarshal([]byte(r.stdout), &tsk); err != nil {
			t.Fatalf("get --output json: %v\n%s", err, r)
		}
		return &tsk
	}
	const id = "billing/invoice-42"
	// The task is live, so it calls a receiver on this machine, and the test
	// triggers it to see that it does.
	hooked := make(chan string, 16)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case hooked <- r.Header.Get("X-Team"):
		default:
		}
	}))
	t.Cleanup(sink.Close)
	hook := sink.URL + "/hook"

	t.Run("put from flags, get", func(t *testing.T) {
		r := run("", "task", "put", "--id", id, "--schedule", "0 */5 * * * *", "--timezone", "Europe/Berlin",
			"--url", hook, "--header", "X-Team=billing", "--max-attempts", "3", "--label", "team=billing")
		wantCLI(t, r, 0, []string{`put task "billing/invoice-42": version `}, nil)
		tsk := getTask(t, id)
		if tsk.ID != id || tsk.Timezone != "Europe/Berlin" || tsk.Retry.MaxAttempts != 3 || tsk.Version == 0 ||
			tsk.Executor.Headers["X-Team"] != "billing" || tsk.Labels["team"] != "billing" {
			t.Fatalf("stored task %+v", tsk)
		}
		r = run("", "task", "get", id)
		wantCLI(t, r, 0, []string{"ID:", id, "Executor:", "http POST " + hook, "Retry:", "3 attempts",
			fmt.Sprintf("Version:          %d", tsk.Version), "Owner:"}, nil)
		wantCLI(t, run("", "task", "trigger", id), 0, nil, nil)
		select {
		case team := <-hooked:
			if team != "billing" {
				t.Fatalf("the receiver got X-Team %q, want billing", team)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the triggered task never called its receiver")
		}
	})

	t.Run("put -f from a file and from stdin, with if-match", func(t *testing.T) {
		tsk := getTask(t, id)
		// What get printed goes back in, output-only fields and all.
		r := run("", "task", "get", id, "--output", "json")
		edited := strings.Replace(r.stdout, `"paused": false`, `"paused": true`, 1)
		r = run(edited, "task", "put", "-f", "-", "--if-match", fmt.Sprint(tsk.Version))
		wantCLI(t, r, 0, []string{"put task"}, nil)
		if got := getTask(t, id); !got.Paused || got.Version <= tsk.Version {
			t.Fatalf("after put -f -: paused %v version %d (was %d)", got.Paused, got.Version, tsk.Version)
		}
		// The old version again: refused with the server's explanation.
		r = run(edited, "task", "put", "-f", "-", "--if-match", fmt.Sprint(tsk.Version))
		wantCLI(t, r, 1, nil, []string{`shardcron: task "billing/invoice-42" has another version than If-Match says`})

		file := filepath.Join(t.TempDir(), "task.json")
		if err := os.WriteFile(file, []byte(`{"id":"from-file","schedule":"@hourly","executor":{"type":"noop"}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		wantCLI(t, run("", "task", "put", "-f", file, "--output", "json"), 0, []string{`"id": "from-file"`, `"version": `}, nil)
	})

	t.Run("chains, pause notes, trigger bodies and backfills", func(t *testing.T) {
		r := run("", "task", "put", "--id", "chain/a", "--schedule", "@hourly", "--noop", "--on-success", "chain/b")
		wantCLI(t, r, 1, nil, []string{`on_success[0]: task "chain/b" does not exist`, "--allow-missing"})
		r = run("", "task", "put", "--id", "chain/a", "--schedule", "@hourly", "--noop", "--on-success", "chain/b", "--allow-missing")
		wantCLI(t, r, 0, nil, nil)
		r = run(`{"id":"chain/b","schedule":"@hourly","executor":{"type":"noop"},"on_failure":["chain/a"]}`, "task", "put", "-f", "-")
		wantCLI(t, r, 1, nil, []string{`the chains would form a cycle: "chain/b" -> "chain/a" -> "chain/b"`})
		wantCLI(t, run("", "task", "get", "chain/a"), 0, []string{"On success:", "chain/b"}, nil)

		wantCLI(t, run("", "task", "pause", "chain/a", "--note", "waiting for INC-7"), 0, []string{"paused"}, nil)
		wantCLI(t, run("", "task", "get", "chain/a"), 0, []string{"Paused by:", "anonymous", "Note:", "waiting for INC-7"}, nil)

		bodies := make(chan string, 4)
		sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			bodies <- string(b)
		}))
		t.Cleanup(sink.Close)
		r = run("", "task", "put", "--id", "trigger/body", "--schedule", "0 0 1 1 *", "--url", sink.URL+"/hook", "--body", "own")
		wantCLI(t, r, 0, nil, nil)
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return getTask(t, "trigger/body").State != nil })
		wantCLI(t, run("", "task", "trigger", "trigger/body", "--body", "just this once"), 0, []string{"triggered"}, nil)
		select {
		case b := <-bodies:
			if b != "just this once" {
				t.Errorf("the receiver got body %q, want the override", b)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the triggered task never called its receiver")
		}
		wantCLI(t, run("", "task", "trigger", "trigger/body", "--payload", "1"), 1, nil,
			[]string{"payload: task \"trigger/body\" runs a http executor"})

		now := time.Now().UTC().Truncate(time.Minute)
		from, to := now.Add(-5*time.Minute).Format(time.RFC3339), now.Add(-time.Minute).Format(time.RFC3339)
		wantCLI(t, run("", "task", "put", "--id", "backfill/m", "--schedule", "0 * * * * *", "--noop"), 0, nil, nil)
		r = run("", "task", "backfill", "backfill/m", "--from", from, "--to", to, "--concurrency", "2")
		wantCLI(t, r, 0, []string{`backfill of task "backfill/m": 5 fires`, "2 at a time"}, nil)
		etcdtest.WaitFor(t, 20*time.Second, func() bool {
			s := getTask(t, "backfill/m").State
			return s != nil && s.Backfill != nil && s.Backfill.State == task.BackfillDone
		})
		wantCLI(t, run("", "task", "get", "backfill/m"), 0, []string{"Backfill:", "done: 5 of 5 fires done"}, nil)
		r = run("", "task", "backfill", "backfill/m", "--from", to, "--to", from)
		wantCLI(t, r, 1, nil, []string{"is not after from"})
		// One fire is "1 fire", not "1 fires".
		r = run("", "task", "backfill", "backfill/m", "--from", now.Add(-time.Minute-time.Second).Format(time.RFC3339), "--to", to)
		wantCLI(t, r, 0, []string{`backfill of task "backfill/m": 1 fire from`}, nil)
	})

	t.Run("put --dry-run, one-shots and windows", func(t *testing.T) {
		r := run("", "task", "put", "--id", "dry/once", "--schedule", "@at 2030-01-01T09:00:00", "--timezone", "Europe/Berlin",
			"--noop", "--delete-after-fire", "--dry-run")
		wantCLI(t, r, 0, []string{`dry run: task "dry/once" is valid; nothing was written`,
			"next 1 fire time (Europe/Berlin), its only one (@at):", "  2030-01-01T09:00:00+01:00"}, nil)
		r = run(`{"id":"dry/window","schedule":"@every 1h","not_before":"2030-01-01T00:00:00Z","executor":{"type":"noop"}}`,
			"task", "put", "-f", "-", "--dry-run", "--output", "json")
		wantCLI(t, r, 0, []string{`"dry_run": true`, `"2030-01-01T00:00:00Z"`, `"2030-01-01T04:00:00Z"`}, nil)
		// Refused as a put would be, and nothing written either way.
		r = run("", "task", "put", "--id", "dry/bad", "--schedule", "@hourly", "--noop", "--delete-after-fire", "--dry-run")
		wantCLI(t, r, 2, nil, []string{"--delete-after-fire (delete_after_fire): the task never ends"})
		for _, id := range []string{"dry/once", "dry/window", "dry/bad"} {
			wantCLI(t, run("", "task", "get", id), 1, nil, []string{"not found"})
		}
		// A task past its window: get says why it fires no more.
		r = run("", "task", "put", "--id", "ended/window", "--schedule", "* * * * * *", "--noop",
			"--not-before", "2020-01-01T00:00:00Z", "--not-after", "2020-01-02T00:00:00Z")
		wantCLI(t, r, 0, nil, nil)
		etcdtest.WaitFor(t, 20*time.Second, func() bool {
			return strings.Contains(run("", "task", "get", "ended/window").stdout, "Ended:")
		})
		wantCLI(t, run("", "task", "get", "ended/window"), 0, []string{"Not after:", "2020-01-02", "Ended:", "not_after (past its window"}, nil)
	})

	t.Run("the server's validation message", func(t *testing.T) {
		r := run(`{"id":"bad","schedule":"61 * * * * *","executor":{"type":"noop"}}`, "task", "put", "-f", "-")
		wantCLI(t, r, 1, nil, []string{`shardcron: task "bad": schedule: `, "61"})
		r = run(`{"id":"bad","schedule":"@hourly","executor":{"type":"noop"},"colour":1}`, "task", "put", "-f", "-")
		wantCLI(t, r, 1, nil, []string{`shardcron: task "bad": colour: unknown field`})
	})

	t.Run("list by status, with next fires", func(t *testing.T) {
		refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "receiver refuses", http.StatusInternalServerError)
		}))
		t.Cleanup(refuse.Close)
		r := run("", "task", "put", "--id", "health/bad", "--schedule", "* * * * * *", "--url", refuse.URL+"/hook")
		wantCLI(t, r, 0, nil, nil)
		r = run("", "task", "put", "--id", "health/ok", "--schedule", "* * * * * *", "--noop")
		wantCLI(t, r, 0, nil, nil)
		etcdtest.WaitFor(t, 20*time.Second, func() bool {
			r := run("", "task", "list", "--status", "failing", "--output", "json")
			return r.code == 0 && strings.Contains(r.stdout, `"id": "health/bad"`) && !strings.Contains(r.stdout, "health/ok")
		})
		r = run("", "task", "list", "--status", "failing")
		wantCLI(t, r, 0, []string{"FAILS", "LAST ERROR", "health/bad", "500"}, nil)
		if strings.Contains(r.stdout, "health/ok") {
			t.Errorf("a healthy task listed as failing:\n%s", r)
		}
		// NEXT FIRE comes from the owner's state: a time, not "-".
		r = run("", "task", "list", "--prefix", "health/")
		wantCLI(t, r, 0, []string{"NEXT FIRE"}, nil)
		for _, line := range strings.Split(r.stdout, "\n")[1:] {
			if line != "" && !strings.Contains(line, time.Now().UTC().Format("2006-01-02T")) {
				t.Errorf("a row without its next fire:\n%s", r)
			}
		}
		r = run("", "task", "list", "--status", "broken")
		wantCLI(t, r, 2, nil, []string{"--status", "failing, paused or stale"})
		r = run("", "task", "failures", "--limit", "3")
		wantCLI(t, r, 0, []string{"SCHEDULED", "TASK", "health/bad", "failed", "500"}, nil)
		if strings.Contains(r.stdout, "health/ok") || strings.Count(r.stdout, "\n") > 4 {
			t.Errorf("failures, limit 3:\n%s", r)
		}
		wantCLI(t, run("", "task", "failures", "--limit", "0"), 2, nil, []string{"--limit"})
		for _, id := range []string{"health/bad", "health/ok"} {
			wantCLI(t, run("", "task", "delete", id), 0, nil, nil)
		}
	})

	t.Run("list pages and filters", func(t *testing.T) {
		for i := 1; i <= 5; i++ {
			team := "a"
			if i%2 == 0 {
				team = "b"
			}
			r := run("", "task", "put", "--id", fmt.Sprintf("list/%d", i), "--schedule", "@hourly", "--noop", "--label", "team="+team)
			wantCLI(t, r, 0, nil, nil)
		}
		r := run("", "task", "list", "--prefix", "list/", "--limit", "2")
		wantCLI(t, r, 0, []string{"ID", "SCHEDULE", "NEXT FIRE", "list/"}, []string{"more tasks: list them all with --all"})
		if rows := strings.Count(r.stdout, "\n"); rows != 3 {
			t.Errorf("one page of 2 has %d lines:\n%s", rows, r)
		}
		r = run("", "task", "list", "--prefix", "list/", "--limit", "2", "--all", "--output", "json")
		wantCLI(t, r, 0, nil, nil)
		var res struct {
			Tasks      []*task.Task
			NextCursor *string `json:"next_cursor"` // present and empty after the last page
		}
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, tsk := range res.Tasks {
			ids = append(ids, tsk.ID)
		}
		if !reflect.DeepEqual(ids, []string{"list/1", "list/2", "list/3", "list/4", "list/5"}) || res.NextCursor == nil || *res.NextCursor != "" {
			t.Errorf("--all: ids %v, cursor %v", ids, res.NextCursor)
		}
		r = run("", "task", "list", "--prefix", "list/", "--label", "team=b")
		wantCLI(t, r, 0, []string{"list/2", "list/4"}, nil)

		if strings.Contains(r.stdout, "list/1") || r.stderr != "" {
			t.Errorf("label filter:\n%s", r)
		}
		// export writes what import reads back unchanged.
		r = run("", "task", "export", "--prefix", "list/")
		wantCLI(t, r, 0, []string{`{"id":"list/1",`, `{"id":"list/5",`}, []string{"exported 5 tasks"})
		if lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n"); len(lines) != 5 || !strings.HasPrefix(lines[1], `{"id":"list/2",`) {
			t.Errorf("export, in id order:\n%s", r)
		}
		exported := r.stdout
		r = run(exported, "import", "--quiet", "-")
		wantCLI(t, r, 0, []string{"imported 5 tasks (5 unchanged), 0 errors"}, nil)
		if r = run("", "task", "export", "--prefix", "list/"); r.stdout != exported {
			t.Errorf("export after importing the export:\n%s\nwant\n%s", r.stdout, exported)
		}
		r = run("", "task", "export", "--label", "team=b", "--prefix", "list/")
		wantCLI(t, r, 0, []string{`"list/2"`, `"list/4"`}, []string{"exported 2 tasks"})
		wantCLI(t, run("", "task", "export", "--prefix", "list/3"), 0, []string{`"list/3"`}, []string{"exported 1 task\n"})
		r = run("", "task", "list", "--prefix", "nothing/", "--output", "json")
		wantCLI(t, r, 0, []string{`"tasks": []`}, nil)
	})

	t.Run("pause, resume, trigger, history", func(t *testing.T) {
		wantCLI(t, run("", "task", "put", "--id", "t1", "--schedule", "0 0 1 1 *", "--noop"), 0, nil, nil)
		wantCLI(t, run("", "task", "pause", "t1"), 0, []string{`paused task "t1": version `}, nil)
		if !getTask(t, "t1").Paused {
			t.Fatal("not paused")
		}
		r := run("", "task", "resume", "t1", "--output", "json")
		wantCLI(t, r, 0, []string{`"paused": false`}, nil)
		r = run("", "task", "trigger", "t1", "--output", "json")
		var trig struct {
			ScheduledAt string `json:"scheduled_at"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &trig); err != nil || !strings.HasSuffix(trig.ScheduledAt, "Z") {
			t.Fatalf("trigger json: %v\n%s", err, r)
		}
		r = run("", "task", "trigger", "t1")
		wantCLI(t, r, 0, []string{`triggered task "t1": scheduled at 20`}, nil)
		var hist cliResult
		etcdtest.WaitFor(t, 20*time.Second, func() bool {
			hist = run("", "task", "history", "t1")
			return hist.code == 0 && strings.Contains(hist.stdout, " ok ")
		})
		wantCLI(t, hist, 0, []string{"SCHEDULED", "ATTEMPT", "STATUS", "NODE", "DURATION", "ERROR", "cli-node"}, nil)
		r = run("", "task", "history", "t1", "--output", "json", "--limit", "1")
		var h struct{ Executions []task.Execution }
		if err := json.Unmarshal([]byte(r.stdout), &h); err != nil || len(h.Executions) != 1 || h.Executions[0].Status != "ok" {
			t.Fatalf("history json: %v\n%s", err, r)
		}
	})

	t.Run("delete", func(t *testing.T) {
		v := getTask(t, "t1").Version
		wantCLI(t, run("", "task", "delete", "t1", "--if-match", fmt.Sprint(v+1)), 1, nil,
			[]string{`shardcron: task "t1"`, "another version than If-Match says", "\nnothing was deleted\n"})
		getTask(t, "t1") // still there
		wantCLI(t, run("", "task", "delete", "t1", "--if-match", fmt.Sprint(v)), 0, []string{`deleted task "t1"`}, nil)
		wantCLI(t, run("", "task", "put", "--id", "t1", "--schedule", "@hourly", "--noop"), 0, nil, nil)
		wantCLI(t, run("", "task", "delete", "t1"), 0, []string{`deleted task "t1"`}, nil)
		wantCLI(t, run("", "task", "get", "t1"), 1, nil, []string{"shardcron: task \"t1\" not found\n"})
		wantCLI(t, run("", "task", "delete", "t1"), 1, nil, []string{"not found"})
	})

	t.Run("bulk pause, resume, delete by selector", func(t *testing.T) {
		wantCLI(t, run(jsonl("bulk/1", "bulk/2", "bulk/3"), "import", "-", "--quiet"), 0, nil, nil)
		r := run("", "task", "pause", "--prefix", "bulk/", "--dry-run")
		wantCLI(t, r, 0, []string{"dry run: would have paused 3 of 3 matched tasks", "bulk/1"}, nil)
		if getTask(t, "bulk/1").Paused {
			t.Fatal("a dry run paused bulk/1")
		}
		wantCLI(t, run("", "task", "pause", "bulk/1", "--note", "first"), 0, []string{"paused"}, nil)
		r = run("", "task", "pause", "--prefix", "bulk/", "--note", "INC-8")
		wantCLI(t, r, 0, []string{"paused 2 of 3 matched tasks; 1 already were"}, nil)
		// Who paused each task, and why: the bulk pause's note on those it
		// paused, the first pause's on the one paused already.
		wantCLI(t, run("", "task", "get", "bulk/2"), 0, []string{"Paused by:", "anonymous", "Note:", "INC-8"}, nil)
		wantCLI(t, run("", "task", "get", "bulk/1"), 0, []string{"Note:", "first"}, nil)
		r = run("", "task", "resume", "--prefix", "bulk/", "--output", "json")
		wantCLI(t, r, 0, []string{`"action": "resume"`, `"changed": 3`}, nil)
		// A bulk delete without --yes only counts, and fails.
		r = run("", "task", "delete", "--prefix", "bulk/")
		wantCLI(t, r, 1, nil, []string{"would delete 3 tasks", "add --yes"})
		wantCLI(t, run("", "task", "delete", "--prefix", "bulk/3"), 1, nil, []string{"would delete 1 task (e.g. bulk/3)"})
		getTask(t, "bulk/3")
		wantCLI(t, run("", "task", "delete", "--prefix", "bulk/", "--yes"), 0, []string{"deleted 3 of 3 matched tasks"}, nil)
		wantCLI(t, run("", "task", "get", "bulk/3"), 1, nil, []string{"not found"})
		r = run("", "task", "delete", "--label", "team=nobody", "--yes")
		wantCLI(t, r, 0, []string{"deleted 0 of 0 matched tasks"}, nil)
		// Nothing to delete needs no --yes: it asked for one, and failed.
		r = run("", "task", "delete", "--label", "team=nobody")
		wantCLI(t, r, 0, []string{"deleted 0 of 0 matched tasks"}, nil)
	})

	t.Run("nodes", func(t *testing.T) {
		r := run("", "nodes")
		wantCLI(t, r, 0, []string{"ID", "ADDR", "FIRES/S", "cli-node", "test", "16", "ready"}, nil)
		r = run("", "nodes", "--output", "json")
		wantCLI(t, r, 0, []string{`"nodes": [`, `"id": "cli-node"`}, nil)
	})

	t.Run("import", func(t *testing.T) {
		dir := t.TempDir()
		file := filepath.Join(dir, "tasks.jsonl")
		content := "# tasks\n" +
			jsonl("imp/1", "imp/2") +
			`{"id":"imp/bad","schedule":"61 * * * * *","executor":{"type":"noop"}}` + "\n" +
			"\n" +
			`{"id":` + "\n" +
			jsonl("imp/3") +
			`{"id":"imp/huge","schedule":"@hourly","executor":{"type":"noop"},"labels":{"a":"` + strings.Repeat("x", 70000) + `"}}` + "\n" +
			`{"id":"imp/4","schedule":"@hourly","executor":{"type":"noop"},"timeout":"0s"}` + "\n"
		// lines: 1 comment, 2 imp/1, 3 imp/2, 4 bad schedule, 5 blank, 6 malformed, 7 imp/3, 8 too long, 9 bad timeout
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		var revs map[string]int64
		for i, summary := range []string{"imported 3 tasks, 4 errors", "imported 3 tasks (3 unchanged), 4 errors"} {
			// twice: the second import rewrites nothing and says so
			r := run("", "import", file, "--batch", "2")
			if i == 0 {
				revs = n.taskRevisions(t)
			} else if after := n.taskRevisions(t); !maps.Equal(after, revs) {
				t.Errorf("the second import wrote tasks: mod revisions %v, then %v", revs, after)
			}
			wantCLI(t, r, 1, []string{summary},
				[]string{"line 4: schedule: ", "line 6: malformed JSON", "line 8: task is", "line 9: timeout: "})
			if strings.Contains(r.stderr, "line 1:") || strings.Count(r.stderr, "\n") != 4 {
				t.Errorf("run %d: stderr:\n%s", i, r.stderr)
			}
		}
		for _, id := range []string{"imp/1", "imp/2", "imp/3"} {
			getTask(t, id)
		}
		r := run(jsonl("imp/5", "", "imp/6"), "import", "-", "--quiet")
		wantCLI(t, r, 0, []string{"imported 2 tasks, 0 errors"}, nil)
		getTask(t, "imp/6")
	})

	t.Run("auth token", func(t *testing.T) {
		r := cli("", "task", "get", id, "--server", tokenURL)
		wantCLI(t, r, 1, nil, []string{`shardcron: task "billing/invoice-42": this node requires an auth token`, "--token-file"})
		r = cli("", "task", "get", id, "--server", tokenURL, "--token", "wrong")
		wantCLI(t, r, 1, nil, []string{"not this node's auth token", "the node refused the token"})
		// From a file, its trailing newline dropped; one left in a token
		// given directly is a usage error naming it, not Go's refusal of
		// the header.
		file := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(file, []byte("s3cret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		wantCLI(t, cli("", "task", "get", id, "--server", tokenURL, "--token-file", file), 0, []string{id}, nil)
		wrong := filepath.Join(t.TempDir(), "wrong")
		if err := os.WriteFile(wrong, []byte("wrong\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		// It said the token came from --token or SHARDCRON_TOKEN.
		r = cli("", "task", "get", id, "--server", tokenURL, "--token-file", wrong)
		wantCLI(t, r, 1, nil, []string{"not this node's auth token", "the node refused the token read from --token-file " + wrong})
		r = cli("", "task", "get", id, "--server", tokenURL, "--token", "s3cret\n")
		wantCLI(t, r, 2, nil, []string{"the token given by --token holds the control character U+000A at byte 6", "--token-file drops it"})
		r = cli("", "task", "get", id, "--server", tokenURL, "--token", "s3cret", "--token-file", file)
		wantCLI(t, r, 2, nil, []string{"--token and --token-file are both set"})
		t.Setenv(envName("token"), "s3cret")
		wantCLI(t, cli("", "task", "get", id, "--server", tokenURL), 0, []string{id}, nil)
		t.Setenv(envName("server"), tokenURL)
		wantCLI(t, cli("", "nodes"), 0, []string{"cli-node"}, nil)
	})
}

// An export from an address that takes the connection and never answers
// gives up after --timeout, which bounds the wait for the export to
// begin; it hung until killed.
func TestTaskExport_SilentServerTimesOut(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers
	}))
	defer ts.Close()
	_, stderr, code := runCLI(t, "", "task", "export", "--server", ts.URL, "--timeout", "1s")
	if code != 1 || !strings.Contains(stderr, "no answer from "+ts.URL+" within 1s") {
		t.Errorf("exit %d, stderr %q; want 1 and no answer within 1s", code, stderr)
	}
}

// An export cut off says why first, then how many tasks stdout holds; one
// that never began says only why ("export stopped after 0 tasks" came
// first, as if an export had run).
func TestTaskExport_StoppedSaysWhyThenHowFar(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"id":"a","schedule":"@yearly","executor":{"type":"noop"}}`+"\n")
		io.WriteString(w, `{"id":"b","schedule":"@yearly","executor":{"type":"noop"}}`+"\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection cut mid-export
	}))
	defer ts.Close()
	r := cli("", "task", "export", "--server", ts.URL)
	wantCLI(t, r, exitError, []string{`"id":"b"`}, []string{"export stopped after 2 tasks"})
	if why := strings.Index(r.stderr, "shardcron"); why < 0 || why > strings.Index(r.stderr, "export stopped") {
		t.Errorf("the cause does not come first:\n%s", r)
	}
	r = cli("", "task", "export", "--server", deadServer(t))
	wantCLI(t, r, exitError, nil, []string{"connection refused"})
	if strings.Contains(r.stderr, "export stopped") {
		t.Errorf("an export that never began says it stopped:\n%s", r)
	}
}

// An export cut off within a line says that stdout ends with a partial
// line, part of a task, after the whole tasks it counts: it said "stdout
// holds them" of the whole ones only, and the file's broken last line
// came to light at the import.
func TestTaskExport_CutWithinALineSaysTheLastIsPartial(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"id":"a","schedule":"@yearly","executor":{"type":"noop"}}`+"\n")
		io.WriteString(w, `{"id":"b","schedule":"@yea`)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	defer ts.Close()
	r := cli("", "task", "export", "--server", ts.URL)
	wantCLI(t, r, exitError, []string{`"id":"b"`},
		[]string{"export stopped after 1 whole task: stdout holds it, then a partial last line", "the export is incomplete"})
}

// Ctrl-C stops an export as a cut connection does, and as it stops an
// import: it says so, how many whole tasks stdout holds and whether a
// partial line ends it, and exits 1. It said "GET <url>: reading the
// answer: interrupt signal received" and "stdout holds them", nothing of
// the partial line after them.
func TestTaskExport_InterruptSaysHowFar(t *testing.T) {
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		// More than export's buffer, so that some reaches stdout before
		// the signal, which the test waits for; then part of a task.
		for i := range 6000 {
			fmt.Fprintf(w, `{"id":"t%04d","schedule":"@yearly","executor":{"type":"noop"}}`+"\n", i)
		}
		io.WriteString(w, `{"id":"z","sched`)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer ts.Close()
	defer close(release) // before the server's Close, which waits for the handler
	cmd := exec.Command(binPath, "task", "export", "--server", ts.URL)
	out := &firstWrite{wrote: make(chan struct{})}
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = out, &errb
	interruptOnce(t, cmd, out.wrote, "the export never wrote")
	// How much was read before the signal is the machine's: the message
	// must tell what stdout holds.
	whole := strings.Count(out.String(), "\n")
	want := fmt.Sprintf("shardcron: export interrupted\nexport stopped after %d tasks: stdout holds them (the export is incomplete)\n", whole)
	if !strings.HasSuffix(out.String(), "\n") {
		want = fmt.Sprintf("shardcron: export interrupted\nexport stopped after %d whole tasks: stdout holds them, then a partial last line", whole)
	}
	if whole == 0 || !strings.HasPrefix(errb.String(), want) {
		t.Errorf("stderr %q after %d lines and %q, want it to begin %q",
			errb.String(), whole, out.String()[strings.LastIndexByte(out.String(), '\n')+1:], want)
	}
}

// firstWrite is a buffer that closes wrote at its first write: a child
// process's output has begun. The buffer is not embedded: its ReadFrom,
// which exec's copy would call, writes around Write.
type firstWrite struct {
	b     bytes.Buffer
	wrote chan struct{}
}

func (f *firstWrite) Write(p []byte) (int, error) {
	if f.b.Len() == 0 && len(p) > 0 {
		close(f.wrote)
	}
	return f.b.Write(p)
}

func (f *firstWrite) String() string { return f.b.String() }

// A flag value that does not parse says what the value must look like:
// the flag package says only "parse error", where the same value through
// the environment said "not a duration (e.g. 10s, 1m30s)".
func TestFlags_ValueThatDoesNotParseSaysWhatItMustBe(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"task", "put", "x", "--schedule", "@every 1s", "--noop", "--task-timeout", "5"},
			`invalid value "5" for flag --task-timeout: not a duration (e.g. 10s, 1m30s)`},
		{[]string{"task", "list", "--limit", "abc"}, `invalid value "abc" for flag --limit: not a whole number (e.g. 1024)`},
		// --if-match is an int64, which was left with "parse error".
		{[]string{"task", "delete", "x", "--if-match", "abc"}, `invalid value "abc" for flag --if-match: not a whole number (e.g. 1024)`},
		{[]string{"task", "put", "-f", "-", "--if-match", "W/1"}, `invalid value "W/1" for flag --if-match: not a whole number (e.g. 1024)`},
		{[]string{"server", "--lead", "abc"}, `invalid value "abc" for flag --lead: not a duration (e.g. 10s, 1m30s)`},
		{[]string{"server", "--allow-exec=maybe"}, `invalid boolean value "maybe" for --allow-exec: not a boolean`},
	} {
		var r cliResult
		if tc.args[0] == "server" {
			var errb bytes.Buffer
			r = cliResult{runServer(tc.args[1:], io.Discard, &errb), "", errb.String()}
		} else {
			r = cli("", tc.args...)
		}
		wantCLI(t, r, 2, nil, []string{tc.want})
		if strings.Contains(r.stderr, "parse error") {
			t.Errorf("%v: the flag package's own words are left:\n%s", tc.args, r)
		}
	}
}

// A K=V flag given a key twice is refused, naming both values: it kept
// the last one silently.
func TestKVFlag_KeyGivenTwice(t *testing.T) {
	var m kvFlag
	if err := m.Set("team=a"); err != nil {
		t.Fatal(err)
	}
	if err := m.Set("team=b"); err == nil || !strings.Contains(err.Error(), "team given twice (team=a and team=b)") {
		t.Errorf("second team: %v, want an error naming both values", err)
	}
	if m["team"] != "a" {
		t.Errorf("team = %q after the refusal, want a", m["team"])
	}
}

// TestBulk_CutByTimeoutSaysTasksMayHaveChanged: a bulk action that gets no
// answer within --timeout says that the node may have changed some of the
// tasks and that running it again finishes the job: the node stops the
// action when the request is cut, keeping what it wrote (a pause of 50 000
// tasks said only "no answer within 30s" with 33 280 of them paused). A
// dry run changes nothing and says nothing of the kind.
func TestBulk_CutByTimeoutSaysTasksMayHaveChanged(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // the server notices a closed connection once the body is read
		<-r.Context().Done()        // never answers
	}))
	defer ts.Close()
	r := cli("", "task", "pause", "--prefix", "fleet/", "--server", ts.URL, "--timeout", "200ms")
	wantCLI(t, r, exitError, nil, []string{"no answer from " + ts.URL + " within 200ms",
		"may have paused some of the tasks", "run the command again"})
	r = cli("", "task", "pause", "--prefix", "fleet/", "--dry-run", "--server", ts.URL, "--timeout", "200ms")
	wantCLI(t, r, exitError, nil, []string{"no answer from " + ts.URL + " within 200ms"})
	if strings.Contains(r.stderr, "may have") {
		t.Errorf("a dry run says tasks may have changed:\n%s", r)
	}
}

// TestTaskPut_FileWithByteOrderMark: a task file that an editor began with
// a UTF-8 byte order mark is put as import takes it, without the mark: it
// was refused with "invalid character 'ï' looking for beginning of value"
// while 'shardcron import' read the same line.
func TestTaskPut_FileWithByteOrderMark(t *testing.T) {
	var got []byte
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"bom","schedule":"@yearly","executor":{"type":"noop"},"version":7}`)
	}))
	defer ts.Close()
	file := filepath.Join(t.TempDir(), "bom.json")
	if err := os.WriteFile(file, []byte("\xef\xbb\xbf"+`{"id":"bom","schedule":"@yearly","executor":{"type":"noop"}}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := cli("", "task", "put", "-f", file, "--server", ts.URL)
	wantCLI(t, r, 0, []string{`put task "bom": version 7`}, nil)
	if !bytes.HasPrefix(got, []byte("{")) {
		t.Errorf("the node was sent %q, want the task without the byte order mark", got)
	}
}

// TestBulk_NotSentSaysNothingChanged: a bulk action whose request never
// reached a node (connection refused) does not say that the node may have
// changed some of the tasks: nothing was sent.
func TestBulk_NotSentSaysNothingChanged(t *testing.T) {
	ts := httptest.NewServer(http.NotFoundHandler())
	url := ts.URL
	ts.Close()
	r := cli("", "task", "pause", "--prefix", "fleet/", "--server", url, "--timeout", "2s")
	wantCLI(t, r, exitError, nil, []string{"cannot connect to " + url + ": connection refused"})
	if strings.Contains(r.stderr, "may have") {
		t.Errorf("a request that never reached a node says tasks may have changed:\n%s", r)
	}
}

// TestBulk_TLSRefusedSaysNothingChanged: a node whose certificate the
// command does not trust was sent nothing either.
func TestBulk_TLSRefusedSaysNothingChanged(t *testing.T) {
	ts := httptest.NewTLSServer(http.NotFoundHandler())
	defer ts.Close()
	r := cli("", "task", "pause", "--prefix", "fleet/", "--server", ts.URL, "--timeout", "2s")
	wantCLI(t, r, exitError, nil, []string{"certificate"})
	if strings.Contains(r.stderr, "may have") {
		t.Errorf("a request refused at the TLS handshake says tasks may have changed:\n%s", r)
	}
}

// TestNeverSent_ProxyRefused: a request whose proxy refused the connection
// reached no node: it was said to have maybe changed tasks (net/http
// reports it as "proxyconnect", not "dial"). The proxy is set on the
// transport: the environment's is never used for loopback.
func TestNeverSent_ProxyRefused(t *testing.T) {
	proxy := httptest.NewServer(http.NotFoundHandler())
	proxyURL, _ := url.Parse(proxy.URL)
	proxy.Close()
	node := httptest.NewServer(http.NotFoundHandler())
	defer node.Close()
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}
	resp, err := hc.Post(node.URL+"/v1/tasks:pause", "application/json", strings.NewReader("{}"))
	if err == nil {
		resp.Body.Close()
		t.Fatal("a request through a refused proxy got an answer")
	}
	if !neverSent(err) {
		t.Errorf("neverSent(%v) = false, want true: the proxy refused the connection", err)
	}
}
