package task

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/shardcron/shardcron/engine/executor"
)

// kind is one executor type: the JSON fields it takes, the rules they obey
// and how a node builds its executor. Validation, DecodeTask, the error
// that names a field given to the wrong type (and the type it belongs to)
// and engine's newProfile all derive from kinds.
//
// To add an executor type: its fields on Executor, one entry here, and the
// fields in engine's appendProfileKey (engine's TestProfileKey_CoversFireFields
// fails until they are). Its field rules and constructor belong in package
// executor, next to the executor.
type kind struct {
	typ    ExecutorType
	fields []kindField
	// check applies the kind's field rules, returning an
	// *executor.FieldError or a *ValidationError; nil: none.
	check func(e *Executor) error
	// build returns the executor of a validated task.
	build func(e *Executor, sh *executor.Shared) (executor.Executor, error)
}

// kindField is one JSON field of a kind.
type kindField struct {
	name   string
	set    func(e *Executor) bool // the field is given
	decode func(d *objDecoder, e *Executor)
}

var kinds = []kind{
	{
		typ: ExecutorHTTP,
		fields: []kindField{
			{"url", func(e *Executor) bool { return e.URL != "" }, func(d *objDecoder, e *Executor) { d.str("url", &e.URL) }},
			{"method", func(e *Executor) bool { return e.Method != "" }, func(d *objDecoder, e *Executor) { d.str("method", &e.Method) }},
			{"headers", func(e *Executor) bool { return e.Headers != nil }, func(d *objDecoder, e *Executor) { d.strMap("headers", &e.Headers) }},
			{"body", func(e *Executor) bool { return e.Body != "" }, func(d *objDecoder, e *Executor) { d.str("body", &e.Body) }},
		},
		check: func(e *Executor) error {
			if err := e.httpSpec(nil).Check(); err != nil {
				return err
			}
			return checkClientHeaders("executor.headers", e.Headers)
		},
		build: func(e *Executor, sh *executor.Shared) (executor.Executor, error) {
			return executor.NewHTTP(sh.HTTP, e.httpSpec(sh))
		},
	},
	{
		typ: ExecutorExec,
		fields: []kindField{
			{"command", func(e *Executor) bool { return e.Command != nil }, func(d *objDecoder, e *Executor) { d.strSlice("command", &e.Command) }},
			{"env", func(e *Executor) bool { return e.Env != nil }, func(d *objDecoder, e *Executor) { d.strMap("env", &e.Env) }},
		},
		check: func(e *Executor) error { return executor.ExecSpec{Command: e.Command, Env: e.Env}.Check() },
		build: func(e *Executor, sh *executor.Shared) (executor.Executor, error) {
			if !sh.AllowExec {
				return nil, executor.ErrExecDisabled
			}
			return executor.NewExec(executor.ExecSpec{Command: e.Command, Env: e.Env, Allow: sh.ExecAllow})
		},
	},
	{
		typ: ExecutorHandler,
		fields: []kindField{
			{"name", func(e *Executor) bool { return e.Name != "" }, func(d *objDecoder, e *Executor) { d.str("name", &e.Name) }},
			{"payload", func(e *Executor) bool { return e.Payload != nil }, func(d *objDecoder, e *Executor) {
				if raw, ok := d.raw("payload"); ok {
					e.Payload = raw
				}
			}},
		},
		check: func(e *Executor) error {
			if err := executor.CheckHandlerName(e.Name); err != nil {
				return err
			}
			if e.Payload != nil {
				// The form json.Marshal writes, so that the task round-trips.
				p, err := json.Marshal(e.Payload)
				if err != nil {
					return Invalid("executor.payload", "not valid JSON")
				}
				e.Payload = p
			}
			return nil
		},
		build: func(e *Executor, sh *executor.Shared) (executor.Executor, error) {
			return executor.NewHandler(sh.Handlers, e.Name, e.Payload), nil
		},
	},
	{
		typ:   ExecutorNoop,
		build: func(*Executor, *executor.Shared) (executor.Executor, error) { return executor.Noop, nil },
	},
}

// httpSpec returns the executor's http fields; sh, when given, adds the
// node's user agent. The method is canonical here too, for tasks stored
// before Validate made it so.
func (e *Executor) httpSpec(sh *executor.Shared) executor.HTTPSpec {
	s := executor.HTTPSpec{URL: e.URL, Method: canonicalMethod(e.Method), Headers: e.Headers, Body: e.Body}
	if sh != nil {
		s.UserAgent = sh.UserAgent
	}
	return s
}

