package api

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// crossOrigin refuses the writes a browser sends for a page of another
// origin (Sec-Fetch-Site, or an Origin that is not the Host): a page's
// form or no-cors fetch of text/plain reaches the API without a preflight,
// and a node without a token would take it as the operator's own (its
// body is read as JSON whatever its Content-Type). GET and HEAD pass: a
// page cannot read the answer of another origin, which the API never
// shares (no CORS headers). Requests without either header, those of
// programs, pass.
var crossOrigin http.CrossOriginProtection

// browserRefusal says why a request a browser may have sent for a page of
// another origin is refused, or "" to serve it. Besides crossOrigin's
// writes: a node without an auth token that a request reached on a
// loopback address serves only a Host of localhost (or *.localhost) or an
// IP address. A page whose host name the attacker's DNS re-pointed at
// 127.0.0.1 (DNS rebinding) is of the same origin as the API it calls, so
// only the Host it sends, its own name, gives it away; with a token it has
// none to send.
func browserRefusal(r *http.Request, tokenless bool) string {
	if err := crossOrigin.Check(r); err != nil {
		return "refused a write a browser sent for a page of another origin (" + err.Error() +
			"): the API takes writes from programs (no Origin) and from this node's dashboard"
	}
	if !tokenless || !onLoopback(r) || localHost(r.Host) {
		return ""
	}
	return "this node has no --auth-token and serves its loopback address only to a Host of localhost, " +
		"*.localhost or an IP address, not " + r.Host + " (a web page whose name was pointed at this machine, DNS rebinding?); " +
		"reach it as localhost or 127.0.0.1, or give the node an --auth-token"
}

// onLoopback reports whether r came in on a loopback address of the node.
func onLoopback(r *http.Request) bool {
	a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	ap, err := netip.ParseAddrPort(a.String())
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// localHost reports whether the Host header h names no host a web site's
// DNS could point here: none, an IP address, or localhost and its
// subdomains, which browsers resolve to loopback themselves.
func localHost(h string) bool {
	host := h
	if hp, _, err := net.SplitHostPort(h); err == nil {
		host = hp
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return host == "" || host == "localhost" || strings.HasSuffix(host, ".localhost")
}
