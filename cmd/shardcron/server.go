package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/shardcron/shardcron/api"
	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/internal/tuning"
	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/store"
)

// serverFlags are the flags of 'shardcron server' (docs/api.md). Every
// flag can also come from the environment variable SHARDCRON_<FLAG> (upper
// case, '-' as '_'); the command line wins.
type serverFlags struct {
	etcd, etcdPrefix                       string
	etcdCACert, etcdCert, etcdKey          string
	etcdUser, etcdPassword                 string
	etcdListen, etcdPeerListen             string
	etcdQuota                              byteSize
	etcdQuotaSet                           bool // --etcd-quota given, which applies to the embedded etcd only
	dataDir, listen, advertise, nodeID     string
	partitions, replication                int
	load                                   float64
	workers, queue, batch, stage           int
	leaseTTL, tick, misfire, lead          time.Duration
	releaseRunWait                         time.Duration
	history                                string
	historyTTL                             time.Duration
	successLimit, failureLimit             int
	allowExec                              bool
	execAllow, httpAllow                   string
	notifyURL                              string
	tlsCert, tlsKey, tlsClientCA, tlsCA    string
	authToken, logFormat, logLevel         string
	authTokenFile, etcdPasswordFile        string
	readToken, readTokenFile, probeAuth    string
	probeListen                            string
	startTimeout, drainTimeout, shutdownTO time.Duration

	secretWarnings []string        // of loose secrets' files, logged once the logger is up
	fromEnv        envFlags        // the flags whose value came from their environment variable
	fromFile       map[string]bool // the secrets read from their --*-file flag (readSecrets)
}

const serverUsage = `Usage: shardcron server [flags]

Runs a node. Without --etcd it starts an embedded single-member etcd in
<data-dir>/etcd, so one command runs a whole cluster on one machine; to run
several nodes, point them all at one etcd with --etcd (see README.md).

SIGINT or SIGTERM stops the node gracefully: it stops accepting requests,
hands its partitions over with their checkpoints written, lets running
executions finish (up to --drain-timeout), lets the Badger cache run the
compactions it has due (up to 5s, so that the next start need not) and
exits 0. A second one cuts the waits short: running executions and API
requests are canceled, the partitions still handed over, the compactions
left to the next start. SIGHUP reloads the TLS files (--tls-cert,
--tls-key, --tls-client-ca); without TLS it is logged and ignored.

Every flag can also be set by the environment variable named after it:
SHARDCRON_ and the flag in upper case with '_' for '-' (--lease-ttl is
SHARDCRON_LEASE_TTL). A flag on the command line wins over its variable.
An empty variable of a boolean flag (SHARDCRON_ALLOW_EXEC=) is false.
Secrets (tokens, the etcd password) are best given as files
(--auth-token-file, --read-token-file, --etcd-password-file) or variables;
their values are never printed, in this help or in logs and errors.

Example:
  shardcron server --listen 127.0.0.1:8080 --data-dir ./node1
  SHARDCRON_AUTH_TOKEN_FILE=/run/secrets/token shardcron server --etcd https://etcd:2379

Flags:
`

// secretFlags hold secrets: their values (from the command line, a file
// or the environment) are never printed.
// A notify url is one: a webhook's url often carries its token.
var secretFlags = map[string]bool{"auth-token": true, "read-token": true, "etcd-password": true, "notify-url": true}

