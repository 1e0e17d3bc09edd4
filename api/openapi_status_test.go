package api

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// httpStatus maps the names of net/http's status constants to their codes
// (StatusNotFound -> 404), from http.StatusText.
func httpStatus() map[string]int {
	m := map[string]int{}
	for code := 100; code < 600; code++ {
		if text := http.StatusText(code); text != "" {
			name := strings.NewReplacer(" ", "", "-", "", "'", "").Replace(text)
			m["Status"+name] = code
		}
	}
	return m
}

// statusGraph is what the package's source says about status codes: the
// codes each function names (http.StatusX) and the functions of the
// package each one calls or refers to (method values included).
type statusGraph struct {
	codes map[string]map[int]bool
	calls map[string]map[string]bool
}

// parseStatusGraph reads every non-test .go file of the api package.
func parseStatusGraph(t *testing.T) *statusGraph {
	t.Helper()
	known := httpStatus()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	g := &statusGraph{codes: map[string]map[int]bool{}, calls: map[string]map[string]bool{}}
	var decls []*ast.FuncDecl
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				decls = append(decls, fd)
				key, _ := funcKey(fd)
				g.codes[key], g.calls[key] = map[int]bool{}, map[string]bool{}
			}
		}
	}
	for _, fd := range decls {
		name, recv := funcKey(fd)
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				x, ok := n.X.(*ast.Ident)
				switch {
				case ok && x.Name == "http" && strings.HasPrefix(n.Sel.Name, "Status") && n.Sel.Name != "StatusText":
					code, ok := known[n.Sel.Name]
					if !ok {
						t.Fatalf("%s: http.%s is not a status this test knows", fset.Position(n.Pos()), n.Sel.Name)
					}
					g.codes[name][code] = true
				case ok && recv != nil && x.Name == recv.name:
					if key := recv.typ + "." + n.Sel.Name; g.codes[key] != nil {
						g.calls[name][key] = true // s.fail(...), s.putTask
					}
				}
				return false
			case *ast.Ident:
				if g.codes[n.Name] != nil {
					g.calls[name][n.Name] = true // writeError(...)
				}
			}
			return true
		})
	}
	return g
}

// receiver is a method's receiver: its variable and type names.
type receiver struct{ name, typ string }

// funcKey names a function "f" and a method "T.f", with its receiver.
func funcKey(fd *ast.FuncDecl) (string, *receiver) {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name, nil
	}
	f := fd.Recv.List[0]
	typ := f.Type
	if st, ok := typ.(*ast.StarExpr); ok {
		typ = st.X
	}
	r := &receiver{typ: typ.(*ast.Ident).Name}
	if len(f.Names) > 0 {
		r.name = f.Names[0].Name
	}
	return r.typ + "." + fd.Name.Name, r
}

// reach returns the codes fn and everything it reaches can answer with.
func (g *statusGraph) reach(fn string) map[int]bool {
	out, seen := map[int]bool{}, map[string]bool{}
	var visit func(string)
	visit = func(f string) {
		if seen[f] {
			return
		}
		seen[f] = true
		for c := range g.codes[f] {
			out[c] = true
		}
		for callee := range g.calls[f] {
			visit(callee)
		}
	}
	visit(fn)
	return out
}

// routeHandlers reads routes() in server.go: route pattern -> the name of
// the Server method that serves it.
func routeHandlers(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "server.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 2 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || (sel.Sel.Name != "HandleFunc" && sel.Sel.Name != "Handle") {
			return true
		}
		h := call.Args[1]
		if c, ok := h.(*ast.CallExpr); ok { // s.bounded(s.getTask), s.bulk(a), s.metricsHandler()
			h = c.Fun
			if fn, ok := h.(*ast.SelectorExpr); ok && fn.Sel.Name == "bounded" {
				h = c.Args[0]
			}
		}
		hs, ok := h.(*ast.SelectorExpr)
		if !ok {
			t.Fatalf("%s: a handler that is not a method of the Server", fset.Position(h.Pos()))
		}
		switch p := call.Args[0].(type) {
		case *ast.BasicLit:
			pattern, _ := strconv.Unquote(p.Value)
			out[pattern] = hs.Sel.Name
		case *ast.BinaryExpr: // "POST /v1/tasks:"+string(a): the bulk actions
			prefix, _ := strconv.Unquote(p.X.(*ast.BasicLit).Value)
			for _, a := range []string{"pause", "resume", "delete", "trigger"} {
				out[prefix+a] = hs.Sel.Name
			}
		}
		return true
	})
	return out
}

