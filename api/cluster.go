package api

import (
	"context"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/membership"
)

// memberCacheTTL is how long a member list read from etcd is reused: a
// dashboard polling several endpoints costs etcd one read a second.
const memberCacheTTL = time.Second

// memberCache holds the last member list.
type memberCache struct {
	mu   sync.Mutex // guards list and at
	list []membership.Member
	at   time.Time
}

// memberList returns the cluster's live members, sorted by id.
func (s *Server) memberList(ctx context.Context) ([]membership.Member, error) {
	c := &s.members
	c.mu.Lock()
	if c.list != nil && time.Since(c.at) < memberCacheTTL {
		l := c.list
		c.mu.Unlock()
		return l, nil
	}
	c.mu.Unlock()
	ms, err := s.e.Members(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.list, c.at = ms, time.Now()
	c.mu.Unlock()
	return ms, nil
}

// peerWarnEvery is how often, at most, the log warns that one node did not
// answer: the dashboard asks every node every 3 s, so a node down or
// misconfigured would otherwise be some 1 200 warnings an hour.
const peerWarnEvery = time.Minute

// warnPeer logs msg, with attrs, of node at Warn once a peerWarnEvery,
// saying how many it held back, and at Debug in between.
func (s *Server) warnPeer(node, msg string, attrs ...any) {
	level := slog.LevelDebug
	if ok, held := s.peerWarns.Pass(node, time.Now()); ok {
		level = slog.LevelWarn
		if held > 0 {
			attrs = append(attrs, "held_back", held)
		}
	}
	s.log.Log(context.Background(), level, msg, append(attrs, "node", node)...)
}

// peerClient returns a client of another node's API, nil when the node is
// not a member or published no address.
func (s *Server) peerClient(ctx context.Context, nodeID string) *client.Client {
	ms, err := s.memberList(ctx)
	if err != nil {
		s.log.Warn("api: listing members failed", "err", err)
		return nil
	}
	for _, m := range ms {
		if m.ID == nodeID {
			return s.clientFor(m)
		}
	}
	return nil
}

func (s *Server) clientFor(m membership.Member) *client.Client {
	if m.Info.APIAddr == "" {
		return nil
	}
	return &client.Client{BaseURL: baseURL(m.Info.APIAddr), Token: s.cfg.AuthToken, HTTP: s.peer}
}

// baseURL turns a published api_addr ("node-1.internal:8080" or a URL) into a
// base URL.
func baseURL(addr string) string {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return strings.TrimRight(addr, "/")
}

// eachPeer calls fn concurrently for every member but this node that
// published an address, each under peerTimeout, and returns when all have
// returned.
func (s *Server) eachPeer(ctx context.Context, ms []membership.Member, fn func(context.Context, membership.Member, *client.Client)) {
	var wg sync.WaitGroup
	for _, m := range ms {
		if m.ID == s.e.NodeID() {
			continue
		}
		c := s.clientFor(m)
		if c == nil {
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, peerTimeout)
			defer cancel()
			fn(ctx, m, c)
		})
	}
	wg.Wait()
}

// askPeers asks every other member with ask, at once, and returns their
// answers and why the others are missing, sorted. A failure is logged as
// "did not <what>"; without the member list only this node answers.
func askPeers[T any](s *Server, ctx context.Context, what string, ask func(context.Context, *client.Client) (T, error), attrs ...any) (answers []T, missing []string) {
	ms, err := s.memberList(ctx)
	if err != nil {
		s.log.Warn("api: listing members failed; answering with this node's part only", append(attrs, "err", err)...)
		missing = append(missing, "the member list could not be read: "+err.Error())
	}
	var mu sync.Mutex // guards answers and missing
	s.eachPeer(ctx, ms, func(ctx context.Context, m membership.Member, c *client.Client) {
		a, err := ask(ctx, c)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			s.warnPeer(m.ID, "api: a node did not "+what+"; answering without it", append(attrs, "err", err)...)
			missing = append(missing, m.ID+": "+err.Error())
			return
		}
		answers = append(answers, a)
	})
	slices.Sort(missing)
	return answers, missing
}

// peerReports asks every other member for its /v1/nodes/self. It returns
// the answers by node id, and why the others are missing.
func (s *Server) peerReports(ctx context.Context, ms []membership.Member) (map[string]*client.Node, map[string]string) {
	reports := map[string]*client.Node{}
	missing := map[string]string{}
	var mu sync.Mutex // guards reports and missing
	s.eachPeer(ctx, ms, func(ctx context.Context, m membership.Member, c *client.Client) {
		n, err := c.Self(ctx)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			s.warnPeer(m.ID, "api: a node did not report its state; answering without it", "err", err)
			missing[m.ID] = "did not answer: " + err.Error()
			return
		}
		reports[m.ID] = n
	})
	return reports, missing
}