// envName is the environment variable of a server flag.
func envName(flag string) string {
	return "SHARDCRON_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Probe authorization modes (--probe-auth).
const (
	probeOpen  = "open"
	probeToken = "token"
)

// The bounds of --lead: twice the watermark's interval, or dispatch stalls
// between writes; a minute, past which a crash repeats more than anyone
// asking for a lead means.
var minLead, maxLead = 2 * engine.DefaultConfig("").WatermarkInterval, time.Minute

func (f *serverFlags) register(fs *flag.FlagSet) {
	d := engine.DefaultConfig("")
	fs.StringVar(&f.etcd, "etcd", "", "comma-separated etcd endpoints; empty: start an embedded etcd in <data-dir>/etcd")
	fs.StringVar(&f.etcdPrefix, "etcd-prefix", engine.DefaultPrefix, "key prefix, so that several clusters can share one etcd: starts with '/', such as /team-a/shardcron")
	fs.StringVar(&f.etcdCACert, "etcd-cacert", "", "CA certificate file to verify etcd's TLS certificate")
	fs.StringVar(&f.etcdCert, "etcd-cert", "", "client certificate file for etcd TLS")
	fs.StringVar(&f.etcdKey, "etcd-key", "", "client key file for etcd TLS")
	fs.StringVar(&f.etcdUser, "etcd-user", "", "etcd user name")
	fs.StringVar(&f.etcdPassword, "etcd-password", "", "etcd password (prefer --etcd-password-file: a command line is visible to every local user)")
	fs.StringVar(&f.etcdPasswordFile, "etcd-password-file", "", "read the etcd password from `FILE` (trailing newline ignored)")
	fs.StringVar(&f.etcdListen, "etcd-listen", "", "client address of the embedded etcd (default: 127.0.0.1 and the API port + 10000)")
	fs.StringVar(&f.etcdPeerListen, "etcd-peer-listen", "", "peer address of the embedded etcd (default: 127.0.0.1 and the API port + 20000)")
	f.etcdQuota = defaultEtcdQuota
	fs.Var(&f.etcdQuota, "etcd-quota", "space quota of the embedded etcd, a `SIZE` such as 8GiB or 512MiB: past it etcd refuses every write (its NOSPACE alarm); "+
		"it compacts hourly to the revision of an hour before, so a rewrite of every task (task pause --all) holds their old versions for one to two hours, about 0.5 GB at 1 M tasks")
	fs.StringVar(&f.dataDir, "data-dir", "./shardcron-data", "directory of the Badger cache and execution history (and the embedded etcd)")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address of the HTTP API, /metrics and the dashboard")
	fs.StringVar(&f.advertise, "advertise", "", "address other nodes reach this node's API at (default: the listen address: give it when that is every interface, 0.0.0.0:port or :port, which they cannot reach)")
	fs.StringVar(&f.nodeID, "node-id", "", "unique node id (default: hostname-port); a second live node with the same id is refused")
	fs.IntVar(&f.partitions, "partitions", d.Partitions, "partition count, fixed when the cluster is created (1-32768; each costs its owner a lock, a checkpoint and a watch, so start-ups and hand-overs grow with it: keep it within a few thousand; nodes past this count stand by)")
	fs.IntVar(&f.replication, "replication", d.ReplicationFactor, "ring virtual nodes per member (2-256), fixed when the cluster is created: every node must use the cluster's")
	fs.Float64Var(&f.load, "load", d.Load, "bounded-load factor, above 1: no node owns more than load × the average partitions; fixed when the cluster is created, as --replication")
	fs.IntVar(&f.workers, "workers", d.Workers, fmt.Sprintf("executions that run at once (1-%d)", engine.MaxWorkers))
	fs.IntVar(&f.queue, "queue", d.Queue, fmt.Sprintf("fires that may wait for a worker (1-%d; allocated at start, 72 bytes a fire)", engine.MaxQueue))
	fs.IntVar(&f.stage, "stage", d.Stage, fmt.Sprintf("most fires of one tick built before it is due and handed to the workers whole at it, even past --queue (1-%d): about 140 bytes a fire of the largest tick, made ready long before it and kept", engine.MaxStage))
	fs.IntVar(&f.batch, "batch", d.BatchSize, "fires the dispatch loop hands to the workers at once, at most --queue (not given, it is at most --queue too): smaller batches serve commands (hand-overs, task changes) sooner during a burst")
	fs.DurationVar(&f.leaseTTL, "lease-ttl", d.LeaseTTL, "session lease: the failover time after a crash (whole seconds, at least 2s)")
	fs.DurationVar(&f.tick, "tick", d.Tick, "timing wheel resolution (100µs-100ms): fires are late by less than one tick")
	fs.DurationVar(&f.misfire, "misfire-threshold", d.MisfireThreshold, "how late a fire may be before its misfire policy applies (at least --tick)")
	fs.DurationVar(&f.releaseRunWait, "release-run-wait", d.ReleaseRunWait,
		fmt.Sprintf("how long a graceful hand-over waits for the runs under way of tasks that retry or keep their fires apart, and of backfills (1ms-%v): "+
			"the partitions it hands over stand still that long at most; runs past it are marked in etcd for the next owner", engine.MaxReleaseRunWait))
	fs.DurationVar(&f.lead, "lead", d.Lead, "how far dispatch may run ahead of the watermark etcd last recorded (200ms-1m): a crash's successor repeats at most this much of the node's fires, and firing falls behind while etcd takes longer than this to record one")
	fs.StringVar(&f.history, "history", store.HistoryAll, "execution history kept: all, failures or none")
	fs.DurationVar(&f.historyTTL, "history-ttl", store.DefaultHistoryTTL, "how long execution records are kept at most (at least 1s)")
	fs.IntVar(&f.successLimit, "history-success-limit", store.DefaultSuccessLimit,
		fmt.Sprintf("successful executions kept per task, the most recent (0-%d; a task's history_limit.successes overrides it)", store.MaxHistoryLimit))
	fs.IntVar(&f.failureLimit, "history-failure-limit", store.DefaultFailureLimit,
		fmt.Sprintf("failed, timed-out, skipped, misfired and canceled executions kept per task, the most recent (0-%d; a task's history_limit.failures overrides it)", store.MaxHistoryLimit))
	fs.BoolVar(&f.allowExec, "allow-exec", false, "enable the exec executor on this node (tasks then run commands as this user)")
	fs.StringVar(&f.execAllow, "exec-allow", "", "comma-separated absolute path `PREFIXES`: exec commands must lie under one (a bare name is resolved in PATH at each fire); empty: any command")
	fs.StringVar(&f.httpAllow, "http-allow", "", "comma-separated `HOSTS`, *.domains, IPs or CIDRs the http executor may reach (a name not listed must resolve into a listed IP or CIDR); empty: any host")
	fs.StringVar(&f.notifyURL, "notify-url", "", "default `URL` of failure alerts: tasks without a notify block POST their failure and recovery alerts here, "+
		"and a notify block without a url uses it (--http-allow applies; see docs/api.md \"Alerts\"); empty: only tasks with their own notify url alert")
	fs.StringVar(&f.authToken, "auth-token", "", "when set, every /v1 request needs 'Authorization: Bearer <token>'; nodes of a cluster share it (prefer --auth-token-file)")
	fs.StringVar(&f.authTokenFile, "auth-token-file", "", "read the auth token from `FILE` (trailing newline ignored)")
	fs.StringVar(&f.readToken, "read-token", "", "a second token that may only read (GET and HEAD): for dashboards and scrapers; needs --auth-token")
	fs.StringVar(&f.readTokenFile, "read-token-file", "", "read the read-only token from `FILE` (trailing newline ignored)")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "serve the API over HTTPS with this certificate `FILE` (PEM, with its chain), reloaded at SIGHUP and when the files change; peers are then reached over https")
	fs.StringVar(&f.tlsKey, "tls-key", "", "private key `FILE` (PEM) of --tls-cert")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "mutual TLS: every client (CLI, dashboard, probes, other nodes) must present a certificate signed by a CA in this `FILE` (reloaded as --tls-cert is)")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "CA `FILE` that other nodes' API certificates are verified with (default: the system's roots)")
	fs.StringVar(&f.probeListen, "probe-listen", "", "also serve /healthz, /readyz and /metrics, and nothing else, over plain HTTP at this address: "+
		"for probes that cannot present the client certificate --tls-client-ca asks for (kubelet, container health checks); --probe-auth applies")
	fs.StringVar(&f.probeAuth, "probe-auth", probeOpen, "/healthz, /readyz and /metrics: open (no token, for load balancers and scrapers) or token (the auth or read token)")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&f.startTimeout, "start-timeout", time.Minute, "how long the start may wait for etcd in all before giving up: "+
		"the embedded etcd's start, etcd's first answer and the join (which waits out the lease of a crashed node of this id, up to its --lease-ttl: keep this above it) share it")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", d.DrainTimeout, "on shutdown, how long running executions may finish before they are canceled (0-24h; an attempt with attempts left is retried at once on its partition's next owner)")
	fs.DurationVar(&f.shutdownTO, "shutdown-timeout", 10*time.Second, "on shutdown, how long in-flight API requests may finish (0-24h)")
}

// runServer runs a node until a signal stops it and returns the exit
// code. --help goes to stdout, as every other command's, so that it pipes
// into grep or less; everything else, the log included, to stderr.
func runServer(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shardcron server", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // a bad flag is one line, not the help after it
	var f serverFlags
	f.register(fs)
	fs.VisitAll(func(fl *flag.Flag) {
		if secretFlags[fl.Name] {
			fl.Usage += " (env " + envName(fl.Name) + "; its value is never shown)"
		} else {
			fl.Usage += " (env " + envName(fl.Name) + ")"
		}
	})
	fs.Usage = func() {}
	var err error
	if err = fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, serverUsage)
			var flags []*flag.Flag
			fs.VisitAll(func(fl *flag.Flag) { flags = append(flags, fl) })
			printFlags(stdout, flags)
			return 0
		}
		fmt.Fprintf(stderr, "shardcron server: %v (see shardcron server --help)\n", explainFlag(fs, err))
		return 2
	}
	if f.fromEnv, err = applyEnv(fs, os.LookupEnv); err != nil {
		fmt.Fprintf(stderr, "shardcron server: %v\n", err)
		return 2
	}
	if err := f.readSecrets(); err != nil {
		fmt.Fprintf(stderr, "shardcron server: %v\n", f.fromEnv.asGiven(err))
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "shardcron server: unexpected argument %q (see shardcron server --help)\n", fs.Arg(0))
		return 2
	}
	batchSet := false
	fs.Visit(func(fl *flag.Flag) {
		f.etcdQuotaSet = f.etcdQuotaSet || fl.Name == "etcd-quota"
		batchSet = batchSet || fl.Name == "batch"
	})
	if !batchSet && f.queue >= 1 {
		f.batch = min(f.batch, f.queue) // the default follows a smaller --queue
	}
	if err := f.check(); err != nil {
		fmt.Fprintf(stderr, "shardcron server: %v\n", f.fromEnv.asGiven(err))
		return 2
	}
	log, err := newLogger(stderr, f.logFormat, f.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "shardcron server: %v\n", f.fromEnv.asGiven(err))
		return 2
	}
	for _, w := range f.secretWarnings {
		log.Warn(w)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGHUP reloads the TLS files; caught from here on, so that it never
	// ends the node as its default action would (a node without TLS only
	// logs it).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := serve(ctx, &f, hup, log); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			log.Info("shardcron server stopped during its start")
			return 0 // stopped as asked, as after the start
		}
		// Printed once, as a usage error is, not logged too: the last
		// line of the output is the error the node exited with.
		fmt.Fprintf(stderr, "shardcron server: %v\n", err)
		return 1
	}
	return 0
}

