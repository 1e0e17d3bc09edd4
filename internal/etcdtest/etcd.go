package etcdtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// startTimeout bounds how long Start waits for the server to become ready.
// A single member elects itself in well under a second; the bound is generous
// because CI machines are shared.
const startTimeout = 30 * time.Second

// Options configure StartCluster. The zero value is what Start uses.
type Options struct {
	// Members is the number of etcd members: 1 (the default) or more. A
	// single member listens on ports the kernel picks at bind time; several
	// members need their peer addresses before they start, so their ports are
	// reserved and released first (a small race with other processes that a
	// test accepts).
	Members int
	// QuotaBackendBytes is each member's backend quota; 0 keeps etcd's
	// default (2 GiB). A small quota lets a test raise the NOSPACE alarm,
	// under which etcd refuses Put, Txn with writes and LeaseGrant but keeps
	// serving reads, deletes and keep-alives.
	QuotaBackendBytes int64
	// ClientTLS, when set, has every member serve its clients over TLS
	// with these files (ClientCertAuth: only clients with a certificate
	// of TrustedCAFile are served); Endpoints are then https URLs, and
	// Client and NewClient present the same certificate as clients.
	ClientTLS *transport.TLSInfo
	// RootPassword, when set, turns on etcd's authentication once the
	// cluster runs: user "root" with this password holds the root role,
	// and a request without valid credentials is refused. Client and
	// NewClient log in as root.
	RootPassword string
	// HostWhitelist, when set, is every member's --host-whitelist: a
	// plain HTTP request (/version, /health) whose Host is not one of
	// these is refused (421); gRPC, which the clients speak, is served.
	HostWhitelist []string
}

// Cluster is a running embedded etcd of one or more members.
type Cluster struct {
	// Endpoints are the client URLs of the members ("http://127.0.0.1:port"),
	// in member order.
	Endpoints []string
	// Client is connected to Endpoints; it is closed when the test ends.
	Client *clientv3.Client
	// Members are the cluster's members, in order.
	Members []*Member

	logger       *zap.Logger
	tls          *transport.TLSInfo // Options.ClientTLS
	rootPassword string             // Options.RootPassword
}

// Member is one embedded etcd server of a Cluster. It can be stopped and
// restarted on the same data directory and ports.
type Member struct {
	// Name is the member's name in the cluster ("m0", "m1", ...).
	Name string

	dir, logPath string
	clientURL    url.URL // the address actually bound, fixed after the first start
	peerURL      url.URL
	advPeer      url.URL // the advertised peer URL (port 0 for a single member)
	initial      string  // the initial cluster string
	quota        int64
	hosts        []string           // --host-whitelist; empty: etcd's default, every host
	tls          *transport.TLSInfo // serve clients over TLS; nil: plain

	mu   sync.Mutex // guards etcd
	etcd *embed.Etcd
}

// Start starts an embedded single-member etcd in a temporary directory on
// free loopback ports, waits until it serves requests and returns it with a
// connected Client. Server and client are closed when the test ends
// (t.Cleanup). Start fails the test if the server cannot start.
//
// The server logs at error level to a file that is printed when the test
// fails.
func Start(t testing.TB) *Cluster {
	t.Helper()
	return StartCluster(t, Options{})
}

