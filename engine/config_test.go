package engine

import (
	"strings"
	"testing"
	"time"
)

// TestConfig_Validate checks every rejection of Config.Validate: each bad
// field alone makes it fail with an error that names the field, and the
// default configuration passes.
func TestConfig_Validate(t *testing.T) {
	if err := DefaultConfig("node-1").Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	tests := []struct {
		field  string
		change func(c *Config)
	}{
		{"NodeID", func(c *Config) { c.NodeID = "" }},
		{"Partitions", func(c *Config) { c.Partitions = -1 }},
		{"ReplicationFactor", func(c *Config) { c.ReplicationFactor = 1 }},
		{"Load", func(c *Config) { c.Load = 0.5 }},
		{"Workers", func(c *Config) { c.Workers = -1 }},
		{"Workers", func(c *Config) { c.Workers = MaxWorkers + 1 }},
		{"Queue", func(c *Config) { c.Queue = MaxQueue + 1 }},
		{"Stage", func(c *Config) { c.Stage = MaxStage + 1 }},
		{"Queue", func(c *Config) { c.Queue, c.BatchSize = 100, 200 }},
		{"Queue", func(c *Config) { c.BatchSize = -1 }},
		{"Tick", func(c *Config) { c.Tick = time.Microsecond }},
		{"Tick", func(c *Config) { c.Tick = 2 * time.Second }},
		{"Partitions", func(c *Config) { c.Partitions = MaxPartitions + 1 }},
		{"MisfireThreshold", func(c *Config) { c.Tick, c.MisfireThreshold = 10*time.Millisecond, time.Millisecond }},
		{"WatermarkInterval", func(c *Config) { c.Tick, c.WatermarkInterval = 10*time.Millisecond, time.Millisecond }},
		{"Lead", func(c *Config) { c.WatermarkInterval, c.Lead = time.Second, 1500*time.Millisecond }},
		{"DrainTimeout", func(c *Config) { c.DrainTimeout = -time.Second }},
		{"DrainTimeout", func(c *Config) { c.DrainTimeout = MaxDrainTimeout + time.Second }},
		{"ReleaseRunWait", func(c *Config) { c.ReleaseRunWait = -time.Second }},
		{"ReleaseRunWait", func(c *Config) { c.ReleaseRunWait = MaxReleaseRunWait + time.Second }},
	}
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			cfg := DefaultConfig("node-1")
			tt.change(&cfg)
			err := cfg.Validate()
			if err == nil {
				t.Fatalf("%+v: accepted", cfg)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("error %q does not name %s", err, tt.field)
			}
		})
	}
}
