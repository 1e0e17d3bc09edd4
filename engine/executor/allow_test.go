//go:build unix

package executor

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseAllow_Refuses(t *testing.T) {
	for _, e := range [][]string{nil, {"relative/bin"}, {"/ok", "bin"}} {
		if _, err := ParsePathAllow(e); err == nil {
			t.Errorf("ParsePathAllow(%q): no error", e)
		}
	}
	for _, e := range [][]string{nil, {"http://x"}, {"a..b"}, {"*."}, {"10.0.0.0/33"}, {"host:80"}} {
		if _, err := ParseHostAllow(e); err == nil {
			t.Errorf("ParseHostAllow(%q): no error", e)
		}
	}
}

func TestPathAllow_CheckCommand(t *testing.T) {
	a, err := ParsePathAllow([]string{"/opt/jobs/", "/srv/bin"})
	if err != nil {
		t.Fatal(err)
	}
	for argv0, ok := range map[string]bool{
		"/opt/jobs/backup": true, "/opt/jobs": true, "/srv/bin/x/y": true, "name": true, // names: at the fire
		"/opt/jobsx/backup": false, "/opt/jobs/../../bin/sh": false, "/bin/sh": false, "./jobs/x": false, "jobs/x": false,
	} {
		err := a.CheckCommand(argv0)
		if (err == nil) != ok || err != nil && !errors.Is(err, ErrNotAllowed) {
			t.Errorf("CheckCommand(%q) = %v, want allowed %v", argv0, err, ok)
		}
	}
}

func TestHostAllow_CheckURL(t *testing.T) {
	names, _ := ParseHostAllow([]string{"hooks.example.com", "*.internal.test", "127.0.0.1"})
	onlyNames, _ := ParseHostAllow([]string{"hooks.example.com", "*.internal.test"})
	nets, _ := ParseHostAllow([]string{"127.0.0.0/8", "::1"})
	netsV4, _ := ParseHostAllow([]string{"127.0.0.0/8"})
	for _, c := range []struct {
		a   *HostAllow
		url string
		ok  bool
	}{
		{names, "https://HOOKS.example.com./x", true},
		{names, "http://a.b.internal.test:81/", true},
		{onlyNames, "http://internal.test/", false}, // the wildcard is for subdomains
		{names, "http://127.0.0.1:9/", true},
		{names, "http://127.0.0.2/", false},
		{names, "http://[::ffff:127.0.0.1]/", true},
		{onlyNames, "http://other.example.com/", false}, // no IP or CIDR it could resolve into
		{names, "http://other.example.com/", true},      // it could resolve to 127.0.0.1: checked when dialed
		{nets, "http://127.9.9.9/", true},
		{nets, "http://[::1]:8080/", true},
		{netsV4, "http://[::1]/", false},
		{nets, "http://some.name/", true}, // resolved and checked when dialed
		{nil, "http://anything/", true},
	} {
		err := c.a.CheckURL(c.url)
		if (err == nil) != c.ok || err != nil && !errors.Is(err, ErrNotAllowed) {
			t.Errorf("%v.CheckURL(%q) = %v, want allowed %v", c.a, c.url, err, c.ok)
		}
	}
}

