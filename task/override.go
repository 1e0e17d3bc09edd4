package task

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// MaxOverrideSize is the largest override of one triggered fire, in bytes
// of its body or payload.
const MaxOverrideSize = 16 << 10

// Override replaces, for one triggered fire, what the task's executor
// sends: Body the HTTP request body of an http task, Payload the payload of
// a handler task. A nil field keeps the task's own. It travels with the
// trigger, in its etcd key's value, to the owner.
type Override struct {
	Body    *string         `json:"body,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Empty reports whether o overrides nothing.
func (o *Override) Empty() bool { return o == nil || o.Body == nil && o.Payload == nil }

// Check refuses (*ValidationError) an override that t's executor cannot
// take, or too large; it compacts the payload.
func (o *Override) Check(t *Task) error {
	if o.Body != nil {
		if t.Executor.Type != ExecutorHTTP {
			return Invalid("body", "task %q runs a %s executor: only an http task takes a body", t.ID, t.Executor.Type)
		}
		if len(*o.Body) > MaxOverrideSize {
			return Invalid("body", "%d bytes, more than the limit of %d", len(*o.Body), MaxOverrideSize)
		}
		if !utf8.ValidString(*o.Body) {
			return Invalid("body", "not valid UTF-8")
		}
	}
	if o.Payload != nil {
		if t.Executor.Type != ExecutorHandler {
			return Invalid("payload", "task %q runs a %s executor: only a handler task takes a payload", t.ID, t.Executor.Type)
		}
		if len(o.Payload) > MaxOverrideSize {
			return Invalid("payload", "%d bytes, more than the limit of %d", len(o.Payload), MaxOverrideSize)
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, o.Payload); err != nil {
			return Invalid("payload", "not a JSON value: %v", err)
		}
		o.Payload = buf.Bytes()
	}
	return nil
}
