package main

import (
	"flag"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// sameDefault reports whether a default as a document writes it (8GiB,
// 168h, `text`) is the flag's default as flag prints it (8.0 GiB,
// 168h0m0s, text).
func sameDefault(doc, def string) bool {
	norm := func(s string) string {
		s = strings.Trim(strings.TrimSpace(s), "`\"")
		if d, err := time.ParseDuration(s); err == nil {
			return d.String()
		}
		return strings.NewReplacer(" ", "", ".0", "").Replace(s)
	}
	return norm(doc) == norm(def)
}

// docDefaults reads the defaults a table of server flags states: in
// docs/api.md a row starts "| `--a` [d], `--b`, `--c` [e] |" (b takes the
// next default given, e); in the README, "| `--a`, `--b` | d, e |".
func docDefaults(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	flagRe := regexp.MustCompile("`--([a-z-]+)`(?:\\s*\\[([^\\]]*)\\])?")
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		ms := flagRe.FindAllStringSubmatch(cells[0], -1)
		if strings.Contains(cells[0], "[") { // api.md
			var waiting []string
			for _, m := range ms {
				waiting = append(waiting, m[1])
				if m[2] != "" {
					for _, f := range waiting {
						out[f] = m[2]
					}
					waiting = nil
				}
			}
			continue
		}
		if len(cells) < 3 { // a table of other flags
			continue
		}
		defs := strings.Split(cells[1], ", ")
		for i, m := range ms {
			switch {
			case len(defs) == len(ms):
				out[m[1]] = defs[i]
			case len(defs) == 1:
				out[m[1]] = defs[0]
			default:
				t.Errorf("%s: %d flags and %d defaults in %q", path, len(ms), len(defs), line)
			}
		}
	}
	return out
}

// TestServer_DocsStateTheFlagDefaults: the defaults docs/api.md and the
// README's tables of server flags give are the flags' own, and a flag
// without a default is not given one there.
func TestServer_DocsStateTheFlagDefaults(t *testing.T) {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	var f serverFlags
	f.register(fs)
	// What the documents write for a flag whose value is empty by default.
	nothing := []string{"none", "false", "any", "hostname-port", "the listen address", "the system's roots",
		"127.0.0.1, API port + 10000 / + 20000"}
	for _, path := range []string{"../../docs/api.md", "../../README.md"} {
		docs := docDefaults(t, path)
		if len(docs) < 20 {
			t.Fatalf("%s: found the defaults of only %d server flags: the pattern is broken", path, len(docs))
		}
		for name, doc := range docs {
			fl := fs.Lookup(name)
			if fl == nil {
				t.Errorf("%s gives a default to --%s, which server does not take", path, name)
				continue
			}
			if fl.DefValue == "" || fl.DefValue == "false" {
				if !slices.Contains(nothing, strings.Trim(doc, "`")) {
					t.Errorf("%s: --%s [%s]; the flag has no default", path, name, doc)
				}
				continue
			}
			if !sameDefault(doc, fl.DefValue) {
				t.Errorf("%s: --%s [%s]; its default is %s", path, name, doc, fl.DefValue)
			}
		}
	}
}