// allowedScript makes dir/jobs/job.sh, a script that touches its first
// argument, and the allow-list of dir/jobs.
func allowedScript(t *testing.T) (dir, jobs, script string, allow *PathAllow) {
	t.Helper()
	dir = t.TempDir()
	jobs = filepath.Join(dir, "jobs")
	if err := os.Mkdir(jobs, 0o755); err != nil {
		t.Fatal(err)
	}
	script = filepath.Join(jobs, "job.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ntouch \"$1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	allow, err := ParsePathAllow([]string{jobs})
	if err != nil {
		t.Fatal(err)
	}
	return dir, jobs, script, allow
}

// TestExec_AllowRefuses: a command outside --exec-allow is refused by
// NewExec when it is a path, and at the fire (without running) when it is
// a name that PATH resolves outside; a script under the prefix runs.
func TestExec_AllowRefuses(t *testing.T) {
	dir, jobs, script, allow := allowedScript(t)
	mark := filepath.Join(dir, "ran")
	touch, err := exec.LookPath("touch")
	if err != nil {
		t.Skip("no touch command")
	}
	if _, err := NewExec(ExecSpec{Command: []string{touch, mark}, Allow: allow}); !errors.Is(err, ErrNotAllowed) ||
		!strings.Contains(err.Error(), "outside the node's exec allow-list ("+jobs+")") {
		t.Fatalf("NewExec of %s outside %s: %v", touch, jobs, err)
	}
	e, err := NewExec(ExecSpec{Command: []string{"touch", mark}, Allow: allow})
	if err != nil {
		t.Fatalf("NewExec of a bare name: %v", err)
	}
	err = e.Execute(context.Background(), testFire())
	if !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), `"touch" resolves to `+touch) {
		t.Fatalf("fire of touch outside the allow-list: %v", err)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("a command outside the allow-list ran")
	}
	e, err = NewExec(ExecSpec{Command: []string{script, mark}, Allow: allow})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Execute(context.Background(), testFire()); err != nil {
		t.Fatalf("allowed script: %v", err)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Fatalf("the allowed script did not run: %v", err)
	}
}

// TestHTTP_AllowRefuses: an IP literal outside --http-allow is refused by
// NewHTTP; a name outside the names, resolving outside the CIDRs, is
// refused when dialed, before any byte reaches the server; an allowed
// address is reached.
func TestHTTP_AllowRefuses(t *testing.T) {
	hits := make(chan struct{}, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits <- struct{}{} }))
	defer srv.Close()
	port := srv.URL[strings.LastIndexByte(srv.URL, ':'):]
	client := func(entries ...string) *http.Client {
		a, err := ParseHostAllow(entries)
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewClient(ClientConfig{Allow: a, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.CloseIdleConnections)
		return c
	}

	if _, err := NewHTTP(client("127.0.0.2"), HTTPSpec{URL: srv.URL}); !errors.Is(err, ErrNotAllowed) ||
		!strings.Contains(err.Error(), `host "127.0.0.1" is outside the node's http allow-list (127.0.0.2)`) {
		t.Fatalf("NewHTTP to 127.0.0.1 with only 127.0.0.2 allowed: %v", err)
	}
	e, err := NewHTTP(client("127.0.0.2/32"), HTTPSpec{URL: "http://localhost" + port})
	if err != nil {
		t.Fatalf("NewHTTP of a name, CIDR allow-list: %v", err)
	}
	err = e.Execute(context.Background(), testFire())
	if !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), `"localhost" resolves to`) {
		t.Fatalf("fire to localhost with only 127.0.0.2/32 allowed: %v", err)
	}
	if len(hits) != 0 {
		t.Fatal("the refused request reached the server")
	}
	for _, allowed := range [][]string{{"127.0.0.0/8", "::1"}, {"localhost"}} {
		e, err = NewHTTP(client(allowed...), HTTPSpec{URL: "http://localhost" + port})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Execute(context.Background(), testFire()); err != nil {
			t.Fatalf("allowed by %v: %v", allowed, err)
		}
	}
	if len(hits) != 2 {
		t.Fatalf("%d requests reached the server, want 2", len(hits))
	}
}

// With an exec allow-list, a task's env may not name the variables that
// make an allowed program run other code: an allowed script's own
// commands found through a PATH of the task's, a library preloaded, a
// shell's or an interpreter's start-up hook. Without a list, anything
// goes, as every command does.
func TestExec_AllowRefusesEnvThatRunsOtherCode(t *testing.T) {
	dir, _, script, allow := allowedScript(t)
	evil := filepath.Join(dir, "evil")
	for _, name := range []string{"PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES", "BASH_ENV", "ENV",
		"PYTHONPATH", "PYTHONSTARTUP", "PERL5OPT", "RUBYOPT", "NODE_OPTIONS", "JAVA_TOOL_OPTIONS", "GCONV_PATH"} {
		_, err := NewExec(ExecSpec{Command: []string{script, filepath.Join(dir, "ran")}, Env: map[string]string{name: evil}, Allow: allow})
		if !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), "env "+name) {
			t.Errorf("NewExec with env %s under an allow-list: %v, want it refused naming it", name, err)
		}
		if _, err := NewExec(ExecSpec{Command: []string{script}, Env: map[string]string{name: evil}}); err != nil {
			t.Errorf("NewExec with env %s without an allow-list: %v", name, err)
		}
	}
	if _, err := NewExec(ExecSpec{Command: []string{script}, Env: map[string]string{"REPORT_DIR": evil, "LANG": "C"}, Allow: allow}); err != nil {
		t.Errorf("NewExec with plain variables under an allow-list: %v", err)
	}
}

