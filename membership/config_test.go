package membership

import (
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestConfig_Validate(t *testing.T) {
	cli := &clientv3.Client{} // never used by Validate
	base := func(mod func(*Config)) Config {
		c := Config{Client: cli, NodeID: "node-1"}
		if mod != nil {
			mod(&c)
		}
		return c
	}
	tests := []struct {
		name   string
		cfg    Config
		fields []string // the ConfigError fields expected, in order; none: valid
	}{
		{"defaults", base(nil), nil},
		{"explicit valid", base(func(c *Config) {
			c.TTL, c.KeepAliveInterval, c.FenceMargin = 3*time.Second, time.Second, 1999*time.Millisecond
		}), nil},
		{"info id equal", base(func(c *Config) { c.Info.ID = "node-1" }), nil},
		{"host:port id", base(func(c *Config) { c.NodeID = "host-a:8080" }), nil},
		{"no client", base(func(c *Config) { c.Client = nil }), []string{"Client"}},
		{"no node id", base(func(c *Config) { c.NodeID = "" }), []string{"NodeID"}},
		{"slash in id", base(func(c *Config) { c.NodeID = "a/b" }), []string{"NodeID"}},
		{"space in id", base(func(c *Config) { c.NodeID = "a b" }), []string{"NodeID"}},
		{"control in id", base(func(c *Config) { c.NodeID = "a\x00" }), []string{"NodeID"}},
		{"id too long", base(func(c *Config) { c.NodeID = strings.Repeat("x", 257) }), []string{"NodeID"}},
		{"info id differs", base(func(c *Config) { c.Info.ID = "other" }), []string{"Info.ID"}},
		{"ttl too short", base(func(c *Config) { c.TTL = time.Second }), []string{"TTL"}},
		{"ttl negative", base(func(c *Config) { c.TTL = -time.Second }), []string{"TTL"}},
		{"ttl fractional", base(func(c *Config) { c.TTL = 2500 * time.Millisecond }), []string{"TTL"}},
		{"interval above ttl/3", base(func(c *Config) {
			c.TTL, c.KeepAliveInterval = 9*time.Second, 3*time.Second+time.Millisecond
		}), []string{"KeepAliveInterval"}},
		{"interval negative", base(func(c *Config) { c.KeepAliveInterval = -time.Second }), []string{"KeepAliveInterval"}},
		{"margin negative", base(func(c *Config) { c.FenceMargin = -time.Second }), []string{"FenceMargin"}},
		{"margin equals ttl - interval", base(func(c *Config) {
			c.TTL, c.KeepAliveInterval, c.FenceMargin = 3*time.Second, time.Second, 2*time.Second
		}), []string{"FenceMargin"}},
		{"margin above ttl", base(func(c *Config) { c.FenceMargin = time.Minute }), []string{"FenceMargin"}},
		{"several at once", base(func(c *Config) {
			c.Client, c.TTL, c.FenceMargin = nil, 1500*time.Millisecond, -1
		}), []string{"Client", "TTL", "FenceMargin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			got := configErrorFields(err)
			if strings.Join(got, ",") != strings.Join(tt.fields, ",") {
				t.Fatalf("Validate() = %v\nfields %v, want %v", err, got, tt.fields)
			}
			if err != nil && !strings.HasPrefix(err.Error(), "membership: config ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

// configErrorFields lists the fields of the *ConfigError values in err.
func configErrorFields(err error) []string {
	if err == nil {
		return nil
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	var fields []string
	for _, e := range errs {
		var ce *ConfigError
		if errors.As(e, &ce) {
			fields = append(fields, ce.Field)
		} else {
			fields = append(fields, "?"+e.Error())
		}
	}
	return fields
}

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig(&clientv3.Client{}, "n1")
	if err := c.Validate(); err != nil {
		t.Fatalf("DefaultConfig invalid: %v", err)
	}
	if c.Prefix != "/shardcron" || c.TTL != 10*time.Second || c.KeepAliveInterval != 10*time.Second/3 ||
		c.FenceMargin != 2*time.Second || c.Info.ID != "n1" || c.Logger == nil {
		t.Fatalf("DefaultConfig = %+v", c)
	}
}

func TestJoin_InvalidConfig(t *testing.T) {
	_, err := Join(t.Context(), Config{NodeID: "x"})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "Client" {
		t.Fatalf("Join with no client: %v, want a ConfigError on Client", err)
	}
}

func TestNodesPrefix(t *testing.T) {
	for prefix, want := range map[string]string{
		"":            "/shardcron/nodes/",
		"/shardcron":  "/shardcron/nodes/",
		"/shardcron/": "/shardcron/nodes/",
		"/a/b":        "/a/b/nodes/",
	} {
		if got := nodesPrefix(prefix); got != want {
			t.Errorf("nodesPrefix(%q) = %q, want %q", prefix, got, want)
		}
	}
}

func TestValidateNodeID(t *testing.T) {
	for _, ok := range []string{"node-1", "host-a:8080", "né", strings.Repeat("x", 256)} {
		if err := ValidateNodeID(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "n1/x", "a b", "a\tb", "a\x00", "\xff", strings.Repeat("x", 257)} {
		var ce *ConfigError
		if err := ValidateNodeID(bad); !errors.As(err, &ce) || ce.Field != "NodeID" || ce.Reason == "" {
			t.Errorf("%q: %v, want a *ConfigError of NodeID", bad, err)
		}
	}
}
