package api

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// TestDashboard_Headers: the page's policy runs its own script alone, by
// hash (the browser test checks that it runs, and that an injected inline
// handler does not), and every JSON answer forbids sniffing it as HTML:
// an error quotes a task id, which may hold markup.
func TestDashboard_Headers(t *testing.T) {
	rec := httptest.NewRecorder()
	(&Server{}).dashboard(rec, httptest.NewRequest("GET", "/", nil))
	page, h := rec.Body.String(), rec.Header()
	csp := h.Get("Content-Security-Policy")
	_, script, _ := strings.Cut(page, "<script>")
	script, _, _ = strings.Cut(script, "</script>")
	sum := sha256.Sum256([]byte(script))
	for _, want := range []string{"default-src 'none'", "script-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "';",
		"connect-src 'self'", "base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("Content-Security-Policy %q lacks %q", csp, want)
		}
	}
	if _, scripts, _ := strings.Cut(csp, "script-src"); strings.Contains(strings.Split(scripts, ";")[0], "unsafe") {
		t.Errorf("Content-Security-Policy %q lets inline scripts run", csp)
	}
	for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"} {
		if h.Get(k) != v {
			t.Errorf("%s: %q, want %q", k, h.Get(k), v)
		}
	}
	if strings.Count(page, "<script") != 1 || regexp.MustCompile(`<[^>]+\son[a-z]+=`).MatchString(page) {
		t.Error("the page has another script or an inline handler, which the policy does not run")
	}

	rec = httptest.NewRecorder()
	writeError(rec, http.StatusNotFound, "task %q not found", `<img src=x onerror=alert(1)>`)
	if got := rec.Header().Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("a JSON answer's X-Content-Type-Options: %q, want nosniff", got)
	}
	rec = httptest.NewRecorder()
	newJSONStream(rec).begin(`{"tasks":[`) // a page of tasks, an export
	if got := rec.Header().Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("a streamed answer's X-Content-Type-Options: %q, want nosniff", got)
	}
}
