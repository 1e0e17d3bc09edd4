package executor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// ErrNotAllowed is wrapped by the error of a command or a host that the
// node's allow-list (PathAllow, HostAllow) leaves out: at construction when
// the spec already says it, at the fire otherwise.
var ErrNotAllowed = errors.New("executor: not allowed on this node")

// PathAllow is the allow-list of the exec executor: the path prefixes under
// which the commands it runs must lie. A nil *PathAllow allows every
// command.
//
// A prefix matches whole path elements: /opt/jobs allows /opt/jobs/backup
// but not /opt/jobsx/backup. The command is checked as the path that is
// executed: argv[0] when it contains a slash (which must then be absolute),
// or what the node's PATH resolves a bare name to, at each fire. Symbolic
// links are not followed: whoever can write under a prefix decides what runs.
type PathAllow struct {
	prefixes []string // cleaned, absolute
}

// ParsePathAllow returns the allow-list of entries, each an absolute path;
// an empty list allows nothing, and is an error so that a typo cannot turn
// into "everything".
func ParsePathAllow(entries []string) (*PathAllow, error) {
	if len(entries) == 0 {
		return nil, errors.New("executor: exec allow-list: no path prefix")
	}
	a := &PathAllow{}
	for _, e := range entries {
		if !filepath.IsAbs(e) || strings.IndexByte(e, 0) >= 0 {
			return nil, fmt.Errorf("executor: exec allow-list: %q is not an absolute path", e)
		}
		a.prefixes = append(a.prefixes, filepath.Clean(e))
	}
	return a, nil
}

// String lists the prefixes, comma-separated.
func (a *PathAllow) String() string { return strings.Join(a.prefixes, ",") }