// applyEnv sets every flag left off the command line from its environment
// variable (envName), when that is set. An empty variable of a boolean
// flag is false, as systemd's EnvironmentFile writes an unset one
// (SHARDCRON_ALLOW_EXEC=); an empty one of any other flag is its value,
// checked as the flag's. The value of a secret is never quoted in an error.
// It returns the names of the flags it set, for errors that name a value:
// the operator looks for it where it came from.
func applyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) (envFlags, error) {
	set, fromEnv := map[string]bool{}, envFlags{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	var errs []error
	fs.VisitAll(func(fl *flag.Flag) {
		v, ok := lookup(envName(fl.Name))
		if !ok || set[fl.Name] {
			return
		}
		if b, isBool := fl.Value.(interface{ IsBoolFlag() bool }); isBool && b.IsBoolFlag() && v == "" {
			v = "false"
		}
		fromEnv[fl.Name] = true
		if err := fs.Set(fl.Name, v); err != nil {
			if secretFlags[fl.Name] {
				errs = append(errs, fmt.Errorf("%s: not a valid value for --%s", envName(fl.Name), fl.Name))
			} else {
				errs = append(errs, fmt.Errorf("%s=%q: %s", envName(fl.Name), v, valueWanted(fl, err)))
			}
		}
	})
	return fromEnv, errors.Join(errs...)
}

// refusal is a usage error that refuses the value of one flag: the flag's
// name, then after. It names the flag by its environment variable once
// asGiven found that the value came from there (env).
type refusal struct {
	flag  string // without its "--"
	after string // the message after the flag's name
	env   bool
}

func (r *refusal) Error() string {
	if r.env {
		return envName(r.flag) + r.after
	}
	return "--" + r.flag + r.after
}

// refuse is the refusal of flag, after formatted as fmt.Sprintf does.
func refuse(flag, format string, args ...any) error {
	return &refusal{flag: flag, after: fmt.Sprintf(format, args...)}
}

// envFlags are the flags whose value came from their environment variable
// (envName), not the command line: errors name those by it, where the
// operator looks for the value.
type envFlags map[string]bool

// asGiven names the flag that err, a usage error, refuses (its refusal) by
// its environment variable when the value came from there. A flag named
// further on is left as it is: it is a remedy, or named as given already
// (givenAs).
func (e envFlags) asGiven(err error) error {
	var r *refusal
	if errors.As(err, &r) && e[r.flag] {
		r.env = true
	}
	return err
}

// givenAs is how the operator gave flag: its environment variable when
// the value came from there, else the flag. A refusal that names two
// values names each so, once.
func (e envFlags) givenAs(flag string) string {
	if e[flag] {
		return envName(flag)
	}
	return "--" + flag
}

// valueWanted says what a flag's value must look like, for an error of
// fl.Value.Set, err: the flag package's own errors say only "parse error".
func valueWanted(fl *flag.Flag, err error) string {
	g, ok := fl.Value.(flag.Getter)
	if !ok {
		return err.Error() // our own flag types say it themselves
	}
	switch g.Get().(type) {
	case bool:
		return "not a boolean (true or false, 1 or 0; empty is false)"
	case time.Duration:
		return "not a duration (e.g. 10s, 1m30s)"
	case int, int64:
		return "not a whole number (e.g. 1024)"
	case float64:
		return "not a number (e.g. 1.25)"
	}
	return err.Error()
}

// readSecrets reads the secrets given as files, and notes those, and the
// etcd client's key, that every user may read. A secret given both
// directly and as a file is refused: which one wins would be a guess.
// (--tls-key is looked at by each of its loads, loadTLS.)
func (f *serverFlags) readSecrets() error {
	for _, s := range []struct {
		name, file string
		dst        *string
	}{
		{"auth-token", f.authTokenFile, &f.authToken},
		{"read-token", f.readTokenFile, &f.readToken},
		{"etcd-password", f.etcdPasswordFile, &f.etcdPassword},
	} {
		if s.file == "" {
			continue
		}
		if *s.dst != "" {
			return fmt.Errorf("%s and %s are both set: give one", f.fromEnv.givenAs(s.name), f.fromEnv.givenAs(s.name+"-file"))
		}
		v, err := readSecretFile(s.name+"-file", s.file)
		if err != nil {
			return err
		}
		*s.dst = v
		// An empty variable of the secret marked it as given there
		// (applyEnv): its value is the file's.
		delete(f.fromEnv, s.name)
		if f.fromFile == nil {
			f.fromFile = map[string]bool{}
		}
		f.fromFile[s.name] = true
		if w := looseSecretFile(f.fromEnv.givenAs(s.name+"-file"), s.file); w != "" {
			f.secretWarnings = append(f.secretWarnings, w)
		}
	}
	if w := looseSecretFile(f.fromEnv.givenAs("etcd-key"), f.etcdKey); w != "" {
		f.secretWarnings = append(f.secretWarnings, w)
	}
	return nil
}

// looseSecretFile warns of a secret's file, path, that every user of the
// machine may read or write (its mode lets others in), or is "": given is
// its flag as the operator gave it (givenAs). Such a file is read all the
// same: refused, it would stop a node at a restart after a chmod or a
// copy gone wrong. A group that may read it is the owner's choice
// (root:shardcron 0640).
func looseSecretFile(given, path string) string {
	st, err := os.Stat(path)
	if err != nil {
		return ""
	}
	mode := st.Mode().Perm()
	var can string
	switch mode & 0o006 {
	case 0:
		return ""
	case 0o004:
		can = "read"
	case 0o002:
		can = "written"
	default:
		can = "read and written"
	}
	return fmt.Sprintf("%s %s can be %s by every user of this machine (mode %#o): chmod 600 it (or 640 for a group)",
		given, path, can, mode)
}

// readSecretFile reads the one-line secret in path, its trailing newline
// ignored; its errors refuse flag (without its "--").
func readSecretFile(flag, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", refuse(flag, ": %v", err)
	}
	v := strings.TrimRight(string(b), "\r\n")
	switch {
	case v == "":
		return "", refuse(flag, ": %s is empty", path)
	case strings.ContainsAny(v, "\r\n"):
		return "", refuse(flag, ": %s holds more than one line", path)
	}
	return v, nil
}

