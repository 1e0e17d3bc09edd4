package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// Exit codes of every command.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed: the server refused, the network failed
	exitUsage = 2 // the command line is wrong; nothing was sent
)

// Defaults of the client flags (docs/api.md "The binary"). Their
// variables are named as the server's are (envName), which resolve reads.
const (
	defaultServer  = "http://127.0.0.1:8080"
	defaultTimeout = 30 * time.Second
)

// Output formats of --output.
const (
	outputTable = "table"
	outputJSON  = "json"
)

// command is one (sub)command being run: its flag set, its help text and
// the writers it may print to. Every command has its own flag set, so that
// --help lists exactly the flags that command takes.
type command struct {
	name   string // as typed, for messages: "shardcron task put"
	help   string // usage line, description and examples, printed before the flags
	fs     *flag.FlagSet
	common map[string]bool // names of the shared client flags, listed last in --help
	stdout io.Writer
	stderr io.Writer
}

// newCommand returns a command whose flag set reports nothing itself: parse
// prints errors and help in one format for every command.
func newCommand(name, help string, stdout, stderr io.Writer) *command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &command{name: name, help: help, fs: fs, common: map[string]bool{}, stdout: stdout, stderr: stderr}
}

// given reports whether the command line set the flag name (to any value,
// its default or empty included).
func (c *command) given(name string) bool {
	set := false
	c.fs.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	return set
}