// allows reports whether the absolute path p lies under a prefix.
func (a *PathAllow) allows(p string) bool {
	p = filepath.Clean(p)
	for _, pre := range a.prefixes {
		if p == pre || pre == "/" || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	return false
}

// CheckCommand refuses, with an error wrapping ErrNotAllowed, an argv[0]
// that cannot be allowed whatever the fire: a path outside every prefix, or
// a relative path with a slash (which would depend on the node's working
// directory). A bare name passes: it is resolved and checked at each fire.
func (a *PathAllow) CheckCommand(argv0 string) error {
	if a == nil || !strings.Contains(argv0, "/") {
		return nil
	}
	if !filepath.IsAbs(argv0) {
		return fmt.Errorf("%w: exec: command %q is a relative path; the node's exec allow-list (%s) needs an absolute one", ErrNotAllowed, argv0, a)
	}
	if !a.allows(argv0) {
		return a.refuse(argv0)
	}
	return nil
}

// resolve returns the path a fire executes for argv0, or an error wrapping
// ErrNotAllowed when it lies outside the prefixes.
func (a *PathAllow) resolve(argv0 string) (string, error) {
	if err := a.CheckCommand(argv0); err != nil {
		return "", err
	}
	if strings.Contains(argv0, "/") {
		return argv0, nil
	}
	p, err := exec.LookPath(argv0)
	if err != nil {
		return "", startError(argv0, err)
	}
	if p, err = filepath.Abs(p); err != nil {
		return "", fmt.Errorf("exec: %w", err)
	}
	if !a.allows(p) {
		return "", fmt.Errorf("%w: exec: command %q resolves to %s, outside the node's exec allow-list (%s)", ErrNotAllowed, argv0, p, a)
	}
	return p, nil
}

func (a *PathAllow) refuse(p string) error {
	return fmt.Errorf("%w: exec: command %s is outside the node's exec allow-list (%s)", ErrNotAllowed, p, a)
}

// CheckEnv refuses, with an error wrapping ErrNotAllowed, a task variable
// that makes an allowed command run code from outside the list: PATH
// (where an allowed script finds its own commands), the dynamic loader's
// variables (a library preloaded into an allowed binary), and the start-up
// hooks of the common shells and interpreters. What the list bounds is the
// code that runs; a program of the list that reads other variables to pick
// what it runs is for the node's operator to vet.
func (a *PathAllow) CheckEnv(env map[string]string) error {
	if a == nil {
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if runsOtherCode(k) {
			return fmt.Errorf("%w: exec: env %s can make the command run code outside the node's exec allow-list (%s); set it in the allowed program instead", ErrNotAllowed, k, a)
		}
	}
	return nil
}

// runsOtherCode reports whether a variable of that name makes a program,
// its dynamic loader or its interpreter load or run other code.
func runsOtherCode(name string) bool {
	for _, p := range []string{"LD_", "DYLD_", "PYTHON", "PERL", "RUBY", "NODE_", "GCONV_", "LUA_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	switch name {
	case "PATH", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS",
		"JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "LOCPATH":
		return true
	}
	return false
}

// HostAllow is the allow-list of the HTTP executor: the hosts its requests
// may reach. A nil *HostAllow allows every host.
//
// An entry is a host name ("api.example.com", matched case-insensitively),
// a domain wildcard ("*.example.com": its subdomains, not itself), an IP
// address, or a CIDR ("10.1.0.0/16"). A request is allowed when the URL's
// host matches a name or wildcard, or when every address the node dials for
// it lies in an IP or CIDR entry: a host name not listed is resolved at the
// fire and only its allowed addresses are dialed, so a DNS answer that
// changes between the check and the dial cannot reach another address.
// Behind a proxy (HTTPS_PROXY...) the node dials the proxy, which must then
// be allowed, and the URL's host is checked by name or IP literal only: a
// host name that no name entry matches is refused, since the proxy, not
// the node, resolves it.
type HostAllow struct {
	entries  []string
	names    map[string]bool
	suffixes []string // ".example.com" for "*.example.com"
	nets     []netip.Prefix
}

// ParseHostAllow returns the allow-list of entries (see HostAllow); an
// empty list is an error, so that a typo cannot turn into "everything".
func ParseHostAllow(entries []string) (*HostAllow, error) {
	if len(entries) == 0 {
		return nil, errors.New("executor: http allow-list: no host")
	}
	a := &HostAllow{names: map[string]bool{}}
	for _, e := range entries {
		a.entries = append(a.entries, e)
		if p, err := netip.ParsePrefix(e); err == nil {
			a.nets = append(a.nets, p.Masked())
			continue
		}
		if ip, err := netip.ParseAddr(e); err == nil {
			ip = ip.Unmap()
			a.nets = append(a.nets, netip.PrefixFrom(ip, ip.BitLen()))
			continue
		}
		name := strings.ToLower(strings.TrimSuffix(e, "."))
		wild := strings.HasPrefix(name, "*.")
		if wild {
			name = name[2:]
		}
		if !validHostname(name) {
			return nil, fmt.Errorf("executor: http allow-list: %q is not a host name, *.domain, IP address or CIDR", e)
		}
		if wild {
			a.suffixes = append(a.suffixes, "."+name)
		} else {
			a.names[name] = true
		}
	}
	return a, nil
}

// validHostname reports whether s is a DNS name: dot-separated labels of
// letters, digits, '-' and '_'.
func validHostname(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// String lists the entries, comma-separated.
func (a *HostAllow) String() string { return strings.Join(a.entries, ",") }

// allowsName reports whether host (no port) matches a name or wildcard.
func (a *HostAllow) allowsName(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if a.names[host] {
		return true
	}
	for _, s := range a.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

// allowsIP reports whether ip lies in an IP or CIDR entry.
func (a *HostAllow) allowsIP(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, p := range a.nets {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// CheckURL refuses, with an error wrapping ErrNotAllowed, a URL whose host
// cannot be allowed whatever DNS answers: an IP literal outside the IP and
// CIDR entries, or a name matching no name entry when there are no IP or
// CIDR entries. Other hosts are checked when dialed. A URL that does not
// parse passes: NewHTTP explains what is wrong with it.
func (a *HostAllow) CheckURL(rawURL string) error {
	if a == nil {
		return nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil
	}
	return a.checkHost(u.Hostname())
}

func (a *HostAllow) checkHost(host string) error {
	if a.allowsName(host) {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if a.allowsIP(ip) {
			return nil
		}
		return a.refuse(host)
	}
	if len(a.nets) == 0 {
		return a.refuse(host)
	}
	return nil
}

// checkProxied refuses a host that a proxy would resolve for the node: a
// name matching no name entry. An IP literal was checked by checkHost.
func (a *HostAllow) checkProxied(host string) error {
	if _, err := netip.ParseAddr(host); err == nil || a.allowsName(host) {
		return nil
	}
	return fmt.Errorf("%w: http: host %q is reached through a proxy (HTTP_PROXY, HTTPS_PROXY), which resolves it: "+
		"the node cannot check its addresses against the IPs and CIDRs of its http allow-list (%s); list the name", ErrNotAllowed, host, a)
}

func (a *HostAllow) refuse(host string) error {
	return fmt.Errorf("%w: http: host %q is outside the node's http allow-list (%s)", ErrNotAllowed, host, a)
}

// dialContext returns a DialContext that dials only allowed addresses: a
// listed name as the dialer would, any other host through its resolved
// addresses that lie in the IP and CIDR entries.
func (a *HostAllow) dialContext(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		if a.allowsName(host) {
			return d.DialContext(ctx, network, addr)
		}
		var ips []netip.Addr
		if ip, err := netip.ParseAddr(host); err == nil {
			ips = []netip.Addr{ip}
		} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
			return nil, err
		}
		var errs []error
		for _, ip := range ips {
			if !a.allowsIP(ip) {
				continue
			}
			c, err := d.DialContext(ctx, network, net.JoinHostPort(ip.Unmap().String(), port))
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		if errs == nil {
			return nil, fmt.Errorf("%w: http: host %q resolves to %v, outside the node's http allow-list (%s)", ErrNotAllowed, host, ips, a)
		}
		return nil, errors.Join(errs...)
	}
}