// check refuses flag values that the engine would otherwise take as "use
// the default": an explicit --partitions 0 is a mistake, not a request.
func (f *serverFlags) check() error {
	if f.dataDir == "" {
		return refuse("data-dir", " is empty: give a directory, or leave it out for the default")
	}
	for _, a := range []struct{ flag, v string }{
		{"listen", f.listen}, {"probe-listen", f.probeListen},
		{"etcd-listen", f.etcdListen}, {"etcd-peer-listen", f.etcdPeerListen},
	} {
		if err := checkListenAddr(a.flag, a.v); err != nil {
			return err
		}
	}
	if !strings.HasPrefix(f.etcdPrefix, "/") {
		// The keys are <prefix>/tasks/... and so on: "shardcron" names
		// other keys than "/shardcron", a cluster of its own, empty.
		return refuse("etcd-prefix", ": %q must start with '/', such as /shardcron (the default) or /team-a/shardcron", f.etcdPrefix)
	}
	if f.nodeID != "" { // empty: hostname-port, made when the port is known
		if err := membership.ValidateNodeID(f.nodeID); err != nil {
			var ce *membership.ConfigError
			if errors.As(err, &ce) {
				err = errors.New(ce.Reason)
			}
			return refuse("node-id", ": %v (a node id has no '/', whitespace or control character, at most 256 bytes)", err)
		}
	}
	if err := checkAdvertise(f.advertise, f.tlsCert != ""); err != nil {
		return err
	}
	if f.etcd != "" {
		if err := checkEndpoints(f.etcd); err != nil {
			return err
		}
	}
	switch {
	case f.etcdQuotaSet && f.etcd != "":
		return refuse("etcd-quota", " sizes the embedded etcd, which %s replaces: set your etcd's --quota-backend-bytes instead", f.fromEnv.givenAs("etcd"))
	case f.etcdQuota < minEtcdQuota:
		return refuse("etcd-quota", " must be at least %s, got %s", minEtcdQuota, f.etcdQuota)
	}
	if errs := tuning.Check(tuning.Values{
		Partitions: f.partitions, Replication: f.replication, Workers: f.workers, Queue: f.queue,
		Load: f.load, Tick: f.tick, LeaseTTL: f.leaseTTL,
	}); len(errs) > 0 {
		return refuse(errs[0].Flag, " %s", errs[0].Msg)
	}
	switch {
	case f.stage < 1 || f.stage > engine.MaxStage:
		return refuse("stage", " must be between 1 and %d, got %d", engine.MaxStage, f.stage)
	case f.batch < 1 || f.batch > f.queue:
		return refuse("batch", " must be between 1 and %s (%d), got %d", f.fromEnv.givenAs("queue"), f.queue, f.batch)
	case f.misfire < f.tick:
		return refuse("misfire-threshold", " must be at least %s (%v), got %v", f.fromEnv.givenAs("tick"), f.tick, f.misfire)
	case f.lead < minLead || f.lead > maxLead:
		return refuse("lead", " must be within %v-%v, got %v", minLead, maxLead, f.lead)
	case f.releaseRunWait < time.Millisecond || f.releaseRunWait > engine.MaxReleaseRunWait:
		return refuse("release-run-wait", " must be within 1ms-%v, got %v", engine.MaxReleaseRunWait, f.releaseRunWait)
	case f.historyTTL < time.Second:
		// The store's bound: Badger expires entries at whole seconds.
		return refuse("history-ttl", " must be at least 1s (records expire at whole seconds), got %v", f.historyTTL)
	case f.startTimeout <= 0:
		return refuse("start-timeout", " must be positive, got %v", f.startTimeout)
	case f.drainTimeout < 0 || f.drainTimeout > engine.MaxDrainTimeout:
		return refuse("drain-timeout", " must be within 0-%v, got %v", engine.MaxDrainTimeout, f.drainTimeout)
	case f.shutdownTO < 0 || f.shutdownTO > engine.MaxDrainTimeout:
		// The API's half of a stop: a day is as much a typo here.
		return refuse("shutdown-timeout", " must be within 0-%v, got %v", engine.MaxDrainTimeout, f.shutdownTO)
	}
	for _, l := range []struct {
		flag string
		v    int
	}{{"history-success-limit", f.successLimit}, {"history-failure-limit", f.failureLimit}} {
		if l.v < 0 || l.v > store.MaxHistoryLimit {
			return refuse(l.flag, " must be between 0 and %d, got %d", store.MaxHistoryLimit, l.v)
		}
	}
	if err := f.checkTLSFlags(); err != nil {
		return err
	}
	if _, err := executor.ParsePathAllow(splitList(f.execAllow)); f.execAllow != "" && err != nil {
		return refuse("exec-allow", ": %v", err)
	}
	if _, err := executor.ParseHostAllow(splitList(f.httpAllow)); f.httpAllow != "" && err != nil {
		return refuse("http-allow", ": %v", err)
	}
	if f.notifyURL != "" && (executor.HTTPSpec{URL: f.notifyURL}).Check() != nil {
		// Not quoted: the url may hold a secret.
		return refuse("notify-url", ": want an absolute http or https URL such as https://alerts.example.com/shardcron")
	}
	switch f.history {
	case store.HistoryAll, store.HistoryFailures, store.HistoryNone:
	default:
		return refuse("history", ": %q is not all, failures or none", f.history)
	}
	switch {
	case f.probeAuth != probeOpen && f.probeAuth != probeToken:
		return refuse("probe-auth", ": %q is not open or token", f.probeAuth)
	case f.probeAuth == probeToken && f.authToken == "":
		return refuse("probe-auth", " token needs --auth-token (or --auth-token-file)")
	case f.readToken != "" && f.authToken == "":
		return refuse("read-token", " needs --auth-token: without it, writes need no token at all")
	case f.readToken != "" && f.readToken == f.authToken:
		return refuse(f.secretFlag("read-token"), " must differ from %s", f.fromEnv.givenAs(f.secretFlag("auth-token")))
	}
	return nil
}

// secretFlag is the flag that gave the secret name its value: name, or its
// -file flag when readSecrets read it from there.
func (f *serverFlags) secretFlag(name string) string {
	if f.fromFile[name] {
		return name + "-file"
	}
	return name
}