// StartCluster starts an embedded etcd as o describes and waits until every
// member serves requests; otherwise it is Start.
func StartCluster(t testing.TB, o Options) *Cluster {
	t.Helper()
	n := o.Members
	if n <= 0 {
		n = 1
	}
	c := &Cluster{tls: o.ClientTLS}
	scheme := "http"
	if o.ClientTLS != nil {
		scheme = "https"
	}
	addrs := freeAddrs(t, 2*n)
	var initial []string
	for i := 0; i < n; i++ {
		peer := url.URL{Scheme: "http", Host: addrs[2*i+1]}
		m := &Member{Name: fmt.Sprintf("m%d", i), dir: t.TempDir(), quota: o.QuotaBackendBytes, tls: o.ClientTLS, hosts: o.HostWhitelist,
			clientURL: url.URL{Scheme: scheme, Host: addrs[2*i]}, peerURL: peer, advPeer: peer}
		m.logPath = filepath.Join(m.dir, "etcd.log")
		initial = append(initial, m.Name+"="+m.advPeer.String())
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.initial = strings.Join(initial, ",")
	}
	t.Cleanup(func() {
		for _, m := range c.Members {
			m.Stop()
			if t.Failed() {
				if b, err := os.ReadFile(m.logPath); err == nil && len(b) > 0 {
					t.Logf("etcdtest: server log of %s:\n%s", m.Name, b)
				}
			}
		}
	})
	// Members of a new cluster wait for each other, so they start together.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range c.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.start()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
	}
	for _, m := range c.Members {
		c.Endpoints = append(c.Endpoints, m.Endpoint())
	}
	c.logger = c.Members[0].etcd.GetLogger()
	c.Client = c.NewClient(t)
	if o.RootPassword != "" {
		c.enableAuth(t, o.RootPassword)
	}
	return c
}

// enableAuth adds user root with password and the root role, turns
// authentication on, and replaces Client by one logged in as root.
func (c *Cluster) enableAuth(t testing.TB, password string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if _, err := c.Client.UserAdd(ctx, "root", password); err != nil {
		t.Fatalf("etcdtest: add user root: %v", err)
	}
	if _, err := c.Client.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatalf("etcdtest: grant root: %v", err)
	}
	if _, err := c.Client.AuthEnable(ctx); err != nil {
		t.Fatalf("etcdtest: enable auth: %v", err)
	}
	_ = c.Client.Close()
	c.rootPassword = password
	c.Client = c.NewClient(t)
}

// freeAddrs returns k distinct loopback addresses with ports that were free
// a moment ago. Every port stays bound until all are chosen: a port closed
// at once is often the kernel's next pick.
//
// The ports lie below the kernel's ephemeral range where it can say
// (quietPorts): there no connection's local end and no listener on port 0
// takes one, so a member that is stopped finds its ports free at its
// restart. In the range, a connection of some test process took a stopped
// member's port now and then ("bind: address already in use"). What is
// left is another process's random pick of the same port, 1 in some
// 20 000.
func freeAddrs(t testing.TB, k int) []string {
	t.Helper()
	lo, hi := quietPorts()
	addrs := make([]string, k)
	for i := range addrs {
		ln, err := listenQuiet(lo, hi)
		if err != nil {
			t.Fatalf("etcdtest: reserve a port: %v", err)
		}
		defer ln.Close()
		addrs[i] = ln.Addr().String()
	}
	return addrs
}

// quietPorts returns the ports [lo, hi) below the kernel's ephemeral range,
// from 10 000 up to NodePorts at most; both 0 when the range is not
// readable or leaves fewer than 1 000 such ports (then the kernel picks, as
// listenQuiet does when its random picks are taken).
func quietPorts() (lo, hi int) {
	first := EphemeralStart()
	if first <= 11000 {
		return 0, 0
	}
	return 10000, min(first, NodePorts)
}

// NodePorts is where the ports of node processes begin: members take theirs
// below it, and clustertest picks its nodes' from it up to the ephemeral
// range. A node's port is picked before the node binds it, and a member of
// another test process that took it in between stopped the node's start.
const NodePorts = 20000

// EphemeralStart is the first port of the kernel's ephemeral range, from
// which it picks the local ports of connections and of listeners on port
// 0; 0 when it cannot say.
func EphemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	var first, last int
	if _, err := fmt.Sscan(string(b), &first, &last); err != nil {
		return 0
	}
	return first
}

