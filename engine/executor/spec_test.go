package executor

import (
	"errors"
	"testing"
)

func TestSpec_Check(t *testing.T) {
	for _, tc := range []struct {
		name  string
		check func() error
		field string // "": valid
	}{
		{"http ok", HTTPSpec{URL: "http://127.0.0.1/x", Headers: map[string]string{"X-A": "1\t2"}}.Check, ""},
		{"http no url", HTTPSpec{}.Check, "url"},
		{"http relative url", HTTPSpec{URL: "/x"}.Check, "url"},
		{"http bad method", HTTPSpec{URL: "http://127.0.0.1", Method: "GE T"}.Check, "method"},
		{"http bad header name", HTTPSpec{URL: "http://127.0.0.1", Headers: map[string]string{"a b": ""}}.Check, "headers"},
		{"http reserved header", HTTPSpec{URL: "http://127.0.0.1", Headers: map[string]string{"shardcron-task": ""}}.Check, "headers"},
		{"http control in value", HTTPSpec{URL: "http://127.0.0.1", Headers: map[string]string{"X": "a\nb"}}.Check, "headers"},
		{"exec ok", ExecSpec{Command: []string{"/bin/true"}, Env: map[string]string{"A": "b"}}.Check, ""},
		{"exec no command", ExecSpec{Command: []string{""}}.Check, "command"},
		{"exec NUL arg", ExecSpec{Command: []string{"/bin/echo", "a\x00"}}.Check, "command"},
		{"exec bad env name", ExecSpec{Command: []string{"/bin/true"}, Env: map[string]string{"A=B": ""}}.Check, "env"},
		{"exec NUL env value", ExecSpec{Command: []string{"/bin/true"}, Env: map[string]string{"A": "\x00"}}.Check, "env"},
		// The fire's own variables come last and win: a task's was ignored.
		{"exec reserved env", ExecSpec{Command: []string{"/bin/true"}, Env: map[string]string{EnvTask: "x"}}.Check, "env"},
		{"handler ok", func() error { return CheckHandlerName("invoice") }, ""},
		{"handler empty", func() error { return CheckHandlerName("") }, "name"},
		{"handler control", func() error { return CheckHandlerName("a\x01") }, "name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.check()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("Check = %v, want a *FieldError on %q wrapping ErrInvalidSpec", err, tc.field)
			}
		})
	}
}

// TestNewHTTP_ReplacesReservedHeaders: the constructor lets the executor's
// own headers through to be replaced, where Check refuses them.
func TestNewHTTP_ReplacesReservedHeaders(t *testing.T) {
	spec := HTTPSpec{URL: "http://127.0.0.1/x", Headers: map[string]string{"Shardcron-Task": "mine"}}
	if _, err := NewHTTP(newTestClient(t), spec); err != nil {
		t.Fatalf("NewHTTP = %v, want nil", err)
	}
}

func TestErrExecDisabled_IsNotAllowed(t *testing.T) {
	if !errors.Is(ErrExecDisabled, ErrNotAllowed) {
		t.Fatal("ErrExecDisabled does not wrap ErrNotAllowed")
	}
}

// TestNewExec_AcceptsReservedEnv: a task stored before Check refused the
// fire's own variables in its env still builds (and fires, with ours).
func TestNewExec_AcceptsReservedEnv(t *testing.T) {
	if _, err := NewExec(ExecSpec{Command: []string{"/bin/true"}, Env: map[string]string{EnvFence: "1"}}); err != nil {
		t.Fatalf("NewExec: %v", err)
	}
}