// checkListenAddr checks the value of flag, an address to listen on:
// host:port, the host possibly empty (every interface), the port from 0
// (the kernel picks one) to 65535 or a service name. --listen is the only
// one that may not be left empty.
func checkListenAddr(flag, v string) error {
	if v == "" && flag != "listen" {
		return nil
	}
	_, port, err := net.SplitHostPort(v)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return refuse(flag, ": %q is not an address to listen on: want host:port (a port from 0 to 65535), such as 127.0.0.1:8080", v)
	}
	return nil
}

// listenWarnings says what the API's listen address addr leaves open:
// every interface without --advertise advertises an address other nodes
// cannot reach (dialed, it is their own: their asks of this node are
// answered by themselves); an address beyond loopback without a token lets
// whoever reaches it change tasks. Neither is refused: a node alone on a
// machine, or behind a firewall, is fine.
func listenWarnings(addr string, f *serverFlags) []string {
	host, _, err := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	if err != nil || ip == nil {
		return nil
	}
	var ws []string
	if ip.IsUnspecified() && f.advertise == "" {
		ws = append(ws, fmt.Sprintf("the API listens on every interface (%s) and advertises that, which other nodes cannot reach (they would ask themselves): "+
			"give --advertise, the host:port they reach this node at (a node alone may ignore this)", addr))
	}
	if !ip.IsLoopback() && f.authToken == "" {
		ws = append(ws, fmt.Sprintf("the API listens on %s, beyond loopback, without --auth-token: whoever reaches it may create, change and delete tasks "+
			"(and have commands run, with --allow-exec): give --auth-token-file", addr))
	}
	return ws
}

// checkAdvertise checks --advertise, the address other nodes reach this
// node's API at: empty (the listen address), host:port or an http or https
// URL with a host and a port, the port from 1 to 65535 (port 0 is no
// address to reach), whose scheme is the one the node serves (https with
// tls, --tls-cert). Any other value would start a node no peer can reach.
func checkAdvertise(v string, tls bool) error {
	if v == "" {
		return nil
	}
	hostPort := v
	if scheme, _, ok := strings.Cut(v, "://"); ok {
		if scheme != "http" && scheme != "https" {
			return refuse("advertise", ": %q: want http or https, not %s", v, scheme)
		}
		if serves := map[bool]string{true: "https", false: "http"}[tls]; scheme != serves {
			return refuse("advertise", ": %q says %s, but this node serves %s (--tls-cert): peers could not reach it; leave the scheme out", v, scheme, serves)
		}
		u, err := url.Parse(v)
		if err != nil || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return refuse("advertise", ": %q is not an address other nodes can reach: want host:port or a URL such as https://node1.example.com:8080", v)
		}
		hostPort = u.Host
	}
	host, port, err := net.SplitHostPort(hostPort)
	if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
		return refuse("advertise", ": %q is not an address other nodes can reach: want host:port (a port from 1 to 65535) or a URL such as https://node1.example.com:8080", v)
	}
	return nil
}

// storeConfig is the store's configuration from the flags.
func (f *serverFlags) storeConfig(log *slog.Logger) store.Config {
	c := store.DefaultConfig(filepath.Join(f.dataDir, "cache"))
	c.History, c.HistoryTTL, c.Logger = f.history, f.historyTTL, log
	c.HistorySuccessLimit, c.HistoryFailureLimit = f.successLimit, f.failureLimit
	return c
}

// openStore opens the Badger cache. A corrupt one is set aside
// (store.SetAside) and a new, empty one opened: the node reloads every
// partition it owns from etcd and keeps firing; the execution history the
// corrupt directory held is lost, and the log says so and where it went.
func openStore(cfg store.Config, log *slog.Logger) (*store.Store, error) {
	st, err := store.Open(cfg)
	if !errors.Is(err, store.ErrCorrupt) {
		return st, err
	}
	aside, size, aerr := store.SetAside(cfg.Dir)
	if aerr != nil {
		return nil, fmt.Errorf("%w; setting it aside failed too: %v", err, aerr)
	}
	log.Error("the Badger cache is corrupt: it was set aside and an empty one started; "+
		"tasks are reloaded from etcd, the execution history it held is lost",
		"dir", cfg.Dir, "moved_to", aside, "lost_history_bytes", size, "err", err)
	return store.Open(cfg)
}

// missing returns, for each of paths that does not exist, the highest of
// its ancestors that does not exist either: the directories that creating
// the paths would make.
func missing(paths ...string) []string {
	var out []string
	for _, p := range paths {
		p, err := filepath.Abs(p)
		if err != nil {
			continue
		}
		top := ""
		for d := p; ; d = filepath.Dir(d) {
			if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
				break
			}
			top = d
		}
		if top != "" && !slices.Contains(out, top) {
			out = append(out, top)
		}
	}
	return out
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, refuse("log-level", ": %q is not debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		// A duration as the text format writes it, "11s": slog's JSON
		// writes nanoseconds, "wait":11000000000.
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			return a
		}
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, refuse("log-format", ": %q is not text or json", format)
}