// listenQuiet listens on a loopback port of [lo, hi) picked at random, or,
// when no such port is free after a few tries or there are none, on one
// the kernel picks.
func listenQuiet(lo, hi int) (net.Listener, error) {
	for try := 0; try < 64 && lo < hi; try++ {
		port := lo + rand.IntN(hi-lo)
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			return ln, nil
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// start starts the member's server on its data directory and waits until it
// is ready. After the first start the member keeps the ports it bound.
func (m *Member) start() error {
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.dir
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.advPeer}
	cfg.InitialCluster = m.initial
	cfg.EnableGRPCGateway = false
	cfg.QuotaBackendBytes = m.quota
	if m.tls != nil {
		cfg.ClientTLSInfo = *m.tls
	}
	if len(m.hosts) > 0 {
		cfg.HostWhitelist = map[string]struct{}{}
		for _, h := range m.hosts {
			cfg.HostWhitelist[h] = struct{}{}
		}
	}

	// Tests need no durability: skip fsync. A 10 ms raft tick halves the
	// start-up time (the single member elects itself within a few ticks); it
	// also lowers the server's minimum lease TTL from 2 s to 1 s.
	cfg.UnsafeNoFsync = true
	cfg.SnapshotCount = 10000
	cfg.TickMs, cfg.ElectionMs = 10, 100

	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{m.logPath}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd member %s: %w", m.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		closeUnready(e)
		return fmt.Errorf("etcd member %s failed while starting: %w", m.Name, err)
	case <-time.After(startTimeout):
		closeUnready(e)
		return fmt.Errorf("etcd member %s not ready after %v", m.Name, startTimeout)
	}
	m.mu.Lock()
	m.etcd = e
	// Keep the bound ports, so that a restart listens where clients and
	// proxies already point.
	m.clientURL = url.URL{Scheme: m.clientURL.Scheme, Host: e.Clients[0].Addr().String()}
	m.peerURL = url.URL{Scheme: "http", Host: e.Peers[0].Addr().String()}
	m.mu.Unlock()
	return nil
}

// Endpoint is the member's client URL ("http://127.0.0.1:port", https
// when it serves TLS).
func (m *Member) Endpoint() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.clientURL.Scheme + "://" + m.clientURL.Host
}

// Addr is the member's client address ("127.0.0.1:port"), e.g. the target of
// a Proxy. It stays the same across Stop and Restart.
func (m *Member) Addr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.clientURL.Host
}

// Stop stops the member's server; its data directory is kept. Stop is
// idempotent.
func (m *Member) Stop() {
	m.mu.Lock()
	e := m.etcd
	m.etcd = nil
	m.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts a stopped member again on the same data directory and
// ports and waits until it is ready (for a member of several, until it has
// rejoined a cluster with a leader). Restart fails the test if the server
// cannot start, e.g. because another process took its port meanwhile.
func (m *Member) Restart(t testing.TB) {
	t.Helper()
	m.Stop()
	if err := m.start(); err != nil {
		t.Fatalf("etcdtest: restart: %v", err)
	}
}

// closeUnready closes e, a server that never became ready, waiting 5 s
// at most: embed's Close then waits for client listeners that were never
// handed over (etcd 3.7.3, embed/etcd.go), for good, and the test would
// hang until its package's timeout instead of failing with the reason.
// Seen once: a member of two restarted together (RestartMembers) was not
// ready after startTimeout, with the chaos scenarios' processes running
// beside, and the engine's package hung for 7 minutes in Close. It leaves
// the goroutine of such a Close behind: the package's leak check names it.
func closeUnready(e *embed.Etcd) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Close()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
}

// RestartMembers starts stopped members again together, as a cluster that
// lost its quorum needs: a member of several is ready only once it has a
// leader, which takes a quorum of members started. It fails the test if a
// member cannot start.
func RestartMembers(t testing.TB, ms ...*Member) {
	t.Helper()
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		m.Stop()
		wg.Go(func() { errs[i] = m.start() })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("etcdtest: restart: %v", err)
		}
	}
}

// ID is the member's raft id; 0 while it is stopped.
func (m *Member) ID() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.etcd == nil {
		return 0
	}
	return uint64(m.etcd.Server.MemberID())
}

// IsLeader reports whether the member is running and currently the leader.
func (m *Member) IsLeader() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcd != nil && m.etcd.Server.Leader() == m.etcd.Server.MemberID()
}

