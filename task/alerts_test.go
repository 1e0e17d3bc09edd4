package task

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestDecodeTask_Alerts decodes notify, pause_on_failure and capture with
// their defaults, and round-trips them.
func TestDecodeTask_Alerts(t *testing.T) {
	tk, err := DecodeTask([]byte(`{"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"},
		"notify": {"url": "http://127.0.0.1:9/alerts", "headers": {"X-Token": "s"}},
		"pause_on_failure": 5, "capture": {}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := &Notify{On: []NotifyEvent{NotifyFailure, NotifyRecovery}, URL: "http://127.0.0.1:9/alerts", Headers: map[string]string{"X-Token": "s"}}
	if !reflect.DeepEqual(tk.Notify, want) || tk.PauseOnFailure != 5 || *tk.Capture != (Capture{MaxBytes: DefaultCaptureBytes, On: CaptureFailure}) {
		t.Errorf("decoded %+v %+v %d", tk.Notify, tk.Capture, tk.PauseOnFailure)
	}
	if tk.Notify.EventMask() != NotifyEventBit(NotifyFailure)|NotifyEventBit(NotifyRecovery) {
		t.Errorf("mask %b", tk.Notify.EventMask())
	}
	assertRoundTrip(t, tk)

	// A notify block without a url stands for the node's --notify-url.
	if _, err := DecodeTask([]byte(`{"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"}, "notify": {"on": ["misfire"]}}`)); err != nil {
		t.Errorf("notify without url: %v", err)
	}
}

// TestDecodeTask_AlertsInvalid: each bad value is refused naming its field.
func TestDecodeTask_AlertsInvalid(t *testing.T) {
	const base = `"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"}`
	for _, tt := range []struct{ extra, field, reason string }{
		{`"notify": {"on": ["boom"]}`, "notify.on", `unknown event "boom"`},
		{`"notify": {"on": ["failure", "failure"]}`, "notify.on", "listed twice"},
		// An empty list became the default, failure and recovery: the
		// alerts it looked to turn off.
		{`"notify": {"on": []}`, "notify.on", "empty: list the events to alert on"},
		{`"notify": {"on": "failure"}`, "notify.on", "want an array of strings"},
		{`"notify": {"url": "ftp://x/"}`, "notify.url", "absolute http or https URL"},
		{`"notify": {"url": "http://x/", "headers": {"Bad Name": "v"}}`, "notify.headers", "not a valid header name"},
		{`"notify": {"headers": {"X-A": "a\nb"}}`, "notify.headers", "control character"},
		{`"notify": {"headers": {"content-length": "3"}}`, "notify.headers", `"content-length" is set by the HTTP client itself`},
		{`"notify": {"uri": "http://x/"}`, "notify.uri", `did you mean "url"`},
		{`"pause_on_failure": -1`, "pause_on_failure", "not within 0-1000"},
		{`"pause_on_failure": "3"`, "pause_on_failure", "want a whole number"},
		{`"capture": {"max_bytes": 4097}`, "capture.max_bytes", "not within 1-4096"},
		{`"capture": {"max_bytes": -1}`, "capture.max_bytes", "not within 1-4096"},
		{`"capture": {"max_bytes": 0}`, "capture.max_bytes", "0 is not within 1-4096"}, // it kept 1024 bytes
		{`"capture": {"on": "never"}`, "capture.on", `unknown mode "never"`},
		{`"capture": {"size": 1}`, "capture.size", "unknown field"},
	} {
		_, err := DecodeTask([]byte(`{` + base + `, ` + tt.extra + `}`))
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Field != tt.field || !strings.Contains(ve.Reason, tt.reason) {
			t.Errorf("%s: got %v, want %s: ...%s...", tt.extra, err, tt.field, tt.reason)
		}
	}
}
