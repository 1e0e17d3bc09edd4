package docs

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/shardcron/shardcron/bench"
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

// TestDocs_LinksResolve: the relative links of every Markdown file of the
// repository (BENCHMARKS.md included) name files that exist, and a link's
// #anchor, to a Markdown file or within its own, names one of its
// headings, as GitHub makes them.
func TestDocs_LinksResolve(t *testing.T) {
	var files []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != ".." && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 {
		t.Fatalf("found only %d Markdown files: the walk is broken", len(files))
	}
	link := regexp.MustCompile(`\]\(([^)#:]*)(#[^)]*)?\)`)
	for _, f := range files {
		for _, m := range link.FindAllStringSubmatch(read(t, f), -1) {
			target := f
			if m[1] != "" {
				target = filepath.Join(filepath.Dir(f), m[1])
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s links to %s, which does not exist", f, m[1])
					continue
				}
			}
			if m[2] != "" && strings.HasSuffix(target, ".md") && !slices.Contains(anchors(read(t, target)), m[2][1:]) {
				t.Errorf("%s links to %s%s, a heading %s does not have", f, m[1], m[2], target)
			}
		}
	}
}

// anchors returns the anchors GitHub gives the headings of a Markdown
// text: lower case, spaces as dashes, punctuation but dashes and
// underscores dropped.
func anchors(text string) []string {
	var out []string
	inCode := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		out = append(out, strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				return r
			}
			return -1
		}, h))
	}
	return out
}

// TestAPI_NamesEveryBenchScenario: docs/api.md's list of bench scenarios
// holds every scenario the binary takes.
func TestAPI_NamesEveryBenchScenario(t *testing.T) {
	doc := read(t, "api.md")
	_, list, _ := strings.Cut(doc, "### `bench SCENARIO`")
	list, _, _ = strings.Cut(list, "flags")
	for _, s := range append(slices.Clone(bench.Scenarios), bench.All) {
		if !strings.Contains(list, "`"+s+"`") {
			t.Errorf("bench scenario %q is not in docs/api.md's list of scenarios", s)
		}
	}
}

// TestAPI_StatesTaskLimits: the bounds docs/api.md gives a task's
// durations and counts are those its validation applies: the bound is
// taken, one past it refused.
func TestAPI_StatesTaskLimits(t *testing.T) {
	doc := strings.Join(strings.Fields(read(t, "api.md")), " ")
	for _, l := range []struct{ doc, at, past string }{
		{"`timeout`: per attempt, default `1m`, at most `24h`", `"timeout": "24h"`, `"timeout": "24h0m1s"`},
		{"`max_attempts` (default 1, counting the first; at most 100)", `"retry": {"max_attempts": 100}`, `"retry": {"max_attempts": 101}`},
		{"`max_backoff` (default 1m); both at most `24h`", `"retry": {"backoff": "24h", "max_backoff": "24h"}`, `"retry": {"max_backoff": "24h0m1s"}`},
		{"`catchup_window` (default `1m`, at most `24h`)", `"catchup_window": "24h"`, `"catchup_window": "24h0m1s"`},
		{"`jitter`: a delay derived from the id and the scheduled time, below this (default 0: none). At most `1h`", `"jitter": "1h"`, `"jitter": "1h0m1s"`},
	} {
		if !strings.Contains(doc, l.doc) {
			t.Errorf("docs/api.md does not say %q", l.doc)
		}
		const base = `{"id": "a", "schedule": "@daily", "executor": {"type": "noop"}, `
		if _, err := task.DecodeTask([]byte(base + l.at + `}`)); err != nil {
			t.Errorf("%s: %v, want it taken", l.at, err)
		}
		if _, err := task.DecodeTask([]byte(base + l.past + `}`)); err == nil {
			t.Errorf("%s: taken, want it refused", l.past)
		}
	}
}

// TestDocs_CiteTestsThatExist: the docs, and the comments of the code,
// name the tests that show what they say (design.md's list of what is not
// guaranteed takes a case off once its test fails); a test renamed or
// removed must not leave them naming nothing. A name cited may be a
// prefix of tests, as a -run pattern is.
func TestDocs_CiteTestsThatExist(t *testing.T) {
	defined := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)\w+)\(`)
	cited := regexp.MustCompile(`\b(?:Test|Fuzz|Benchmark)[A-Z]\w*`)
	var names []string
	citing := map[string]string{} // name: where it is first cited
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != ".." && strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(path)
		if ext != ".go" && ext != ".md" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.HasSuffix(path, "_test.go") {
			for _, m := range defined.FindAllStringSubmatch(string(b), -1) {
				names = append(names, m[1])
			}
			return nil
		}
		for _, n := range cited.FindAllString(string(b), -1) {
			if _, ok := citing[n]; !ok {
				citing[n] = path
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for n, path := range citing {
		if !slices.ContainsFunc(names, func(name string) bool { return strings.HasPrefix(name, n) }) {
			t.Errorf("%s cites %s, which no test is named", path, n)
		}
	}
}
