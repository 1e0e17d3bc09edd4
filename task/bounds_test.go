package task

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestTask_ValidateLimitsAtTheirBounds takes each limit at its bound and
// one past it, and each range of label key characters at its ends: a
// mutation of a comparison in validate.go (> for >=, < for <=) passed the
// other tests.
func TestTask_ValidateLimitsAtTheirBounds(t *testing.T) {
	labels := func(n int) map[string]string {
		m := make(map[string]string, n)
		for i := range n {
			m[fmt.Sprint("k", i)] = "v"
		}
		return m
	}
	targets := func(n int) []string {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprint("t", i)
		}
		return ids
	}
	tests := []struct {
		name  string
		edit  func(*Task)
		field string // "": valid
	}{
		{"max_attempts at the limit", func(t *Task) { t.Retry.MaxAttempts = maxAttempts }, ""},
		{"max_attempts past it", func(t *Task) { t.Retry.MaxAttempts = maxAttempts + 1 }, "retry.max_attempts"},
		{"chain targets at the limit", func(t *Task) { t.OnSuccess = targets(MaxChainTargets) }, ""},
		{"chain targets past it", func(t *Task) { t.OnFailure = targets(MaxChainTargets + 1) }, "on_failure"},
		{"labels at the limit", func(t *Task) { t.Labels = labels(MaxLabels) }, ""},
		{"labels past it", func(t *Task) { t.Labels = labels(MaxLabels + 1) }, "labels"},
		{"label key at the limit", func(t *Task) { t.Labels = map[string]string{strings.Repeat("k", maxLabelKeyLen): "v"} }, ""},
		{"label key past it", func(t *Task) { t.Labels = map[string]string{strings.Repeat("k", maxLabelKeyLen+1): "v"} }, "labels"},
		{"label key of range ends", func(t *Task) { t.Labels = map[string]string{"azAZ09._/-": "v"} }, ""},
		{"label key starting with a character outside", func(t *Task) { t.Labels = map[string]string{"!k": "v"} }, "labels"},
	}
	// The neighbours of the ranges' ends ('/', before '0', is allowed).
	for _, r := range "`{@[:" {
		tests = append(tests, struct {
			name  string
			edit  func(*Task)
			field string
		}{fmt.Sprintf("label key with %q", r), func(t *Task) { t.Labels = map[string]string{"k" + string(r): "v"} }, "labels"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task := &Task{ID: "a", Schedule: "* * * * *", Executor: Executor{Type: ExecutorNoop}}
			tt.edit(task)
			err := task.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v, want none", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != tt.field {
				t.Fatalf("Validate = %v, want a *ValidationError for %s", err, tt.field)
			}
		})
	}
}

// TestTask_NullPayloadIsNone: a handler's payload given as JSON null is
// no payload, as one not given.
func TestTask_NullPayloadIsNone(t *testing.T) {
	task := &Task{ID: "a", Schedule: "* * * * *", Executor: Executor{Type: ExecutorHandler, Name: "h", Payload: json.RawMessage("null")}}
	if err := task.Validate(); err != nil {
		t.Fatal(err)
	}
	if task.Executor.Payload != nil {
		t.Fatalf("payload null kept as %q", task.Executor.Payload)
	}
}

func TestCheckPrefix(t *testing.T) {
	for _, p := range []string{"", "a", "billing/", strings.Repeat("x", MaxIDLen)} {
		if err := CheckPrefix(p); err != nil {
			t.Errorf("CheckPrefix(%q) = %v, want none", p, err)
		}
	}
	for _, p := range []string{"a\n", "a\xff", strings.Repeat("x", MaxIDLen+1)} {
		var ve *ValidationError
		if err := CheckPrefix(p); !errors.As(err, &ve) || ve.Field != "prefix" {
			t.Errorf("CheckPrefix(%q) = %v, want a *ValidationError for prefix", p, err)
		}
	}
}
