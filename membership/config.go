package membership

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultTTL is the lease TTL of a Config that sets none.
const DefaultTTL = 10 * time.Second

// MinTTL is the shortest lease TTL: etcd counts leases in whole seconds, and
// a TTL of one leaves the keep-alive and the fence margin no room.
const MinTTL = 2 * time.Second

// The default keep-alive interval is TTL/3 and the default fence margin TTL/5.
const (
	defaultKeepAliveDivisor   = 3
	defaultFenceMarginDivisor = 5
)

// maxNodeIDLen bounds a node id; it is part of an etcd key.
const maxNodeIDLen = 256

// NodeInfo is what a node publishes under its key, as JSON
// {"id","api_addr","started_at","version","leaving","exec","handlers"}.
// It is read by every node on every membership change: keep it small.
type NodeInfo struct {
	ID        string    `json:"id"`
	APIAddr   string    `json:"api_addr"`
	StartedAt time.Time `json:"started_at"`
	Version   string    `json:"version"`
	// Leaving is set by Session.Leave: the node is handing its partitions
	// over before it goes, and the ring leaves it out.
	Leaving bool `json:"leaving,omitempty"`
	// Exec says that the node runs the exec executor (--allow-exec), and
	// Handlers names the in-process handlers it registered, sorted: the
	// registry refuses a task that no live node can run.
	Exec     bool     `json:"exec,omitempty"`
	Handlers []string `json:"handlers,omitempty"`
	// ExecAllow and HTTPAllow are the node's allow-lists of commands
	// (--exec-allow) and hosts (--http-allow); empty allows all.
	ExecAllow []string `json:"exec_allow,omitempty"`
	HTTPAllow []string `json:"http_allow,omitempty"`
}

// Config configures Join. Zero durations take the defaults named on each
// field; invalid values are an error from Validate and Join, never silently
// replaced.
type Config struct {
	// Client is the etcd client the session uses for everything. Required.
	// It must outlive the Session.
	Client *clientv3.Client

	// Prefix is the etcd key prefix of the cluster. Default DefaultPrefix
	// ("/shardcron"); a trailing slash is ignored.
	Prefix string

	// NodeID identifies the node: its key is <Prefix>/nodes/<NodeID>.
	// Required; at most 256 bytes, no '/', no whitespace or control
	// characters.
	NodeID string

	// Info is published under the node's key. Info.ID defaults to NodeID and
	// must equal it when set; a zero Info.StartedAt becomes the time of Join.
	Info NodeInfo

	// TTL is the lease TTL, in whole seconds, at least 2 s. Default 10 s.
	// It is the failover time after a crash: a shorter TTL hands a dead
	// node's partitions over sooner, but fences a node that is slow or cut
	// off from etcd sooner too.
	TTL time.Duration

	// KeepAliveInterval is how often the session refreshes its lease.
	// Default TTL/3; at most TTL/3, so two keep-alives can fail before the
	// lease is in danger. Each keep-alive waits at most this long for its
	// answer; a failed one is retried after a quarter of it.
	KeepAliveInterval time.Duration

	// FenceMargin is how long before the lease can expire on the server the
	// session declares itself fenced. Default TTL/5; it must be positive and
	// less than TTL - KeepAliveInterval, or a healthy session would fence
	// itself between two keep-alives. A larger margin tolerates more clock
	// rate difference and dispatch latency, at the cost of fencing earlier
	// when etcd is slow.
	FenceMargin time.Duration

	// Logger receives the session's events. Default slog.Default().
	Logger *slog.Logger
}

// ConfigError is an invalid Config field.
type ConfigError struct {
	Field  string // the Config field, e.g. "FenceMargin"
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("membership: config %s: %s", e.Field, e.Reason)
}

// DefaultConfig returns a Config for node id on client with every default
// filled in.
func DefaultConfig(client *clientv3.Client, nodeID string) Config {
	c := Config{Client: client, NodeID: nodeID}
	c.applyDefaults()
	return c
}

// applyDefaults fills in the zero fields; negative ones are left for Validate
// to reject.
func (c *Config) applyDefaults() {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Info.ID == "" {
		c.Info.ID = c.NodeID
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.KeepAliveInterval == 0 && c.TTL > 0 {
		c.KeepAliveInterval = c.TTL / defaultKeepAliveDivisor
	}
	if c.FenceMargin == 0 && c.TTL > 0 {
		c.FenceMargin = c.TTL / defaultFenceMarginDivisor
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every invalid field, as *ConfigError values joined with
// errors.Join, after applying the defaults to a copy; nil if c is usable.
func (c Config) Validate() error {
	orig := c
	c.applyDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)})
	}

	if c.Client == nil {
		bad("Client", "required")
	}
	if err := ValidateNodeID(c.NodeID); err != nil {
		errs = append(errs, err)
	}
	if c.Info.ID != c.NodeID {
		bad("Info.ID", "%q differs from NodeID %q", c.Info.ID, c.NodeID)
	}

	ttlOK := true
	switch {
	case c.TTL < MinTTL:
		bad("TTL", "%v is less than %v", c.TTL, MinTTL)
		ttlOK = false
	case c.TTL%time.Second != 0:
		bad("TTL", "%v is not a whole number of seconds (etcd leases have 1 s resolution)", c.TTL)
		ttlOK = false
	}

	// A zero interval or margin derives from the TTL: when the TTL is wrong
	// that is the only error to report.
	intervalOK := true
	switch {
	case orig.KeepAliveInterval == 0 && !ttlOK:
		intervalOK = false
	case c.KeepAliveInterval <= 0:
		bad("KeepAliveInterval", "%v must be positive", c.KeepAliveInterval)
		intervalOK = false
	case ttlOK && c.KeepAliveInterval > c.TTL/3:
		bad("KeepAliveInterval", "%v exceeds TTL/3 (%v)", c.KeepAliveInterval, c.TTL/3)
		intervalOK = false
	}

	switch {
	case orig.FenceMargin == 0 && !ttlOK:
	case c.FenceMargin <= 0:
		bad("FenceMargin", "%v must be positive", c.FenceMargin)
	case ttlOK && intervalOK && c.FenceMargin >= c.TTL-c.KeepAliveInterval:
		bad("FenceMargin", "%v must be less than TTL - KeepAliveInterval (%v)",
			c.FenceMargin, c.TTL-c.KeepAliveInterval)
	}
	return errors.Join(errs...)
}

// ValidateNodeID returns a *ConfigError of field NodeID saying why id is
// not a valid node id (empty, longer than 256 bytes, with a '/', whitespace,
// a control character or invalid UTF-8), nil if it is one. Join and
// Validate apply it; a command checks a node id with it before it connects.
func ValidateNodeID(id string) error {
	if reason := checkNodeID(id); reason != "" {
		return &ConfigError{Field: "NodeID", Reason: reason}
	}
	return nil
}

// checkNodeID returns why id is not a valid node id, or "".
func checkNodeID(id string) string {
	switch {
	case id == "":
		return "required"
	case len(id) > maxNodeIDLen:
		return fmt.Sprintf("%d bytes, more than %d", len(id), maxNodeIDLen)
	case strings.Contains(id, "/"):
		return fmt.Sprintf("%q contains '/'", id)
	}
	for _, r := range id {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return fmt.Sprintf("%q contains whitespace, a control character or invalid UTF-8", id)
		}
	}
	return ""
}
