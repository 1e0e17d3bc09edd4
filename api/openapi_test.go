package api

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/task"
	"sigs.k8s.io/yaml"
)

// TestOpenAPI_MatchesRoutes: every path and method api/openapi.yaml lists
// is routed by the server's mux to the route of the same pattern, with the
// query parameters the server takes (queryParams), and every route the
// server registers is listed.
func TestOpenAPI_MatchesRoutes(t *testing.T) {
	b, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenAPI    string                    `json:"openapi"`
		Paths      map[string]map[string]any `json:"paths"`
		Components struct {
			PathItems map[string]map[string]any `json:"pathItems"`
		} `json:"components"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi: %q, want 3.x", doc.OpenAPI)
	}
	mux := (&Server{}).routes() // routing only: no handler runs
	flags := flagParams(t)
	var listed []string
	for path, item := range doc.Paths {
		if ref, ok := item["$ref"].(string); ok {
			name, found := strings.CutPrefix(ref, "#/components/pathItems/")
			if item = doc.Components.PathItems[name]; !found || item == nil {
				t.Errorf("%s: $ref %q resolves to nothing", path, ref)
				continue
			}
		}
		for method := range item {
			switch method {
			case "get", "put", "post", "delete", "patch", "head":
			default:
				continue // parameters, summary...
			}
			m := strings.ToUpper(method)
			pattern := m + " " + path
			if path == "/" {
				pattern = m + " /{$}"
			}
			listed = append(listed, pattern)
			r := httptest.NewRequest(m, strings.ReplaceAll(path, "{id}", "task-1"), nil)
			if _, got := mux.Handler(r); got != pattern {
				t.Errorf("openapi.yaml lists %s %s; the server routes it to %q", m, path, got)
			}
			if strings.HasPrefix(path, "/v1/") {
				var query []string
				for _, p := range asList(item[method].(map[string]any)["parameters"]) {
					if p, ok := p.(map[string]any); ok && p["in"] == "query" {
						name := p["name"].(string)
						query = append(query, name)
						enum, _ := p["schema"].(map[string]any)["enum"].([]any)
						if flags[name] && !slices.Equal(enum, []any{"1", "true", "0", "false"}) {
							t.Errorf("%s: openapi.yaml gives ?%s the values %v; the server takes 1, true, 0 and false (parseFlag)", pattern, name, enum)
						}
					}
				}
				if want := slices.Sorted(slices.Values(queryParams[pattern])); !slices.Equal(slices.Sorted(slices.Values(query)), want) {
					t.Errorf("%s: openapi.yaml lists the query parameters %v, the server takes %v", pattern, query, want)
				}
			}
		}
	}

	src, err := os.ReadFile("server.go")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`m\.Handle(?:Func)?\("([A-Z]+ [^"]+)"`)
	var routes []string
	for _, sm := range re.FindAllStringSubmatch(string(src), -1) {
		if p := sm[1]; strings.HasSuffix(p, ":") { // the bulk actions, registered in a loop
			for _, a := range []task.BulkAction{task.BulkPause, task.BulkResume, task.BulkDelete, task.BulkTrigger} {
				routes = append(routes, p+string(a))
			}
		} else {
			routes = append(routes, p)
		}
	}
	if len(routes) < 20 {
		t.Fatalf("found only %d routes in server.go: the pattern is broken", len(routes))
	}
	for _, r := range routes {
		if !slices.Contains(listed, r) {
			t.Errorf("route %s is not in openapi.yaml", r)
		}
	}
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// flagParams returns the query parameters the package reads as booleans,
// with parseFlag, which takes 1, true, 0 and false and refuses the rest.
func flagParams(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, m := range sourceMatches(t, regexp.MustCompile(`parseFlag\(r, "([a-z_]+)"\)`)) {
		out[m[1]] = true
	}
	if len(out) < 3 {
		t.Fatalf("found only %d parameters read by parseFlag: the pattern is broken", len(out))
	}
	return out
}

// TestOpenAPI_NamesEveryHeader: every header the handlers set on an answer
// (w.Header().Set), but those every JSON answer carries, is named in
// openapi.yaml, for clients generated from it: ETag (If-Match's value),
// WWW-Authenticate and a 405's Allow were not.
func TestOpenAPI_NamesEveryHeader(t *testing.T) {
	spec, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	every := map[string]bool{"Content-Type": true, "Cache-Control": true, "X-Content-Type-Options": true}
	names := map[string]bool{client.WarningHeader: true} // set by its constant's name
	for _, m := range sourceMatches(t, regexp.MustCompile(`Header\(\)\.(?:Set|Add)\("([^"]+)"`)) {
		if !every[m[1]] {
			names[m[1]] = true
		}
	}
	if len(names) < 4 {
		t.Fatalf("found only the headers %v: the pattern is broken", names)
	}
	for name := range names {
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`).Match(spec) {
			t.Errorf("the handlers set %s, which openapi.yaml does not name", name)
		}
	}
}

// sourceMatches returns every match of re, with its submatches, in the
// package's source files (its tests left out).
func sourceMatches(t *testing.T, re *regexp.Regexp) [][]string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, re.FindAllStringSubmatch(string(b), -1)...)
	}
	return out
}

// TestOpenAPI_SaysContentTypeIsNotRead: openapi.yaml says, as docs/api.md
// does, that the server reads a request body whatever its Content-Type
// (TestServer_SingleNode/AnyContentType), on the whole and on the bodies
// curl sends as a form (a task's put) or whose two media types would
// read as chosen by it (a batch's): it listed application/json alone.
func TestOpenAPI_SaysContentTypeIsNotRead(t *testing.T) {
	b, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Info struct {
			Description string `json:"description"`
		} `json:"info"`
		Paths map[string]map[string]any `json:"paths"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	if !strings.Contains(doc.Info.Description, "Content-Type is not looked at") {
		t.Errorf("openapi.yaml's info does not say that a request body's Content-Type is not looked at")
	}
	for _, op := range []struct{ path, method string }{{"/v1/tasks/{id}", "put"}, {"/v1/tasks:batch", "post"}} {
		o, _ := doc.Paths[op.path][op.method].(map[string]any)
		body, _ := o["requestBody"].(map[string]any)
		if d, _ := body["description"].(string); !strings.Contains(d, "whatever its Content-Type") {
			t.Errorf("%s %s: the request body's description %q does not say that it is read whatever its Content-Type", op.method, op.path, d)
		}
	}
}
