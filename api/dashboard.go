package api

import (
	"embed"
	"net/http"
)

// dashboardFS holds the dashboard: one page with its CSS and plain JS
// inline, fetching the API of the node that serves it. No external assets.
//
//go:embed dashboard/index.html
var dashboardFS embed.FS

// dashboard: GET /, the HTML page. It is open (no token): it holds no data;
// its script sends the token the user enters with each API request.
func (s *Server) dashboard(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy",
		"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'")
	// embed guarantees the file at build time; ReadFile only copies it.
	page, err := dashboardFS.ReadFile("dashboard/index.html")
	if err != nil {
		writeError(w, http.StatusInternalServerError, "dashboard missing from the build: %v", err)
		return
	}
	_, _ = w.Write(page)
}
