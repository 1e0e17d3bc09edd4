package docs

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/shardcron/shardcron/task"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRepository_PointsNowhereOutsideIt: a reader who cloned the
// repository has nothing beside it, so no file may send them there.
func TestRepository_PointsNowhereOutsideIt(t *testing.T) {
	outside := []string{".." + "/shared", "shared/" + "DESIGN.md", "shared/" + "API.md", "shared/" + "seeds"}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" || (path != ".." && strings.HasPrefix(d.Name(), ".") && d.Name() != ".ci") {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Size() > 4<<20 {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(b, 0) >= 0 {
			return nil // binary
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, o := range outside {
				if strings.Contains(line, o) {
					t.Errorf("%s:%d mentions %q, outside the repository: point to docs/ instead", path, i+1, o)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// jsonFields returns the JSON names of t's fields, and of the structs it
// holds, recursively.
func jsonFields(t reflect.Type, seen map[reflect.Type]bool, out map[string]string) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] || t.PkgPath() != reflect.TypeFor[task.Task]().PkgPath() {
		return
	}
	seen[t] = true
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		out[name] = t.Name() + "." + f.Name
		jsonFields(f.Type, seen, out)
	}
}

// TestAPI_NamesEveryTaskField: every JSON field of task.Task (executor,
// retry, history_limit and state included) is in docs/api.md.
func TestAPI_NamesEveryTaskField(t *testing.T) {
	doc := read(t, "api.md")
	fields := map[string]string{}
	jsonFields(reflect.TypeFor[task.Task](), map[reflect.Type]bool{}, fields)
	if len(fields) < 20 {
		t.Fatalf("found only %d task fields: the reflection walk is broken", len(fields))
	}
	for name, field := range fields {
		if !strings.Contains(doc, `"`+name+`"`) && !strings.Contains(doc, "`"+name+"`") {
			t.Errorf("task field %q (%s) is not in docs/api.md", name, field)
		}
	}
}

// TestAPI_NamesEveryRoute: every pattern the API server registers is in
// docs/api.md's table.
func TestAPI_NamesEveryRoute(t *testing.T) {
	doc := read(t, "api.md")
	src := read(t, "../api/server.go")
	re := regexp.MustCompile(`m\.Handle(?:Func)?\("([A-Z]+) ([^"]+)"`)
	routes := re.FindAllStringSubmatch(src, -1)
	if len(routes) < 15 {
		t.Fatalf("found only %d routes in api/server.go: the pattern is broken", len(routes))
	}
	for _, r := range routes {
		method, path := r[1], strings.TrimSuffix(r[2], "{$}")
		if !strings.Contains(doc, method+" "+path) && !strings.Contains(doc, "`"+method+" "+path+"?") {
			t.Errorf("route %s %s is not in docs/api.md", method, path)
		}
	}
}

// TestAPI_NamesEveryMetric: every shardcron_* family is in docs/api.md.
func TestAPI_NamesEveryMetric(t *testing.T) {
	doc := read(t, "api.md")
	src := read(t, "../api/metrics.go")
	names := regexp.MustCompile(`\bd\("([a-z_]+)"`).FindAllStringSubmatch(src, -1)
	if len(names) < 10 {
		t.Fatalf("found only %d metrics in api/metrics.go: the pattern is broken", len(names))
	}
	for _, n := range names {
		if !strings.Contains(doc, "shardcron_"+n[1]) {
			t.Errorf("metric shardcron_%s is not in docs/api.md", n[1])
		}
	}
}

// TestDocs_LinksResolve: relative links of the README and the docs name
// files that exist.
func TestDocs_LinksResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)#:]+)(#[^)]*)?\)`)
	for _, f := range []string{"../README.md", "design.md", "api.md"} {
		for _, m := range link.FindAllStringSubmatch(read(t, f), -1) {
			target := filepath.Join(filepath.Dir(f), m[1])
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s links to %s, which does not exist", f, m[1])
			}
		}
	}
}