// clientHeaders are the request headers Go's HTTP client controls itself,
// with why: it drops them from a request's headers (the framing, which it
// derives from the body, over HTTP/1.1 and HTTP/2 alike), or, for the
// connection's own (hop-by-hop) headers, sends them over HTTP/1.1 but
// drops them over HTTP/2, where some values fail the request. A task that
// sets one would not get what it asked for, so validation refuses it, as
// it refuses the headers the executor sets (executor.HTTPSpec.Check). A
// task stored before this rule still loads and fires (Build does not
// validate): Go's client then drops the header as before. Host is not
// among them: the executor sends it as the request's host.
var clientHeaders = map[string]string{
	"Content-Length":    "is set by the HTTP client itself, from the body",
	"Transfer-Encoding": "is set by the HTTP client itself, from the body",
	"Trailer":           "is set by the HTTP client itself, from the request's trailers (a task has none)",
	"Connection":        "is a header of the connection (hop-by-hop), which the HTTP client manages itself",
	"Keep-Alive":        "is a header of the connection (hop-by-hop), which the HTTP client manages itself",
	"Proxy-Connection":  "is a header of the connection (hop-by-hop), which the HTTP client manages itself",
	"Te":                "is a header of the connection (hop-by-hop), which the HTTP client manages itself",
	"Upgrade":           "is a header of the connection (hop-by-hop), which the HTTP client manages itself",
}

// checkClientHeaders refuses, in name order, a header of headers that Go's
// HTTP client controls itself (clientHeaders); field names the field.
func checkClientHeaders(field string, headers map[string]string) error {
	for _, name := range slices.Sorted(maps.Keys(headers)) {
		if why, ok := clientHeaders[http.CanonicalHeaderKey(name)]; ok {
			return Invalid(field, "%q %s: a task cannot set it", name, why)
		}
	}
	return nil
}

// Tables derived from kinds.
var (
	// kindTypes lists the types for error messages: "http, exec, handler or noop".
	kindTypes = func() string {
		var names []string
		for _, k := range kinds {
			names = append(names, string(k.typ))
		}
		return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	}()
	// executorFieldNames are the executor object's JSON fields.
	executorFieldNames = func() []string {
		names := []string{"type"}
		for _, k := range kinds {
			for _, f := range k.fields {
				names = append(names, f.name)
			}
		}
		return names
	}()
)

// Build returns the executor of a validated task's executor, built with
// what the node's executors share. An exec executor on a node that does not
// allow exec is an error wrapping executor.ErrNotAllowed, as is a command
// or host the node's allow-lists leave out.
func (e *Executor) Build(sh *executor.Shared) (executor.Executor, error) {
	k, ok := kindOf(e.Type)
	if !ok {
		return nil, fmt.Errorf("unknown executor %q", e.Type)
	}
	return k.build(e, sh)
}

// kindOf returns the kind of type typ.
func kindOf(typ ExecutorType) (*kind, bool) {
	for i := range kinds {
		if kinds[i].typ == typ {
			return &kinds[i], true
		}
	}
	return nil, false
}

func (e *Executor) validate() error {
	k, ok := kindOf(e.Type)
	switch {
	case e.Type == "":
		return Invalid("executor.type", "required (want %s)", kindTypes)
	case !ok:
		return Invalid("executor.type", "unknown executor %q (want %s)", e.Type, kindTypes)
	}
	// Refuse fields of other types: a url on a noop task is a mistake the
	// user wants to hear about, not a silently dead setting.
	for _, other := range kinds {
		if other.typ == e.Type {
			continue
		}
		for _, f := range other.fields {
			if f.set(e) {
				return Invalid("executor."+f.name, "not allowed with executor type %q (%s is for %s)", e.Type, f.name, other.typ)
			}
		}
	}
	if k.check == nil {
		return nil
	}
	err := k.check(e)
	if fe := (*executor.FieldError)(nil); errors.As(err, &fe) {
		return Invalid("executor."+fe.Field, "%s", fe.Reason)
	}
	return err
}

// decodeExecutor decodes the executor object's fields.
func decodeExecutor(d *objDecoder, e *Executor) {
	d.known(executorFieldNames, nil)
	var typ string
	d.str("type", &typ)
	e.Type = ExecutorType(typ)
	for _, k := range kinds {
		for _, f := range k.fields {
			f.decode(d, e)
		}
	}
}