// parse parses args and returns the positional arguments. Flags may come
// before, between or after them (`task get ID --output json`), since users
// type them in any order; "--" ends the flags. When done is true the
// command is over with exit code code: --help was printed (0) or the
// command line was wrong (2, with the reason on stderr).
func (c *command) parse(args []string) (pos []string, code int, done bool) {
	for {
		if err := c.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.printHelp(c.stdout)
				return nil, exitOK, true
			}
			return nil, c.usageError("%v", explainFlag(c.fs, err)), true
		}
		rest := c.fs.Args()
		if len(rest) == 0 {
			return pos, 0, false
		}
		// Parse stops at the first non-flag argument, and consumes a "--"
		// before it. If it consumed one, everything after is positional.
		if c.endedFlags(args[:len(args)-len(rest)]) {
			return append(pos, rest...), 0, false
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// explainFlag replaces the "parse error" the flag package gives for a
// value it cannot parse ("invalid value \"abc\" for flag -lead: parse
// error") with what the value must look like, as the environment's errors
// say (valueWanted).
func explainFlag(fs *flag.FlagSet, err error) error {
	const parseError = "parse error"
	msg := err.Error()
	if dashed := twoDashes(msg); dashed != msg {
		msg, err = dashed, errors.New(dashed)
	}
	head, ok := strings.CutSuffix(msg, ": "+parseError)
	if !ok {
		return err
	}
	_, name, ok := strings.Cut(head, " for flag -")
	if !ok {
		_, name, ok = strings.Cut(head, " for -") // a boolean's
	}
	name = strings.TrimPrefix(name, "-")
	fl := fs.Lookup(name)
	if !ok || fl == nil {
		return err
	}
	if want := valueWanted(fl, err); want != msg {
		return errors.New(head + ": " + want)
	}
	return err
}

// twoDashes names the flag in one of the flag package's errors as --help
// and the docs do: "--frob", not "-frob" (which either form typed gives);
// a one-letter flag keeps its one dash (-f).
func twoDashes(msg string) string {
	for _, sep := range []string{"not defined: -", "needs an argument: -", " for flag -", " for -"} {
		i := strings.LastIndex(msg, sep)
		if i < 0 {
			continue
		}
		at := i + len(sep)
		name, _, _ := strings.Cut(msg[at:], ":")
		if len(name) > 1 {
			return msg[:at] + "-" + msg[at:]
		}
		return msg
	}
	return msg
}

// endedFlags reports whether the arguments Parse consumed end with a "--"
// that ended the flags, rather than with "--" as the value of a flag
// (--body --).
func (c *command) endedFlags(consumed []string) bool {
	n := len(consumed)
	if n == 0 || consumed[n-1] != "--" {
		return false
	}
	if n == 1 {
		return true
	}
	prev := consumed[n-2]
	if !strings.HasPrefix(prev, "-") || strings.Contains(prev, "=") || prev == "--" {
		return true
	}
	f := c.fs.Lookup(strings.TrimLeft(prev, "-"))
	if f == nil {
		return true
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return true
	}
	return false // "--" was that flag's value
}

// parseClient is parse for a command that takes the client flags cf: it
// also applies their environment defaults and checks them, so that a bad
// --server or --output is a usage error before anything is sent.
func (c *command) parseClient(args []string, cf *clientFlags) (pos []string, code int, done bool) {
	pos, code, done = c.parse(args)
	if done {
		return nil, code, true
	}
	if msg := cf.resolve(c); msg != "" {
		return nil, c.usageError("%s", msg), true
	}
	return pos, 0, false
}

// parseClientOnly is parseClient for a command that takes no argument: an
// argument is a usage error. done says the command ends with code.
func (c *command) parseClientOnly(args []string, cf *clientFlags) (code int, done bool) {
	pos, code, done := c.parseClient(args, cf)
	if done {
		return code, true
	}
	if len(pos) > 0 {
		return c.usageError("unexpected argument %q", pos[0]), true
	}
	return 0, false
}

// usageError prints a command-line error and how to get help, and returns
// the usage exit code.
func (c *command) usageError(format string, args ...any) int {
	fmt.Fprintf(c.stderr, "%s: %s\nRun '%s --help' for usage.\n", c.name, fmt.Sprintf(format, args...), c.name)
	return exitUsage
}

// tooManyArgs is usageError for a command that takes one positional
// argument and was given more. Each argument is quoted: joined, "a b" c
// read as three.
func (c *command) tooManyArgs(what string, pos []string) int {
	quoted := make([]string, len(pos))
	for i, p := range pos {
		quoted[i] = strconv.Quote(p)
	}
	return c.usageError("want one %s, got %d arguments: %s", what, len(pos), strings.Join(quoted, " "))
}

// printHelp prints the help text and the flags with their defaults, the
// command's own flags first and the shared client flags after them.
func (c *command) printHelp(w io.Writer) {
	fmt.Fprint(w, strings.TrimRight(c.help, "\n")+"\n")
	var own, common []*flag.Flag
	c.fs.VisitAll(func(f *flag.Flag) {
		if c.common[f.Name] {
			common = append(common, f)
		} else {
			own = append(own, f)
		}
	})
	if len(own) > 0 {
		fmt.Fprintln(w, "\nFlags:")
		printFlags(w, own)
	}
	if len(common) > 0 {
		fmt.Fprintln(w, "\nClient flags:")
		printFlags(w, common)
	}
}

// printFlags prints flags as flag.PrintDefaults does, but with the double
// dash that the documentation uses, and with aliases (same value) together.
func printFlags(w io.Writer, flags []*flag.Flag) {
	sort.SliceStable(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })
	for _, f := range flags {
		if strings.HasPrefix(f.Usage, "alias of ") {
			continue
		}
		name, usage := flag.UnquoteUsage(f)
		line := "  " + dashed(f.Name)
		for _, a := range flags {
			if a.Usage == "alias of --"+f.Name {
				line += ", " + dashed(a.Name)
			}
		}
		if name != "" {
			line += " " + name
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		if showDefault(f) {
			line += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintln(w, line)
	}
}

// dashed writes a flag's name as the documentation does: a one-letter
// flag with one dash (-f, -q), any other with two.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// showDefault reports whether a flag's default is worth printing: zero
// values and empty lists are not.
func showDefault(f *flag.Flag) bool {
	switch f.DefValue {
	case "", "0", "0s", "false", "[]", "map[]":
		return false
	}
	return true
}

// clientFlags are the flags every command that talks to a node takes.
type clientFlags struct {
	server    string
	token     string
	tokenFile string
	output    string
	timeout   time.Duration
	stderr    io.Writer // receives the node's warnings

	caCert, cert, key string      // files, for a node serving TLS
	tls               *tls.Config // built from them by resolve; nil: Go's defaults

	fromEnv envFlags // the flags resolve set from their variables
}

// register adds the client flags to c. Defaults from the environment are
// applied by resolve, after parsing, so that --help shows the built-in
// defaults and never prints a token.
func (f *clientFlags) register(c *command) {
	f.stderr = c.stderr
	c.fs.StringVar(&f.server, "server", defaultServer, "base `URL` of a node's HTTP API (env "+envName("server")+")")
	c.fs.StringVar(&f.token, "token", "", "bearer `TOKEN`, for a node started with --auth-token (env "+envName("token")+")")
	c.fs.StringVar(&f.tokenFile, "token-file", "", "read the token from `FILE` (trailing newline ignored; env "+envName("token-file")+"), keeping it out of the process list")
	c.fs.StringVar(&f.output, "output", outputTable, "output `FORMAT`: table or json")
	c.fs.DurationVar(&f.timeout, "timeout", defaultTimeout, "how long one request to the node may take")
	c.fs.StringVar(&f.caCert, "cacert", "", "CA certificate `FILE` that the node's TLS certificate is verified with (default: the system's roots; env "+envName("cacert")+")")
	c.fs.StringVar(&f.cert, "cert", "", "client certificate `FILE`, for a node started with --tls-client-ca (env "+envName("cert")+")")
	c.fs.StringVar(&f.key, "key", "", "private key `FILE` of --cert (env "+envName("key")+")")
	for _, n := range []string{"server", "token", "token-file", "output", "timeout", "cacert", "cert", "key"} {
		c.common[n] = true
	}
}

// resolve applies the environment to flags left unset and checks the
// values; a non-empty result is a usage error.
func (f *clientFlags) resolve(c *command) string {
	f.fromEnv = envFlags{}
	for _, e := range []struct {
		flag string
		v    *string
	}{
		{"server", &f.server}, {"token", &f.token}, {"token-file", &f.tokenFile},
		{"cacert", &f.caCert}, {"cert", &f.cert}, {"key", &f.key},
	} {
		if v := os.Getenv(envName(e.flag)); v != "" && !c.given(e.flag) {
			*e.v, f.fromEnv[e.flag] = v, true
		}
	}
	if msg := f.resolveToken(); msg != "" {
		return msg
	}
	if msg := f.loadTLS(); msg != "" {
		return msg
	}
	server, err := normalizeServer(f.server)
	if err != nil {
		return f.fromEnv.asGiven(err).Error()
	}
	f.server = server
	if msg := checkOutput(f.output); msg != "" {
		return msg
	}
	if f.timeout <= 0 {
		return fmt.Sprintf("--timeout: %s is not more than 0", f.timeout)
	}
	return ""
}

// resolveToken reads --token-file and checks the token: a line break or
// another control character cannot be sent in a header. Its refusals name
// --token and --token-file as the operator gave them (envFlags). A
// non-empty result is a usage error.
func (f *clientFlags) resolveToken() string {
	if f.tokenFile != "" {
		if f.token != "" {
			return fmt.Sprintf("%s and %s are both set: give one", f.fromEnv.givenAs("token"), f.fromEnv.givenAs("token-file"))
		}
		v, err := readSecretFile("token-file", f.tokenFile)
		if err != nil {
			return f.fromEnv.asGiven(err).Error()
		}
		f.token = v
		f.warnIfLoose("token-file", f.tokenFile)
	}
	if i := strings.IndexFunc(f.token, func(r rune) bool { return r != '\t' && unicode.IsControl(r) }); i >= 0 {
		msg := fmt.Sprintf("the token %s holds the control character %U at byte %d", f.tokenSource(), []rune(f.token[i:])[0], i)
		if f.tokenFile == "" && strings.ContainsAny(f.token, "\r\n") {
			// The remedy in the form the token was given in: a variable
			// for a variable.
			file := "--token-file"
			if f.fromEnv["token"] {
				file = envName("token-file")
			}
			msg += ": a trailing newline from a file? " + file + " drops it"
		}
		return msg
	}
	return ""
}

// tokenSource says where the token came from, as the operator gave it
// (envFlags): "given by --token", "read from SHARDCRON_TOKEN_FILE PATH".
func (f *clientFlags) tokenSource() string {
	if f.tokenFile != "" {
		return "read from " + f.fromEnv.givenAs("token-file") + " " + f.tokenFile
	}
	return "given by " + f.fromEnv.givenAs("token")
}

// warnIfLoose prints on stderr looseSecretFile's warning of the file
// path that flag (without its "--") names, when every user of the machine
// may read or write it: the flag as the operator gave it (envFlags).
func (f *clientFlags) warnIfLoose(flag, path string) {
	if w := looseSecretFile(f.fromEnv.givenAs(flag), path); w != "" && f.stderr != nil {
		fmt.Fprintf(f.stderr, "shardcron: warning: %s\n", w)
	}
}

// loadTLS builds f.tls from --cacert, --cert and --key; a non-empty result
// is a usage error, which names them as the operator gave them (envFlags).
func (f *clientFlags) loadTLS() string {
	if f.caCert == "" && f.cert == "" && f.key == "" {
		return ""
	}
	if (f.cert == "") != (f.key == "") {
		return f.fromEnv.givenAs("cert") + " and " + f.fromEnv.givenAs("key") + " go together"
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.caCert != "" {
		pool, err := readCAs(f.fromEnv.givenAs("cacert"), f.caCert)
		if err != nil {
			return err.Error()
		}
		c.RootCAs = pool
	}
	if f.cert != "" {
		pair, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return fmt.Sprintf("%s %s, %s %s: %v", f.fromEnv.givenAs("cert"), f.cert, f.fromEnv.givenAs("key"), f.key, err)
		}
		c.Certificates = []tls.Certificate{pair}
		f.warnIfLoose("key", f.key)
	}
	f.tls = c
	return ""
}

func checkOutput(o string) string {
	if o != outputTable && o != outputJSON {
		return fmt.Sprintf("--output: %q is not table or json", o)
	}
	return ""
}

// normalizeServer turns what a user typed for --server into a base URL:
// "127.0.0.1:8080" means http, and a trailing slash is dropped. A query,
// a fragment or a user and password are refused: request paths are
// appended to the base URL, which would put them after a query or a
// fragment, and a user and password would go as Basic authorization,
// which a node does not take (its token is --token's). Its errors refuse
// --server (refusal).
func normalizeServer(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", refuse("server", ": empty (want a URL such as %s)", defaultServer)
	}
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		if err == nil && u.User != nil {
			s = u.Redacted()
		}
		return "", refuse("server", ": %q is not an http or https URL such as %s", s, defaultServer)
	case u.User != nil:
		return "", refuse("server", ": %q holds a user name or password: give the node's URL alone, and its token with --token or --token-file", u.Redacted())
	case u.RawQuery != "" || u.ForceQuery:
		return "", refuse("server", ": %q has a query (?...): give the node's URL alone, such as %s", s, defaultServer)
	case u.Fragment != "" || strings.Contains(s, "#"):
		return "", refuse("server", ": %q has a fragment (#...): give the node's URL alone, such as %s", s, defaultServer)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", refuse("server", ": %q: port %s is not within 1-65535", s, p)
		}
	}
	return strings.TrimRight(s, "/"), nil
}