// serve runs a node until ctx ends, then shuts it down in order. hup
// delivers the SIGHUPs, which reload the TLS files.
func serve(ctx context.Context, f *serverFlags, hup <-chan os.Signal, log *slog.Logger) error {
	// Deferred first, so logged last: a node is stopped once its cache
	// (Badger flushes its memtable as it closes, seconds under load) and
	// its embedded etcd are closed and the data directory is free for the
	// next start, not when its engine has stopped.
	// It also says what the process fired and misfired in all: /metrics
	// stops answering with the API, before the drain's last fires.
	clean := false
	var totals []any
	defer func() {
		if clean {
			log.Info("shardcron node stopped", append([]any{"node", f.nodeID}, totals...)...)
		}
	}()
	// Listen first: a busy port is the most common start-up error.
	ln, err := listen(f.fromEnv.givenAs("listen"), f.listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	addr := ln.Addr().String()
	var probeLn net.Listener
	if f.probeListen != "" {
		if probeLn, err = listen(f.fromEnv.givenAs("probe-listen"), f.probeListen); err != nil {
			return err
		}
		defer probeLn.Close()
	}
	if f.nodeID == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(addr)
		f.nodeID = host + "-" + port
	}
	advertise := f.advertise
	if advertise == "" {
		advertise = addr
	}
	scheme := "http://"
	var tlsf *tlsFiles
	if f.tlsCert != "" {
		if tlsf, err = loadTLS(f.tlsCert, f.tlsKey, f.tlsClientCA, f.fromEnv, log); err != nil {
			return err
		}
		scheme = "https://"
	}
	stopHUP := make(chan struct{})
	hupDone := watchSIGHUP(hup, tlsf, log, stopHUP)
	defer func() { close(stopHUP); <-hupDone }()
	if tlsf != nil && !strings.Contains(advertise, "://") {
		advertise = scheme + advertise // peers use https when this node serves it
	}
	peerTLSConfig, err := peerTLS(f.tlsCA, f.fromEnv.givenAs("tls-ca"), tlsf)
	if err != nil {
		return err
	}

	// The listeners answer from here on, the starting answers first
	// (api.Starting): the start may wait for etcd and, after a crash, for
	// the lease of the node's previous session, longer than a probe waits.
	apiCfg := api.Config{AuthToken: f.authToken, ReadToken: f.readToken,
		ProbeAuth: f.probeAuth == probeToken, Version: version, Logger: log, PeerTLS: peerTLSConfig}
	var phase atomic.Pointer[string]
	setPhase := func(p string) { phase.Store(&p) }
	setPhase("opening the data directory")
	startingAPI, startingProbes, err := api.Starting(apiCfg, func() string { return *phase.Load() })
	if err != nil {
		return err
	}
	var handler, probeHandler switchHandler
	handler.set(startingAPI)
	probeHandler.set(startingProbes)
	hs := newHTTPServer(&handler, log)
	defer hs.Close()              // a start that fails; a stop has shut it down
	served := make(chan error, 2) // the API's and the probes' servers
	if tlsf != nil {
		hs.TLSConfig = tlsf.serverConfig()
		go func() { served <- hs.ServeTLS(ln, "", "") }()
	} else {
		go func() { served <- hs.Serve(ln) }()
	}
	var probes *http.Server
	if probeLn != nil {
		probes = newHTTPServer(&probeHandler, log)
		defer probes.Close()
		go func() { served <- probes.Serve(probeLn) }()
	}
	starting := []any{"node", f.nodeID, "api", scheme + addr}
	if probeLn != nil {
		starting = append(starting, "probes", "http://"+probeLn.Addr().String())
	}
	log.Info("shardcron node starting: the API answers 503 until it has started", starting...)
	for _, w := range listenWarnings(addr, f) {
		log.Warn(w)
	}

	// A start that fails leaves the disk as it found it: what it created
	// goes again (a node that started once keeps its directories). Only a
	// start that took the store's lock does: one that lost the race for a
	// new directory to another start must not remove what the winner uses.
	fresh := missing(f.dataDir, filepath.Join(f.dataDir, "cache"), filepath.Join(f.dataDir, "etcd"))
	locked, started := false, false
	defer func() {
		if locked && !started {
			for _, d := range fresh {
				_ = os.RemoveAll(d)
			}
		}
	}()
	// store.Open makes <data-dir>/cache, and with it the data directory,
	// and says what to fix when it cannot.
	st, err := openStore(f.storeConfig(log), log)
	if err != nil {
		if errors.Is(err, store.ErrLocked) {
			return fmt.Errorf("data directory %s is in use by another process (is another shardcron server running with it?)", f.dataDir)
		}
		return err
	}
	locked = true
	// A stop closes the store itself, once the engine has stopped, while
	// a second signal can still cut short the compactions it lets run.
	closeStore := sync.OnceFunc(func() {
		if err := st.Close(); err != nil {
			log.Warn("closing the Badger cache failed", "dir", filepath.Join(f.dataDir, "cache"), "err", err)
		}
	})
	defer func() {
		// A start that failed or was stopped, or a server error: no
		// second signal could cut a settle short here, so none is run.
		st.Hurry()
		closeStore()
	}()

	// One deadline bounds the whole wait on etcd, set here: the embedded
	// etcd's start, the wait for etcd to answer and the join each have
	// what the phases before them left of --start-timeout. Each with a
	// timeout of its own, a start gave up after several times it.
	startCtx, endStart := context.WithTimeoutCause(ctx, f.startTimeout, fmt.Errorf("%s %v passed", f.fromEnv.givenAs("start-timeout"), f.startTimeout))
	defer endStart()
	endpoints := splitList(f.etcd)
	if len(endpoints) == 0 {
		setPhase("starting the embedded etcd")
		clientAddr := f.etcdListen
		if clientAddr == "" {
			clientAddr = derivedAddr(f.listen, 10000)
		}
		peerAddr := f.etcdPeerListen
		if peerAddr == "" {
			peerAddr = derivedAddr(f.listen, 20000)
		}
		ee, err := startEtcd(startCtx, filepath.Join(f.dataDir, "etcd"), log, clientAddr, peerAddr, int64(f.etcdQuota), f.startTimeout)
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("%w (the embedded etcd listens on %s for clients and %s for peers: choose free ports with %s and %s, which default to %s's port + 10000 and + 20000)",
				err, clientAddr, peerAddr, f.fromEnv.givenAs("etcd-listen"), f.fromEnv.givenAs("etcd-peer-listen"), f.fromEnv.givenAs("listen"))
		}
		if err != nil {
			return err
		}
		defer ee.Close()
		endpoints = []string{ee.Endpoint}
		log.Info("started the embedded etcd", "endpoint", ee.Endpoint, "dir", filepath.Join(f.dataDir, "etcd"))
	}

	etcdTLS, err := etcdTLSConfig(f)
	if err != nil {
		return err
	}
	requests := &engine.RequestCounter{}
	// The clients are made by the wait for etcd, each attempt making
	// those that are missing: with --etcd-user a client fetches its token
	// from etcd as it is made (newEtcdClient).
	var cli, indexCli *clientv3.Client
	defer func() {
		for _, c := range []*clientv3.Client{indexCli, cli} {
			if c != nil {
				c.Close()
			}
		}
	}()
	// The phase is open to anyone who reaches the probes: the endpoints
	// stay in the log (waitForEtcd names them).
	setPhase("waiting for etcd")
	explain := func(ctx context.Context, err error) error {
		return explainEtcd(ctx, endpoints, etcdTLS, f.etcdUser, f.fromEnv, err)
	}
	health := func(ctx context.Context) (err error) {
		if cli == nil {
			if cli, err = newEtcdClient(ctx, f, endpoints, etcdTLS, requests); err != nil {
				return err
			}
		}
		if indexCli == nil {
			if indexCli, err = newEtcdClient(ctx, f, endpoints, etcdTLS, requests, registry.IndexDialOptions()...); err != nil {
				return err
			}
		}
		// A key of the cluster's own, which nothing writes: a user whose
		// role grants only --etcd-prefix's keys may read it.
		_, err = cli.Get(ctx, strings.TrimRight(f.etcdPrefix, "/")+"/health", clientv3.WithCountOnly())
		return err
	}
	if err := waitForEtcd(startCtx, health, endpoints, explain, log); err != nil {
		return err
	}

	cfg := engine.DefaultConfig(f.nodeID)
	cfg.APIAddr, cfg.Version, cfg.Prefix = advertise, version, f.etcdPrefix
	cfg.Partitions, cfg.ReplicationFactor, cfg.Load = f.partitions, f.replication, f.load
	cfg.Workers, cfg.Queue, cfg.BatchSize, cfg.Stage = f.workers, f.queue, f.batch, f.stage
	cfg.LeaseTTL, cfg.Tick, cfg.MisfireThreshold, cfg.Lead = f.leaseTTL, f.tick, f.misfire, f.lead
	cfg.ReleaseRunWait = f.releaseRunWait
	cfg.DrainTimeout, cfg.AllowExec = f.drainTimeout, f.allowExec
	cfg.ExecAllow, cfg.HTTPAllow = splitList(f.execAllow), splitList(f.httpAllow)
	cfg.Requests, cfg.Logger = requests, log
	cfg.NotifyURL, cfg.IndexClient = f.notifyURL, indexCli
	eng, err := engine.New(cfg, cli, st)
	if err != nil {
		return err
	}
	setPhase(fmt.Sprintf("joining the cluster (after a crash, a node waits up to its lease TTL, %v, for the lease of its previous session to expire)", f.leaseTTL))
	err = eng.Start(startCtx)
	endStart()
	if err != nil {
		switch {
		case errors.Is(err, membership.ErrNodeExists):
			return fmt.Errorf("node id %q is held by a live node: give this node another %s", f.nodeID, f.fromEnv.givenAs("node-id"))
		case ctx.Err() != nil:
			return ctx.Err() // stopped during the start, as runServer logs it
		case errors.Is(startCtx.Err(), context.DeadlineExceeded) && errors.Is(err, membership.ErrHeldByLease):
			// Not refused as a usage error: a --start-timeout under
			// --lease-ttl fails only a start that follows a crash.
			lease := f.fromEnv.givenAs("lease-ttl")
			return fmt.Errorf("%w (%v before the lease of this node id's previous session expired: a crashed node's lease lasts up to its %s, %v here; "+
				"give %s more than %s, or start the node again once that lease has expired)",
				err, context.Cause(startCtx), lease, f.leaseTTL, f.fromEnv.givenAs("start-timeout"), lease)
		case errors.Is(startCtx.Err(), context.DeadlineExceeded):
			return fmt.Errorf("%w (%v)", err, context.Cause(startCtx))
		}
		return err
	}
	started = true
	defer eng.Close()
	// A cluster written before the index existed is indexed once, in the
	// background: until then lists and exports scan every task.
	ictx, stopIndex := context.WithCancel(ctx)
	indexDone := make(chan struct{})
	go func() {
		defer close(indexDone)
		buildIndex(ictx, eng.Registry(), log)
	}()
	defer func() { stopIndex(); <-indexDone }()

	apiCfg.Engine = eng
	srv, err := api.New(apiCfg)
	if err != nil {
		return err
	}
	defer srv.Close()
	handler.set(srv.Handler())
	probeHandler.set(srv.ProbeHandler())
	attrs := []any{"node", f.nodeID, "api", scheme + addr, "etcd", strings.Join(endpoints, ","),
		"partitions", f.partitions, "data_dir", f.dataDir, "version", version}
	if probeLn != nil {
		attrs = append(attrs, "probes", "http://"+probeLn.Addr().String())
	}
	log.Info("shardcron node started", attrs...)

	select {
	case <-ctx.Done():
		// The drain may take --drain-timeout with nothing more logged:
		// the line says how long, and how to cut it short.
		log.Info("shutting down: stopping the API, releasing partitions, draining executions, settling the cache; a second signal cuts the waits short",
			"cause", context.Cause(ctx), "drain_timeout", f.drainTimeout.String())
	case err := <-served:
		// Both servers close before the engine stops (deferred), so that
		// nothing answers for a node that is going.
		hs.Close()
		if probes != nil {
			probes.Close()
		}
		return fmt.Errorf("http server: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), f.shutdownTO)
	defer cancel()
	// A second SIGINT or SIGTERM cuts the stop short: the API requests and
	// the executions still running are canceled (as at --shutdown-timeout
	// and --drain-timeout) rather than waited for; the partitions are still
	// released with their checkpoints written.
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	stopped, hurried := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(hurried)
		select {
		case sig := <-again:
			log.Warn("a second signal: not waiting any longer; canceling the API requests and executions still running, and the cache's compactions", "signal", sig.String())
			cancel()
			eng.Hurry()
			st.Hurry()
		case <-stopped:
		}
	}()
	defer func() { close(stopped); <-hurried }()
	if err := hs.Shutdown(sctx); err != nil {
		log.Warn("API requests still running at shutdown were cut", "err", err)
	}
	if err := eng.Close(); err != nil {
		log.Warn("closing the engine", "err", err)
	}
	stats := eng.Stats()
	totals = []any{"fires", stats.Fires, "misfires", stats.Misfires}
	// The probes answer until the drain is over: a liveness probe sees the
	// node alive, and /readyz not ready, while it hands over.
	if probes != nil {
		_ = probes.Shutdown(sctx)
	}
	closeStore()
	clean = true
	return nil
}

