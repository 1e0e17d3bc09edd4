package executor

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// FieldError is a spec that breaks an executor's rules. Field names the
// offending field as a task's executor JSON names it ("url", "headers",
// "command"); Reason says why, in words a task author can act on. It wraps
// ErrInvalidSpec.
//
// These rules are the only copy: task validation applies them through the
// Check methods, and the constructors apply them again, so a spec that
// validated builds.
type FieldError struct {
	Field  string
	Reason string
}

// Error returns "executor: invalid spec: field: reason".
func (e *FieldError) Error() string { return ErrInvalidSpec.Error() + ": " + e.Field + ": " + e.Reason }

// Unwrap returns ErrInvalidSpec.
func (e *FieldError) Unwrap() error { return ErrInvalidSpec }

func fieldError(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Check applies the rules of an http task's fields, returning the first
// violation as a *FieldError: url is an absolute http or https URL; method
// (empty: POST) an HTTP token; header names HTTP tokens other than the ones
// the executor sets itself (Idempotency-Key, Shardcron-*), header values
// free of control characters but tab. Headers are checked in name order.
func (s HTTPSpec) Check() error { return s.check(true) }

// check is Check; NewHTTP passes strict false, letting the executor's own
// headers through to be replaced rather than refused.
func (s HTTPSpec) check(strict bool) error {
	if s.URL == "" {
		return fieldError("url", "required for executor type http")
	}
	u, err := url.Parse(s.URL)
	if err != nil {
		return fieldError("url", "%q is not a valid URL", s.URL)
	}
	if sc := strings.ToLower(u.Scheme); sc != "http" && sc != "https" || u.Host == "" {
		return fieldError("url", "want an absolute http or https URL such as \"https://hooks.example.com/invoice\", got %q", s.URL)
	}
	// A port no connection can reach is a task that can never succeed.
	// Strict only: a task stored before this check still loads.
	if p := u.Port(); strict && p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fieldError("url", "port %s of %q: want 1 to 65535", p, s.URL)
		}
	}
	if strict && u.Hostname() == "" {
		return fieldError("url", "%q names no host", s.URL)
	}
	if method := s.Method; method != "" && !isToken(method) {
		return fieldError("method", "%q is not an HTTP method", method)
	}
	for _, name := range slices.Sorted(maps.Keys(s.Headers)) {
		if !isToken(name) {
			return fieldError("headers", "%q is not a valid header name", name)
		}
		if strict && reserved(http.CanonicalHeaderKey(name)) {
			return fieldError("headers", "%q is set by the executor itself", name)
		}
		for _, r := range s.Headers[name] {
			if r != '\t' && unicode.IsControl(r) {
				return fieldError("headers", "value of %q contains the control character %U", name, r)
			}
		}
	}
	return nil
}

// Check applies the rules of an exec task's fields, returning the first
// violation as a *FieldError: a command of at least argv[0], no NUL byte in
// an argument, variable names non-empty without '=' or NUL, values without
// NUL. These are what the kernel or os/exec would refuse at each fire. The
// allow-list is not consulted: it is the node's, not the task's. A
// variable the executor sets itself (SHARDCRON_TASK, ...) is refused too:
// the fire's value would replace the task's.
func (s ExecSpec) Check() error { return s.check(true) }

// check is Check; NewExec passes strict false, letting a task stored
// before the executor's own variables were refused build and fire (with
// the fire's values).
func (s ExecSpec) check(strict bool) error {
	if len(s.Command) == 0 || s.Command[0] == "" {
		return fieldError("command", "required for executor type exec: the argv to run, e.g. [\"/usr/bin/backup\", \"--full\"]")
	}
	for i, arg := range s.Command {
		if strings.IndexByte(arg, 0) >= 0 {
			return fieldError("command", "argument %d contains a NUL byte", i)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(s.Env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fieldError("env", "%q is not a valid variable name", k)
		}
		if strings.IndexByte(s.Env[k], 0) >= 0 {
			return fieldError("env", "value of %q contains a NUL byte", k)
		}
		if strict && slices.Contains(fireVars, k) {
			return fieldError("env", "%q is set by the executor itself", k)
		}
	}
	return nil
}

// MaxHandlerName is the longest handler name, in bytes.
const MaxHandlerName = 256

// CheckHandlerName applies the rules of a handler task's name, returning
// the first violation as a *FieldError: 1 to MaxHandlerName bytes of UTF-8
// without control characters.
func CheckHandlerName(name string) error {
	switch {
	case name == "":
		return fieldError("name", "required for executor type handler")
	case len(name) > MaxHandlerName:
		return fieldError("name", "%d bytes, more than %d", len(name), MaxHandlerName)
	case !utf8.ValidString(name):
		return fieldError("name", "not valid UTF-8")
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return fieldError("name", "contains the control character %U", r)
		}
	}
	return nil
}

// Shared is what the executors of one node share: what building one takes
// beside the task's own fields.
type Shared struct {
	// HTTP is the client of every http executor (see NewClient).
	HTTP *http.Client
	// UserAgent is HTTPSpec.UserAgent; empty: the default.
	UserAgent string
	// Handlers are the node's in-process handlers.
	Handlers *Handlers
	// AllowExec enables the exec executor; without it, building one fails
	// with ErrExecDisabled.
	AllowExec bool
	// ExecAllow is ExecSpec.Allow; nil: every command.
	ExecAllow *PathAllow
}

// ErrExecDisabled is the error of building an exec executor on a node that
// does not allow exec (Shared.AllowExec false). It wraps ErrNotAllowed.
var ErrExecDisabled error = execDisabled{}

type execDisabled struct{}

func (execDisabled) Error() string {
	return "the exec executor is disabled on this node (start it with --allow-exec)"
}

func (execDisabled) Is(target error) bool { return target == ErrNotAllowed }