// client returns an API client for the flags.
// Warnings of the node go to stderr.
func (f *clientFlags) client() *client.Client {
	c := client.NewClient(f.server, f.token)
	if f.tls != nil {
		c.HTTP = &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: f.tls, ForceAttemptHTTP2: true}}
	}
	if f.stderr != nil {
		c.Warn = func(w string) { fmt.Fprintf(f.stderr, "shardcron: warning: %s\n", w) }
	}
	return c
}

// streamClient is client for an answer that may stream for longer than
// --timeout (an export): --timeout bounds each step to its beginning (the
// connection, TLS, the headers), so that an address that takes the
// connection and never answers does not hang the command, not how long
// it streams.
func (f *clientFlags) streamClient() *client.Client {
	c := f.client()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if f.tls != nil {
		tr.TLSClientConfig = f.tls
	}
	tr.DialContext = (&net.Dialer{Timeout: f.timeout, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout, tr.ResponseHeaderTimeout = f.timeout, f.timeout
	c.HTTP = &http.Client{Transport: tr}
	return c
}

// ctx returns the context of one request: it ends after --timeout.
func (f *clientFlags) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), f.timeout)
}

// fail prints a runtime error the way a user can act on it and returns the
// error exit code. subject names what the request was about ("task \"x\""),
// empty when nothing in particular.
func (f *clientFlags) fail(c *command, subject string, err error) int {
	fmt.Fprintln(c.stderr, describeError(f, subject, err))
	return exitError
}