// Leader returns the index in Members of the current leader, waiting up to
// startTimeout for one to be elected.
func (c *Cluster) Leader(t testing.TB) int {
	t.Helper()
	leader := -1
	WaitFor(t, startTimeout, func() bool {
		for i, m := range c.Members {
			if m.IsLeader() {
				leader = i
				return true
			}
		}
		return false
	})
	return leader
}

// MoveLeader transfers leadership to member to, and waits until it leads.
// It fails the test if the transfer fails.
//
// A transfer is tried again, from whoever leads then, when an attempt
// fails or hangs: on a loaded machine (the race detector, nodes firing)
// the target may lag too far behind to take over in time, or leadership
// may change during the attempt, and etcd's MoveLeader then hung until
// its caller's deadline.
func (c *Cluster) MoveLeader(t testing.TB, to int) {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for {
		from := c.Leader(t)
		if from == to {
			return
		}
		err := c.tryMoveLeader(t, from, to)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcdtest: move leader from %s to %s: %v", c.Members[from].Name, c.Members[to].Name, err)
		}
		t.Logf("etcdtest: moving the leader from %s to %s failed, trying again: %v", c.Members[from].Name, c.Members[to].Name, err)
	}
}

// moveAttempt bounds one MoveLeader attempt and the wait for its result.
const moveAttempt = 5 * time.Second

// tryMoveLeader asks from, the leader, to hand leadership to member to,
// and waits a while for to to lead.
func (c *Cluster) tryMoveLeader(t testing.TB, from, to int) error {
	cli := c.NewClient(t, c.Members[from].Endpoint())
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), moveAttempt)
	defer cancel()
	if _, err := cli.MoveLeader(ctx, c.Members[to].ID()); err != nil {
		return err
	}
	for end := time.Now().Add(moveAttempt); !c.Members[to].IsLeader(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			return fmt.Errorf("%s did not lead within %v of the transfer", c.Members[to].Name, moveAttempt)
		}
	}
	return nil
}

// NewClient returns a new client connected to endpoints, or to the cluster's
// Endpoints when none are given (pass a Proxy's Endpoint to reach the server
// through it). The client logs like the server and is closed when the test
// ends; closing it earlier is fine.
func (c *Cluster) NewClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	if len(endpoints) == 0 {
		endpoints = c.Endpoints
	}
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      c.logger,
	}
	if c.tls != nil {
		tc, err := c.tls.ClientConfig()
		if err != nil {
			t.Fatalf("etcdtest: client TLS: %v", err)
		}
		cfg.TLS = tc
	}
	if c.rootPassword != "" {
		cfg.Username, cfg.Password = "root", c.rootPassword
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("etcdtest: new client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Addr is the first member's client address ("127.0.0.1:port"), e.g. the
// target of a Proxy.
func (c *Cluster) Addr() string {
	return c.Members[0].Addr()
}

// RaiseNoSpace raises the NOSPACE alarm on every member, as a full backend
// would, without filling it: etcd then refuses Put, Txn with writes and
// LeaseGrant, and keeps serving reads, deletes and keep-alives.
func (c *Cluster) RaiseNoSpace(t testing.TB) {
	t.Helper()
	c.alarm(t, etcdserverpb.AlarmRequest_ACTIVATE)
}

// ClearNoSpace disarms the NOSPACE alarm on every member. A backend still
// over its quota raises it again at the next write.
func (c *Cluster) ClearNoSpace(t testing.TB) {
	t.Helper()
	c.alarm(t, etcdserverpb.AlarmRequest_DEACTIVATE)
}

func (c *Cluster) alarm(t testing.TB, action etcdserverpb.AlarmRequest_AlarmAction) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	mc := etcdserverpb.NewMaintenanceClient(c.Client.ActiveConnection())
	for _, m := range c.Members {
		req := &etcdserverpb.AlarmRequest{Action: action, MemberID: m.ID(), Alarm: etcdserverpb.AlarmType_NOSPACE}
		if _, err := mc.Alarm(ctx, req); err != nil {
			t.Fatalf("etcdtest: %v NOSPACE on %s: %v", action, m.Name, err)
		}
	}
}
