package task

import (
	"errors"
	"slices"

	"github.com/shardcron/shardcron/engine/executor"
)

// The fields of issue 9's failure alerts and output capture: notify,
// pause_on_failure and capture. They live apart from task.go's fields so
// that their decoding and rules read in one place.

// NotifyEvent is a change of a task's state that a notify block can alert
// on.
type NotifyEvent string

// The notify events.
const (
	// NotifyFailure: a fire failed or timed out after its last attempt
	// while the previous fire had succeeded (or none had ended yet). A task
	// failing on every fire alerts once.
	NotifyFailure NotifyEvent = "failure"
	// NotifyRecovery: a fire succeeded after one or more that failed.
	NotifyRecovery NotifyEvent = "recovery"
	// NotifyMisfire: a fire was released later than the misfire threshold
	// while the previous one was on time.
	NotifyMisfire NotifyEvent = "misfire"
)

// notifyEvents are the events in the order a bit mask numbers them.
var notifyEvents = []NotifyEvent{NotifyFailure, NotifyRecovery, NotifyMisfire}

// Notify says where a task's owner sends alerts, and on which events. The
// owner sends one POST per change of state, after the last retry (the
// payload is in docs/api.md, "Alerts").
type Notify struct {
	// On lists the events to alert on. Default [failure, recovery].
	On []NotifyEvent `json:"on,omitempty"`
	// URL is an absolute http or https URL. Empty: the node's --notify-url;
	// with neither, no alert is sent.
	URL string `json:"url,omitempty"`
	// Headers are added to each alert request, as an http executor's
	// headers, with the same rules. Their values are secrets: never logged.
	Headers map[string]string `json:"headers,omitempty"`
}

// EventMask returns On as a bit mask: bit k is notifyEvents[k].
func (n *Notify) EventMask() uint8 {
	var m uint8
	for _, ev := range n.On {
		if k := slices.Index(notifyEvents, ev); k >= 0 {
			m |= 1 << k
		}
	}
	return m
}

// NotifyEventBit returns the bit of ev in EventMask, 0 for an unknown event.
func NotifyEventBit(ev NotifyEvent) uint8 {
	if k := slices.Index(notifyEvents, ev); k >= 0 {
		return 1 << k
	}
	return 0
}

// CaptureOn says which executions' output is kept.
type CaptureOn string

// The capture modes.
const (
	// CaptureFailure keeps the output of failed and timed-out attempts.
	CaptureFailure CaptureOn = "failure"
	// CaptureAlways keeps the output of every attempt that ran.
	CaptureAlways CaptureOn = "always"
)

// MaxCaptureBytes is the most output a task may capture per execution.
const MaxCaptureBytes = 4096

// DefaultCaptureBytes is capture.max_bytes when left out.
const DefaultCaptureBytes = 1024

// MaxPauseOnFailure is the largest pause_on_failure.
const MaxPauseOnFailure = 1000

// Capture is a task's opt-in output capture: the first MaxBytes of what an
// attempt printed (an exec command's stdout and stderr, an http response's
// body), stored with its execution record under the same retention.
type Capture struct {
	// MaxBytes bounds the output kept per attempt: 1 to 4096, default 1024.
	MaxBytes int `json:"max_bytes"`
	// On is failure (default) or always.
	On CaptureOn `json:"on"`
}

var (
	notifyFields  = []string{"on", "url", "headers"}
	captureFields = []string{"max_bytes", "on"}
)

// decodeAlerts decodes notify, pause_on_failure and capture.
func decodeAlerts(d *objDecoder, t *Task) {
	if n := d.object("notify"); n != nil {
		n.known(notifyFields, nil)
		t.Notify = &Notify{}
		var on []string
		n.strSlice("on", &on)
		if _, ok := n.raw("on"); ok && n.err == nil && len(on) == 0 {
			// [] would read as "no alerts" and become the default's two.
			n.fail("on", "empty: list the events to alert on, of failure, recovery and misfire (leave it out for the default, failure and recovery)")
		}
		for _, ev := range on {
			t.Notify.On = append(t.Notify.On, NotifyEvent(ev))
		}
		n.str("url", &t.Notify.URL)
		n.strMap("headers", &t.Notify.Headers)
		d.adopt(n)
	}
	d.value("pause_on_failure", &t.PauseOnFailure, "a whole number")
	if c := d.object("capture"); c != nil {
		c.known(captureFields, nil)
		t.Capture = &Capture{}
		c.value("max_bytes", &t.Capture.MaxBytes, "a whole number")
		if _, ok := c.raw("max_bytes"); ok && c.err == nil && t.Capture.MaxBytes == 0 {
			// 0 would read as "capture nothing" and keep the default's bytes.
			c.fail("max_bytes", "0 is not within 1-%d (leave it out for the default, %d)", MaxCaptureBytes, DefaultCaptureBytes)
		}
		var on string
		c.str("on", &on)
		t.Capture.On = CaptureOn(on)
		d.adopt(c)
	}
}

// checkAlerts applies the defaults of notify and capture and their rules.
func (t *Task) checkAlerts() error {
	if n := t.Notify; n != nil {
		if len(n.On) == 0 {
			n.On = []NotifyEvent{NotifyFailure, NotifyRecovery}
		}
		for k, ev := range n.On {
			if !slices.Contains(notifyEvents, ev) {
				return Invalid("notify.on", "unknown event %q (want failure, recovery or misfire)", ev)
			}
			if slices.Contains(n.On[:k], ev) {
				return Invalid("notify.on", "%q is listed twice", ev)
			}
		}
		if len(n.Headers) == 0 {
			n.Headers = nil
		}
		// The rules of an http executor's url and headers; an empty url
		// stands for the node's --notify-url.
		u := n.URL
		if u == "" {
			u = "http://notify-url.invalid/"
		}
		err := executor.HTTPSpec{URL: u, Headers: n.Headers}.Check()
		if fe := (*executor.FieldError)(nil); errors.As(err, &fe) {
			return Invalid("notify."+fe.Field, "%s", fe.Reason)
		} else if err != nil {
			return err
		}
		if err := checkClientHeaders("notify.headers", n.Headers); err != nil {
			return err
		}
	}
	if t.PauseOnFailure < 0 || t.PauseOnFailure > MaxPauseOnFailure {
		return Invalid("pause_on_failure", "%d is not within 0-%d (0: never pause)", t.PauseOnFailure, MaxPauseOnFailure)
	}
	if c := t.Capture; c != nil {
		if c.MaxBytes == 0 {
			c.MaxBytes = DefaultCaptureBytes
		}
		if c.On == "" {
			c.On = CaptureFailure
		}
		if c.MaxBytes < 1 || c.MaxBytes > MaxCaptureBytes {
			return Invalid("capture.max_bytes", "%d is not within 1-%d", c.MaxBytes, MaxCaptureBytes)
		}
		if c.On != CaptureFailure && c.On != CaptureAlways {
			return Invalid("capture.on", "unknown mode %q (want failure or always)", c.On)
		}
	}
	return nil
}