// failWithHint is fail adding hint, on a line of its own, when err is an
// API error of status: what the server's message cannot say, such as
// what the command left undone.
func (f *clientFlags) failWithHint(c *command, subject string, err error, status int, hint string) int {
	msg := describeError(f, subject, err)
	var ae *client.Error
	if errors.As(err, &ae) && ae.Status == status {
		msg += "\n" + hint
	}
	fmt.Fprintln(c.stderr, msg)
	return exitError
}

// describeError is the message of fail: the server's own message for an
// API error, a hint for the common ways of not reaching a node.
func describeError(f *clientFlags, subject string, err error) string {
	prefix := "shardcron: "
	if subject != "" {
		prefix += subject + ": "
	}
	var ae *client.Error
	switch {
	case errors.As(err, &ae) && ae.Foreign:
		return fmt.Sprintf("%s%s answered HTTP %d, not as a shardcron node does (%s)\nis %s the address of a node's API (its --listen)?",
			prefix, f.server, ae.Status, ae.Message, f.fromEnv.givenAs("server"))
	case errors.As(err, &ae):
		msg := prefix + ae.Message
		if subject != "" && strings.HasPrefix(ae.Message, subject) {
			msg = "shardcron: " + ae.Message // `task "x" not found` says which task already
		}
		switch ae.Status {
		case http.StatusUnauthorized:
			switch {
			case strings.Contains(ae.Message, "--token"):
				// The node already says how to send one.
			case f.token == "":
				msg += "\nthe node requires a token: pass --token or --token-file, or set " + envName("token") + " or " + envName("token-file")
			default:
				msg += "\nthe node refused the token " + f.tokenSource()
			}
		}
		return msg
	case isConnRefused(err):
		return fmt.Sprintf("%scannot connect to %s: connection refused\nis a node running at %s? start one with: shardcron server",
			prefix, f.server, f.server)
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return fmt.Sprintf("%sno answer from %s within %s (raise --timeout if the node is busy)", prefix, f.server, f.timeout)
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return fmt.Sprintf("%scannot resolve the host of %s %s: %v", prefix, f.fromEnv.givenAs("server"), f.server, dnsErr)
	}
	return prefix + err.Error()
}

func isConnRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// kvFlag is a repeatable K=V flag (--header X-A=1 --env TZ=UTC); a key
// given twice is refused.
type kvFlag map[string]string

func (m *kvFlag) String() string {
	if m == nil || len(*m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(*m))
	for k := range *m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + (*m)[k]
	}
	return strings.Join(parts, ",")
}

func (m *kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	if *m == nil {
		*m = map[string]string{}
	}
	if prev, ok := (*m)[k]; ok {
		return fmt.Errorf("%s given twice (%s=%s and %s): which one was meant?", k, k, prev, s)
	}
	(*m)[k] = v
	return nil
}

// labelFlag is a repeatable --label K=V: a kvFlag whose keys are label
// keys, so that a key the node would refuse is a usage error before any
// request (an export printed "export stopped after 0 tasks" first).
type labelFlag map[string]string

func (m *labelFlag) String() string { return (*kvFlag)(m).String() }

func (m *labelFlag) Set(s string) error {
	if k, _, ok := strings.Cut(s, "="); ok && k != "" {
		if err := task.CheckLabelKey(k); err != nil {
			return flagReason(err)
		}
	}
	return (*kvFlag)(m).Set(s)
}

// prefixFlag is --prefix P, the start of a task id, and cursorFlag
// --cursor C, the last id of a page: a prefix no id can start with, or a
// cursor no id can be, is a usage error before any request, as a label key
// is (labelFlag); the node refused it, exit 1.
type (
	prefixFlag string
	cursorFlag string
)

func (p *prefixFlag) String() string     { return string(*p) }
func (p *prefixFlag) Set(s string) error { return setChecked((*string)(p), s, task.CheckPrefix) }
func (c *cursorFlag) String() string     { return string(*c) }
func (c *cursorFlag) Set(s string) error { return setChecked((*string)(c), s, registry.CheckCursor) }

// setChecked sets *v to s, once check takes it.
func setChecked(v *string, s string, check func(string) error) error {
	if err := check(s); err != nil {
		return flagReason(err)
	}
	*v = s
	return nil
}

// flagReason is a flag value's *task.ValidationError without its field:
// the flag package names the flag.
func flagReason(err error) error {
	var ve *task.ValidationError
	if errors.As(err, &ve) {
		return errors.New(ve.Reason)
	}
	return err
}

// listFlag is a repeatable flag whose values are kept in order
// (--command /bin/echo --command hello).
type listFlag []string

func (l *listFlag) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, " ")
}

func (l *listFlag) Set(s string) error {
	*l = append(*l, s)
	return nil
}
