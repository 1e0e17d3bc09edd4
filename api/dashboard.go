package api

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"net/http"
	"strings"
	"sync"
)

// dashboardFS holds the dashboard: one page with its CSS and plain JS
// inline, fetching the API of the node that serves it. No external assets.
//
//go:embed dashboard/index.html
var dashboardFS embed.FS

// dashboardPage is the page and its Content-Security-Policy, read once.
var dashboardPage = sync.OnceValues(func() ([]byte, string) {
	// embed guarantees the file at build time; ReadFile only copies it.
	page, _ := dashboardFS.ReadFile("dashboard/index.html")
	return page, dashboardCSP(page)
})

// dashboardCSP is the page's policy: nothing but its own inline scripts,
// named by their hashes, runs. 'unsafe-inline' would let any markup that
// reached the page run an inline handler (onerror=...); the page sets
// every value it shows as text, and the policy holds should one slip.
// Styles stay inline (the page's own), no image, font, frame or form
// target loads, the page fetches only its node, and no site frames it.
func dashboardCSP(page []byte) string {
	var hashes []string
	rest := page
	for {
		_, after, ok := bytes.Cut(rest, []byte("<script>"))
		if !ok {
			break
		}
		script, tail, _ := bytes.Cut(after, []byte("</script>"))
		sum := sha256.Sum256(script)
		hashes = append(hashes, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
		rest = tail
	}
	return "default-src 'none'; script-src " + strings.Join(hashes, " ") +
		"; style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}

// dashboard: GET /, the HTML page. It is open (no token): it holds no data;
// its script sends the token the user enters with each API request.
func (s *Server) dashboard(w http.ResponseWriter, r *http.Request) {
	page, csp := dashboardPage()
	if len(page) == 0 {
		writeError(w, http.StatusInternalServerError, "dashboard missing from the build")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", csp)
	_, _ = w.Write(page)
}
