package executor

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestOutput_KeepsTheStart(t *testing.T) {
	o := NewOutput(5)
	for _, s := range []string{"ab", "cd", "ef", "gh"} {
		if n, err := o.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v; want all written, no error", s, n, err)
		}
	}
	if got := o.String(); got != "abcde" || !o.Truncated() {
		t.Errorf("kept %q (truncated %v), want %q, truncated", got, o.Truncated(), "abcde")
	}
	cut := NewOutput(4)
	cut.Write([]byte("ab\xc3\xa9\xff")) // "abé" fills the 4 bytes; the invalid byte after it is dropped
	if got := cut.String(); got != "abé" {
		t.Errorf("kept %q, want %q", got, "abé")
	}
	bad := NewOutput(3)
	bad.Write([]byte("a\xe2\x82")) // a rune cut by the bound
	if got := bad.String(); got != "a\uFFFD" {
		t.Errorf("kept %q, want %q", got, "a\uFFFD")
	}
}

// TestHTTP_CapturesTheBody: with Fire.Output, an answer's body is kept,
// failed or not; without it, nothing is.
func TestHTTP_CapturesTheBody(t *testing.T) {
	code := http.StatusInternalServerError
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(code)
		w.Write([]byte("stack trace: " + strings.Repeat("x", 1000)))
	}))
	defer srv.Close()
	e := mustHTTP(t, newTestClient(t), HTTPSpec{URL: srv.URL})
	for _, c := range []int{http.StatusInternalServerError, http.StatusOK} {
		code = c
		f := testFire()
		f.Output = NewOutput(16)
		err := e.Execute(context.Background(), f)
		if (err == nil) != (c == http.StatusOK) {
			t.Fatalf("status %d: %v", c, err)
		}
		if got := f.Output.String(); got != "stack trace: xxx" {
			t.Errorf("status %d: captured %q", c, got)
		}
		if se, ok := err.(*StatusError); ok && !strings.HasPrefix(se.Body, "stack trace: xxx") {
			t.Errorf("the error's body %q lost its start to the capture", se.Body)
		}
	}
}