// listen listens on addr, the value of a flag that given names as the
// operator gave it (givenAs: the flag, or its variable), with an error
// that names it so, and the remedy when the port is taken.
func listen(given, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("%s %s: %w (another program listens there, another shardcron server perhaps: stop it, or choose a free port with %s)",
			given, addr, err, given)
	case err != nil:
		return nil, fmt.Errorf("%s %s: %w", given, addr, err)
	}
	return ln, nil
}

// switchHandler serves with the handler set last: the starting answers
// until the node has started, then the API's.
type switchHandler struct{ h atomic.Pointer[http.Handler] }

func (s *switchHandler) set(h http.Handler) { s.h.Store(&h) }

func (s *switchHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.h.Load()).ServeHTTP(w, r)
}

// buildIndex runs Registry.BuildIndex when the index marker is missing,
// logging what it did. Several nodes may run it at once: it is idempotent.
func buildIndex(ctx context.Context, reg *registry.Registry, log *slog.Logger) {
	if built, err := reg.IndexBuilt(ctx); err != nil || built {
		return
	}
	start := time.Now()
	log.Info("indexing the tasks of a cluster written before the index; lists scan every task until it is done")
	n, err := reg.BuildIndex(ctx)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("building the task index failed; it is retried at the next start", "indexed", n, "err", err)
		}
		return
	}
	log.Info("task index built", "tasks", n, "took", time.Since(start).Round(time.Millisecond))
}