// selfNode is this node's own report.
func (s *Server) selfNode() client.Node {
	st := s.e.Stats()
	n := client.Node{
		ID:         s.e.NodeID(),
		Version:    s.cfg.Version,
		Owned:      []int{},
		Tasks:      st.Tasks,
		Fires:      st.Fires,
		FireRate:   math.Round(s.rate.rate(time.Now(), st.Fires)*1000) / 1000,
		QueueDepth: st.QueueDepth,
		Ready:      st.Ready,
		Fenced:     st.Fenced,
	}
	for p := range s.reg.Partitions() {
		if s.e.Owns(p) {
			n.Owned = append(n.Owned, p)
		}
	}
	s.fillRing(&n)
	return n
}

// fillRing sets the partitions the ring of this node assigns to n.
func (s *Server) fillRing(n *client.Node) {
	n.PartitionList = []int{}
	if a := s.e.Assignment(); a != nil {
		if l := a.Owned(n.ID); l != nil {
			n.PartitionList = l
		}
	}
	n.Partitions = len(n.PartitionList)
}

// fillMember sets what m published.
func fillMember(n *client.Node, m membership.Member) {
	n.APIAddr, n.StartedAt, n.Leaving = m.Info.APIAddr, m.Info.StartedAt, m.Info.Leaving
	if m.Info.Version != "" {
		n.Version = m.Info.Version
	}
}

// selfHandler: GET /v1/nodes/self (extension).
func (s *Server) selfHandler(w http.ResponseWriter, r *http.Request) {
	n := s.selfNode()
	if ms, err := s.memberList(r.Context()); err == nil {
		for _, m := range ms {
			if m.ID == n.ID {
				fillMember(&n, m)
			}
		}
	}
	writeJSON(w, http.StatusOK, n)
}

// nodes: GET /v1/nodes, every member with its partitions and counters.
func (s *Server) nodes(w http.ResponseWriter, r *http.Request) {
	ms, err := s.memberList(r.Context())
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	reports, missing := s.peerReports(r.Context(), ms)
	self := s.e.NodeID()
	out := make([]client.Node, 0, len(ms)+1)
	seenSelf := false
	for _, m := range ms {
		var n client.Node
		switch rep := reports[m.ID]; {
		case m.ID == self:
			n, seenSelf = s.selfNode(), true
		case rep != nil:
			n = *rep
		default:
			n.Error = missing[m.ID]
			if n.Error == "" {
				n.Error = "published no api_addr"
			}
		}
		n.ID = m.ID
		fillMember(&n, m)
		s.fillRing(&n)
		out = append(out, n)
	}
	if !seenSelf {
		// Not in the member list: its session is gone (fenced) and it is
		// rejoining. Show it, or the answering node would be missing.
		n := s.selfNode()
		n.Error = "not registered as a member: the node lost its session and is rejoining"
		out = append(out, n)
	}
	writeJSON(w, http.StatusOK, client.NodesResponse{Nodes: out})
}

// partitions: GET /v1/partitions, the owner and state of every partition.
func (s *Server) partitions(w http.ResponseWriter, r *http.Request) {
	var reports map[string]*client.Node
	if ms, err := s.memberList(r.Context()); err != nil {
		s.log.Warn("api: listing members failed; reporting only this node's partitions as owned", "err", err)
	} else {
		reports, _ = s.peerReports(r.Context(), ms)
	}
	held := map[string][]bool{}
	for id, n := range reports {
		h := make([]bool, s.reg.Partitions())
		for _, p := range n.Owned {
			if p >= 0 && p < len(h) {
				h[p] = true
			}
		}
		held[id] = h
	}
	a := s.e.Assignment()
	self := s.e.NodeID()
	out := make([]client.Partition, s.reg.Partitions())
	for p := range out {
		owner := ""
		if a != nil {
			owner = a.Owner(p)
		}
		state := client.PartitionMoving
		if owner == self && s.e.Owns(p) || owner != self && held[owner] != nil && held[owner][p] {
			state = client.PartitionOwned
		}
		out[p] = client.Partition{Partition: p, Owner: owner, State: state}
	}
	writeJSON(w, http.StatusOK, client.PartitionsResponse{Partitions: out})
}