// TestHTTP_AllowBehindProxy: behind a proxy (HTTPS_PROXY...) the node
// dials the proxy, which resolves the URL's host itself: a name that the
// list does not name could reach any address from there (a metadata
// service, an admin port), whatever CIDRs the list holds. Such a name is
// refused before anything is sent; a listed name, and an IP literal in a
// listed CIDR, go through the proxy.
func TestHTTP_AllowBehindProxy(t *testing.T) {
	reached := make(chan string, 10)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached <- r.URL.String() }))
	defer proxy.Close()
	proxyURL, err := url.Parse(proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The proxy's address must be allowed for anything to pass.
	a, err := ParseHostAllow([]string{"127.0.0.1/32", "hooks.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ClientConfig{Allow: a})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	c.Transport.(*allowTransport).Proxy = http.ProxyURL(proxyURL)

	for _, u := range []string{"http://metadata.internal.test/latest/meta-data/", "http://127.0.0.3/"} {
		e, err := NewHTTP(c, HTTPSpec{URL: u})
		if err == nil {
			err = e.Execute(context.Background(), testFire())
		}
		if !errors.Is(err, ErrNotAllowed) {
			t.Errorf("%s behind a proxy: %v, want it refused", u, err)
		}
	}
	if len(reached) != 0 {
		t.Fatalf("a refused request reached the proxy: %s", <-reached)
	}
	for _, u := range []string{"http://hooks.example.com/x", "http://127.0.0.1:9/y"} {
		e, err := NewHTTP(c, HTTPSpec{URL: u})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Execute(context.Background(), testFire()); err != nil {
			t.Fatalf("%s behind a proxy: %v", u, err)
		}
		if got := <-reached; got != u {
			t.Fatalf("the proxy was asked for %s, want %s", got, u)
		}
	}
}

// TestHTTP_AllowOtherIPForms: the spellings of 127.0.0.1 that resolvers
// and browsers accept (decimal, hex, octal, short, IPv4-mapped IPv6) never
// reach a server on 127.0.0.1 when the list leaves it out: an IP literal is
// checked once parsed, and a host that only a resolver reads as an address
// is checked as the address it resolves to.
func TestHTTP_AllowOtherIPForms(t *testing.T) {
	hits := make(chan struct{}, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits <- struct{}{} }))
	defer srv.Close()
	port := srv.URL[strings.LastIndexByte(srv.URL, ':'):]
	for _, entries := range [][]string{{"10.0.0.0/8", "fd00::/8"}, {"hooks.example.com", "*.example.org"}} {
		a, err := ParseHostAllow(entries)
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewClient(ClientConfig{Allow: a, DialTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		c.Transport.(*allowTransport).Proxy = nil // whatever the environment says
		for _, host := range []string{"2130706433", "0x7f000001", "0177.0.0.1", "127.1", "[::ffff:7f00:1]",
			"[0:0:0:0:0:ffff:127.0.0.1]", "[::ffff:127.0.0.1]", "127.0.0.1.", "localhost", "LOCALHOST."} {
			u := "http://" + host + port + "/"
			e, err := NewHTTP(c, HTTPSpec{URL: u})
			if err == nil {
				err = e.Execute(context.Background(), testFire())
			}
			if err == nil {
				t.Errorf("allow %v: %s was reached", entries, u)
			}
		}
		c.CloseIdleConnections()
	}
	if len(hits) != 0 {
		t.Fatalf("%d refused requests reached the server", len(hits))
	}
}