// checkEndpoints checks --etcd's value: one or more endpoints, each
// host:port, an http or https URL, or a unix or unixs socket
// (unix:path, unix://path). A value that names none
// (",") must not fall back to an embedded etcd, a cluster of its own.
func checkEndpoints(v string) error {
	eps := splitList(v)
	if len(eps) == 0 {
		return refuse("etcd", " %q names no endpoint: give host:port or URLs, comma-separated, or leave it out for the embedded etcd", v)
	}
	for _, ep := range eps {
		if scheme, rest, ok := strings.Cut(ep, ":"); ok && (scheme == "unix" || scheme == "unixs") {
			if strings.TrimPrefix(rest, "//") == "" {
				return refuse("etcd", ": %q names no socket", ep)
			}
			continue
		}
		hostPort := ep
		if scheme, _, ok := strings.Cut(ep, "://"); ok {
			switch scheme {
			case "http", "https":
				u, err := url.Parse(ep)
				switch {
				case err == nil && u.User != nil:
					// The etcd client ignores them, and the endpoint is
					// printed in errors: the password must not be.
					return refuse("etcd", ": %q holds a user and password: give them with --etcd-user and --etcd-password-file", u.Redacted())
				case err != nil && strings.Contains(ep, "@"):
					return refuse("etcd", ": an endpoint with a user and password (%s://…@…) is not a valid URL: give them with --etcd-user and --etcd-password-file", scheme)
				case err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
					return refuse("etcd", ": %q is not an endpoint such as http://127.0.0.1:2379", ep)
				}
				hostPort = u.Host
			default:
				return refuse("etcd", ": %q: want http, https, unix or unixs, not %s", ep, scheme)
			}
		}
		host, port, err := net.SplitHostPort(hostPort)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			return refuse("etcd", ": %q is not an endpoint: want host:port (a port from 1 to 65535) or a URL such as http://127.0.0.1:2379", ep)
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// etcdConnectParams caps gRPC's backoff between connection attempts to
// etcd at 2 s (gRPC's default grows to 2 minutes): a node cut off from
// etcd for minutes (keep-alives, rejoins and API requests failing fast
// with the last dial error all along) reconnects within seconds of etcd's
// return, not up to 2 minutes later. Connection attempts keep gRPC's
// default 20 s to complete.
var etcdConnectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: time.Second, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
	MinConnectTimeout: 20 * time.Second,
}

// etcdTLSConfig is the TLS configuration of the etcd clients from the
// etcd TLS flags, nil without them (plain).
func etcdTLSConfig(f *serverFlags) (*tls.Config, error) {
	if f.etcdCACert == "" && f.etcdCert == "" && f.etcdKey == "" {
		return nil, nil
	}
	info := transport.TLSInfo{CertFile: f.etcdCert, KeyFile: f.etcdKey, TrustedCAFile: f.etcdCACert}
	tlsCfg, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd TLS: %w (check %s, %s and %s)", err,
			f.fromEnv.givenAs("etcd-cacert"), f.fromEnv.givenAs("etcd-cert"), f.fromEnv.givenAs("etcd-key"))
	}
	return tlsCfg, nil
}

// newEtcdClient connects to etcd with tlsCfg and the auth flags (and dial
// options more). With --etcd-user the client fetches its token as it is
// made, from etcd: ctx bounds that wait, which clientv3.New alone keeps
// for its DialTimeout (5 s), deaf to the start's deadline and to a
// signal. The client's own context is canceled with ctx only while New
// waits: the client outlives ctx.
func newEtcdClient(ctx context.Context, f *serverFlags, endpoints []string, tlsCfg *tls.Config, requests *engine.RequestCounter, dial ...grpc.DialOption) (*clientv3.Client, error) {
	cctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	cli, err := clientv3.New(clientv3.Config{
		Context:     cctx,
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		TLS:         tlsCfg,
		Username:    f.etcdUser,
		Password:    f.etcdPassword,
		DialOptions: append(append(requests.DialOptions(), grpc.WithConnectParams(etcdConnectParams)), dial...),
		Logger:      zap.NewNop(),
	})
	if !stop() { // ctx ended while New waited: the client's context with it
		if err == nil {
			cli.Close()
		}
		return nil, ctx.Err()
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return cli, nil
}

// waitForEtcd retries get, a read from etcd, until it answers, logging
// each failure, and gives up at ctx's deadline (the start's, which
// --start-timeout set) with an error that names the endpoints and ctx's
// cause, or with ctx's error when ctx is canceled; at once, with the
// first warning's explanation, when what failed cannot heal by waiting
// (cannotHeal: a refused login or permission, a certificate refused at
// every endpoint), which the wait repeated for --start-timeout. explain
// adds to the first failure's warning, and to that error, what is wrong
// with the endpoints (explainEtcd, within ctx): the client's own error is only its
// deadline, which the warnings repeated for --start-timeout, a minute by
// default. Each attempt (2 s at most) and each pause between them (1 s)
// ends at the deadline: checked only between them, --start-timeout 3s
// gave up after 5 s.
func waitForEtcd(ctx context.Context, get func(context.Context) error, endpoints []string, explain func(context.Context, error) error, log *slog.Logger) error {
	giveUp := func(err error) error {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return ctx.Err()
		}
		return explain(ctx, fmt.Errorf("etcd at %s is unreachable (%v): %w", strings.Join(endpoints, ","), context.Cause(ctx), err))
	}
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := get(actx)
		cancel()
		switch {
		case err == nil:
			return nil
		case cannotHeal(err):
			return explain(ctx, fmt.Errorf("etcd at %s: %w", strings.Join(endpoints, ","), err))
		}
		if ctx.Err() != nil {
			return giveUp(err)
		}
		warning := err
		if attempt == 1 {
			if warning = explain(ctx, err); cannotHeal(warning) {
				return fmt.Errorf("etcd at %s is unreachable: %w", strings.Join(endpoints, ","), warning)
			}
		}
		log.Warn("waiting for etcd", "endpoints", strings.Join(endpoints, ","), "attempt", attempt, "err", warning)
		select {
		case <-ctx.Done():
			return giveUp(err)
		case <-time.After(time.Second):
		}
	}
}

// Bounds of the API's listeners on what a client holds before a handler
// runs (and checks its token).
const (
	// apiReadHeaderTimeout bounds the wait for a request's headers
	// (slowloris).
	apiReadHeaderTimeout = 10 * time.Second
	// apiIdleTimeout closes a keep-alive connection that sends no next
	// request: above the intervals of the dashboard (3 s), the peers' pool
	// (30 s) and a scraper's (15-60 s), which keep reusing theirs.
	apiIdleTimeout = 2 * time.Minute
	// apiMaxHeaderBytes bounds a request's headers (Go's default is 1 MiB):
	// the API reads a token, If-Match and little else.
	apiMaxHeaderBytes = 64 << 10
	// apiBodyWait and apiBodyRate bound the reading of a request's body
	// (bodyDeadline): it has apiBodyWait from its headers, and a second
	// more for each apiBodyRate bytes it brings. A 64 KiB task has 12 s; a
	// batch of 64 MiB, the largest body (api.DefaultMaxBatchBytes), 34
	// minutes, at 256 kbit/s; shardcron import's batches of 8 MiB must
	// arrive within its --timeout (30 s) anyway.
	apiBodyWait = 10 * time.Second
	apiBodyRate = 32 << 10
)

// newHTTPServer returns the server of the API's listener (and of the
// probes'), with the bounds a client that holds no token meets before it
// is refused. A body is read by handlers, after the token is checked,
// within their own limits of size and bodyDeadline's of time.
func newHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{Handler: &bodyDeadline{next: h, wait: apiBodyWait, rate: apiBodyRate},
		ReadHeaderTimeout: apiReadHeaderTimeout, IdleTimeout: apiIdleTimeout,
		MaxHeaderBytes: apiMaxHeaderBytes, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
}
