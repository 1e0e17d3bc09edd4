package api

import (
	"context"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardcron/shardcron/membership"
)

// Node is a member of the cluster as GET /v1/nodes reports it, and this
// node as GET /v1/nodes/self does.
type Node struct {
	// ID, APIAddr, StartedAt and Version are what the node published in its
	// membership record.
	ID        string    `json:"id"`
	APIAddr   string    `json:"api_addr"`
	StartedAt time.Time `json:"started_at"`
	Version   string    `json:"version"`
	// Partitions is how many partitions the ring assigns to the node, and
	// PartitionList which (ascending), as the answering node's ring has it.
	Partitions    int   `json:"partitions"`
	PartitionList []int `json:"partition_list"`
	// Owned are the partitions the node reports holding right now
	// (ascending): it lags PartitionList while partitions move. Null when
	// the node did not answer.
	Owned []int `json:"owned"`
	// Tasks is how many tasks the node holds, Fires how many fires it has
	// dispatched since it started, FireRate its fires per second over about
	// the last 10 s, QueueDepth the fires waiting for a worker.
	Tasks      int     `json:"tasks"`
	Fires      uint64  `json:"fires"`
	FireRate   float64 `json:"fire_rate"`
	QueueDepth int     `json:"queue_depth"`
	// Ready: the node owns every partition the ring gives it. Fenced: it
	// has stopped dispatching until it rejoins.
	Ready  bool `json:"ready"`
	Fenced bool `json:"fenced"`
	// Error says why the node's own figures (Owned to Fenced) are missing:
	// it did not answer. Empty otherwise.
	Error string `json:"error,omitempty"`
}

// Partition is one partition as GET /v1/partitions reports it.
type Partition struct {
	Partition int `json:"partition"`
	// Owner is the node the ring assigns the partition to; "" before the
	// node has seen the member list.
	Owner string `json:"owner"`
	// State is "owned" when Owner reports holding the partition, else
	// "moving" (being released by its previous owner or acquired by the
	// new one, or Owner did not answer).
	State string `json:"state"`
}

// Partition states.
const (
	PartitionOwned  = "owned"
	PartitionMoving = "moving"
)

type nodesResponse struct {
	Nodes []Node `json:"nodes"`
}

type partitionsResponse struct {
	Partitions []Partition `json:"partitions"`
}

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

// peerClient returns a client of another node's API, nil when the node is
// not a member or published no address.
func (s *Server) peerClient(ctx context.Context, nodeID string) *Client {
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

func (s *Server) clientFor(m membership.Member) *Client {
	if m.Info.APIAddr == "" {
		return nil
	}
	return &Client{BaseURL: baseURL(m.Info.APIAddr), Token: s.cfg.AuthToken, HTTP: s.peer}
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
func (s *Server) eachPeer(ctx context.Context, ms []membership.Member, fn func(context.Context, membership.Member, *Client)) {
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
func askPeers[T any](s *Server, ctx context.Context, what string, ask func(context.Context, *Client) (T, error), attrs ...any) (answers []T, missing []string) {
	ms, err := s.memberList(ctx)
	if err != nil {
		s.log.Warn("api: listing members failed; answering with this node's part only", append(attrs, "err", err)...)
		missing = append(missing, "the member list could not be read: "+err.Error())
	}
	var mu sync.Mutex // guards answers and missing
	s.eachPeer(ctx, ms, func(ctx context.Context, m membership.Member, c *Client) {
		a, err := ask(ctx, c)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			s.log.Warn("api: a node did not "+what+"; answering without it", append(attrs, "node", m.ID, "err", err)...)
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
func (s *Server) peerReports(ctx context.Context, ms []membership.Member) (map[string]*Node, map[string]string) {
	reports := map[string]*Node{}
	missing := map[string]string{}
	var mu sync.Mutex // guards reports and missing
	s.eachPeer(ctx, ms, func(ctx context.Context, m membership.Member, c *Client) {
		n, err := c.self(ctx)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			s.log.Warn("api: a node did not report its state; answering without it", "node", m.ID, "err", err)
			missing[m.ID] = "did not answer: " + err.Error()
			return
		}
		reports[m.ID] = n
	})
	return reports, missing
}

// selfNode is this node's own report.
func (s *Server) selfNode() Node {
	st := s.e.Stats()
	n := Node{
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
func (s *Server) fillRing(n *Node) {
	n.PartitionList = []int{}
	if a := s.e.Assignment(); a != nil {
		if l := a.Owned(n.ID); l != nil {
			n.PartitionList = l
		}
	}
	n.Partitions = len(n.PartitionList)
}

// fillMember sets what m published.
func fillMember(n *Node, m membership.Member) {
	n.APIAddr, n.StartedAt = m.Info.APIAddr, m.Info.StartedAt
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
	out := make([]Node, 0, len(ms)+1)
	seenSelf := false
	for _, m := range ms {
		var n Node
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
	writeJSON(w, http.StatusOK, nodesResponse{Nodes: out})
}

// partitions: GET /v1/partitions, the owner and state of every partition.
func (s *Server) partitions(w http.ResponseWriter, r *http.Request) {
	var reports map[string]*Node
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
	out := make([]Partition, s.reg.Partitions())
	for p := range out {
		owner := ""
		if a != nil {
			owner = a.Owner(p)
		}
		state := PartitionMoving
		if owner == self && s.e.Owns(p) || owner != self && held[owner] != nil && held[owner][p] {
			state = PartitionOwned
		}
		out[p] = Partition{Partition: p, Owner: owner, State: state}
	}
	writeJSON(w, http.StatusOK, partitionsResponse{Partitions: out})
}