// documentedStatuses reads openapi.yaml: route pattern -> the response
// codes listed for it.
func documentedStatuses(t *testing.T) map[string][]int {
	t.Helper()
	b, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths      map[string]map[string]any `json:"paths"`
		Components struct {
			PathItems map[string]map[string]any `json:"pathItems"`
		} `json:"components"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string][]int{}
	for path, item := range doc.Paths {
		if ref, ok := item["$ref"].(string); ok {
			item = doc.Components.PathItems[strings.TrimPrefix(ref, "#/components/pathItems/")]
		}
		for method, op := range item {
			m, ok := op.(map[string]any)
			if !ok || method == "parameters" {
				continue
			}
			pattern := strings.ToUpper(method) + " " + path
			if path == "/" {
				pattern = "GET /{$}"
			}
			resp, _ := m["responses"].(map[string]any)
			for code := range resp {
				n, err := strconv.Atoi(code)
				if err != nil {
					t.Errorf("%s: response %q is not a status code", pattern, code)
					continue
				}
				out[pattern] = append(out[pattern], n)
			}
		}
	}
	return out
}

// TestOpenAPI_DocumentsEveryStatus: every status code a route's handler
// can answer with, by what its source names (http.StatusX in the handler
// and in every function of the package it calls), is listed for that
// route in openapi.yaml; so is 401 on every route but the dashboard page
// (the token, or --probe-auth token for the probes), 403 on every write
// (the read-only token) and 400 on every route under /v1 (a query
// parameter it does not take); and nothing else is listed. Reading the source
// over-approximates where a helper serves many routes: the rules below
// drop the codes of Server.fail's error cases that a route cannot meet.
func TestOpenAPI_DocumentsEveryStatus(t *testing.T) {
	contended := func(pattern string) bool {
		switch pattern {
		case "PUT /v1/tasks/{id}", "DELETE /v1/tasks/{id}":
			return true
		case "POST /v1/tasks:batch", "POST /v1/tasks:states":
			return false
		}
		return strings.HasPrefix(pattern, "POST /v1/tasks/{id}/") || strings.HasPrefix(pattern, "POST /v1/tasks:")
	}
	g := parseStatusGraph(t)
	documented := documentedStatuses(t)
	routes := routeHandlers(t)
	if len(routes) < 20 {
		t.Fatalf("found only %d routes in server.go: the parser is broken", len(routes))
	}
	for _, pattern := range slices.Sorted(maps.Keys(routes)) {
		want := g.reach("Server." + routes[pattern])
		delete(want, http.StatusOK) // listed for every route (TestOpenAPI_MatchesRoutes reads the rest)
		if pattern != "GET /{$}" {
			want[http.StatusUnauthorized] = true
			if !strings.HasPrefix(pattern, "GET ") {
				want[http.StatusForbidden] = true
			}
		}
		// serveHTTP's checkQuery, before any handler: a query parameter
		// the route does not take, or one that does not parse, is a 400
		// on every route under /v1, those that take none included.
		if strings.Contains(pattern, " /v1/") {
			want[http.StatusBadRequest] = true
		}
		// fail's 412 is engine.ErrVersionMismatch: only a PUT or a DELETE
		// with If-Match.
		if pattern != "PUT /v1/tasks/{id}" && pattern != "DELETE /v1/tasks/{id}" {
			delete(want, http.StatusPreconditionFailed)
		}
		// fail's 409 is registry.ErrContention: only writes that retry
		// under contention (a task's put, delete, pause, resume or trigger,
		// and the bulk actions; a backfill has a 409 of its own).
		if !contended(pattern) {
			delete(want, http.StatusConflict)
		}
		// fail's 404 is engine.ErrNotFound: a route of one task that
		// reads it (a PUT creates it).
		if !strings.Contains(pattern, "{id}") || pattern == "PUT /v1/tasks/{id}" {
			delete(want, http.StatusNotFound)
		}
		got := documented[pattern]
		for _, c := range slices.Sorted(maps.Keys(want)) {
			if !slices.Contains(got, c) {
				t.Errorf("%s can answer %d (%s), which openapi.yaml does not list for it", pattern, c, http.StatusText(c))
			}
		}
		for _, c := range got {
			if c != http.StatusOK && !want[c] {
				t.Errorf("openapi.yaml lists %d for %s, which its handler never answers", c, pattern)
			}
		}
	}
}
