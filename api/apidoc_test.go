package api

import (
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/task"
	"sigs.k8s.io/yaml"
)

// TestAPIDoc_NamesEveryQueryParameter: docs/api.md's table of routes names,
// in the rows of each route, every query parameter the server takes for it
// (queryParams), so that a parameter added to a route is documented where
// a reader of that route looks.
func TestAPIDoc_NamesEveryQueryParameter(t *testing.T) {
	b, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| `") {
			rows = append(rows, line)
		}
	}
	if len(rows) < 20 {
		t.Fatalf("found only %d table rows in docs/api.md: the pattern is broken", len(rows))
	}
	for pattern, params := range queryParams {
		var text string
		for _, row := range rows {
			first, _, _ := strings.Cut(strings.TrimPrefix(row, "| "), " | ")
			for _, end := range []string{"`", "?", " "} {
				if strings.Contains(first, "`"+pattern+end) {
					text += row
					break
				}
			}
		}
		if text == "" {
			t.Errorf("docs/api.md has no table row of %s", pattern)
			continue
		}
		for _, p := range params {
			if !strings.Contains(text, p+"=") {
				t.Errorf("docs/api.md's rows of %s do not name its query parameter %q (as %s=)", pattern, p, p)
			}
		}
	}
}

// jsonNames returns the JSON names of the fields of the struct types of
// vs, as encoding/json names them (embedded structs' fields inlined).
func jsonNames(vs ...any) []string {
	var out []string
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case name == "-" || !f.IsExported():
			case name == "" && f.Anonymous && f.Type.Kind() == reflect.Struct:
				walk(f.Type)
			case name == "":
				out = append(out, f.Name)
			default:
				out = append(out, name)
			}
		}
	}
	for _, v := range vs {
		walk(reflect.TypeOf(v))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestOpenAPI_SchemasMatchStructs: the objects api/openapi.yaml describes
// have the fields of the Go types the server writes and reads, no more
// and no fewer, so that a field added to a body or answer is described.
func TestOpenAPI_SchemasMatchStructs(t *testing.T) {
	b, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	// at walks doc along path; a "$ref" met on the way is followed.
	var at func(v any, path ...string) any
	at = func(v any, path ...string) any {
		for _, p := range path {
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			if ref, ok := m["$ref"].(string); ok && strings.HasPrefix(ref, "#/") {
				m, _ = at(doc, strings.Split(strings.TrimPrefix(ref, "#/"), "/")...).(map[string]any)
			}
			v = m[p]
		}
		return v
	}
	props := func(path ...string) []string {
		m, ok := at(doc, append(path, "properties")...).(map[string]any)
		if !ok {
			t.Errorf("openapi.yaml: no properties at %v", path)
			return nil
		}
		return slices.Sorted(maps.Keys(m))
	}
	const json = "application/json"
	ok200 := func(path, method string, more ...string) []string {
		return props(append([]string{"paths", path, method, "responses", "200", "content", json, "schema"}, more...)...)
	}
	body := func(path, method string) []string {
		return props("paths", path, method, "requestBody", "content", json, "schema")
	}
	for _, c := range []struct {
		name string
		doc  []string
		code []string
	}{
		{"Node", props("components", "schemas", "Node"), jsonNames(client.Node{})},
		{"Execution", props("components", "schemas", "Execution"), jsonNames(task.Execution{})},
		{"Alert", props("components", "schemas", "Alert"), jsonNames(engine.Alert{})},
		{"ItemMessage", props("components", "schemas", "ItemMessage"), jsonNames(task.BatchError{}, client.BatchWarning{})},
		{"Preview", props("components", "responses", "Preview", "content", json, "schema"), jsonNames(client.Preview{})},
		{"GET /v1/tasks", ok200("/v1/tasks", "get"), jsonNames(client.ListResponse{})},
		{"GET /v1/tasks:status", ok200("/v1/tasks:status", "get"), jsonNames(client.StatusAnswer{})},
		{"POST /v1/tasks:states", body("/v1/tasks:states", "post"), jsonNames(client.StatesRequest{})},
		{"GET /v1/failures", ok200("/v1/failures", "get"), jsonNames(client.FailuresResponse{})},
		{"POST /v1/tasks:batch", ok200("/v1/tasks:batch", "post"), jsonNames(client.BatchResult{})},
		{"bulk selector", props("components", "pathItems", "bulk", "post", "requestBody", "content", json, "schema"), jsonNames(task.Selector{})},
		{"bulk counts", props("components", "pathItems", "bulk", "post", "responses", "200", "content", json, "schema"), jsonNames(task.BulkResult{})},
		{"POST /v1/tasks/{id}/pause", body("/v1/tasks/{id}/pause", "post"), jsonNames(pauseRequest{})},
		{"POST /v1/tasks/{id}/trigger", body("/v1/tasks/{id}/trigger", "post"), jsonNames(task.Override{})},
		{"POST /v1/tasks/{id}/trigger 202", props("paths", "/v1/tasks/{id}/trigger", "post", "responses", "202", "content", json, "schema"), jsonNames(client.TriggerResponse{})},
		{"POST /v1/tasks/{id}/backfill", body("/v1/tasks/{id}/backfill", "post"), jsonNames(client.BackfillRequest{})},
		{"GET /v1/tasks/{id}/history", ok200("/v1/tasks/{id}/history", "get"), jsonNames(client.HistoryResponse{})},
		{"POST /v1/schedules:preview", body("/v1/schedules:preview", "post"), jsonNames(client.PreviewRequest{})},
		{"GET /v1/nodes", ok200("/v1/nodes", "get"), jsonNames(client.NodesResponse{})},
		{"GET /v1/partitions", ok200("/v1/partitions", "get"), jsonNames(client.PartitionsResponse{})},
		{"GET /v1/partitions items", ok200("/v1/partitions", "get", "properties", "partitions", "items"), jsonNames(client.Partition{})},
	} {
		if !slices.Equal(c.doc, c.code) {
			t.Errorf("%s: openapi.yaml lists %v; the code's fields are %v", c.name, c.doc, c.code)
		}
	}
}
