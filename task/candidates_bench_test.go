package task

import (
	"encoding/json"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
	jsonv1 "github.com/go-json-experiment/json/v1"
	goccy "github.com/goccy/go-json"
)

// BenchmarkDecodeCandidates compares the JSON libraries that could read
// stored tasks instead of canonical.go's walk, side by side: the task of
// the bench's fleet (noop, two labels) and one with every field.
func BenchmarkDecodeCandidates(b *testing.B) {
	fleet := []byte(`{"id":"job-0000001","schedule":"* * * * * *","timezone":"UTC","executor":{"type":"noop"},` +
		`"timeout":"1m0s","retry":{"max_attempts":1,"backoff":"1s","max_backoff":"1m0s"},"misfire":"fire_once",` +
		`"catchup_window":"1m0s","concurrency":"allow","jitter":"0s","paused":false,"labels":{"g":"1","team":"1"},` +
		`"created_at":"2026-12-03T09:00:00.123Z","updated_at":"2026-12-03T09:00:00.123Z"}`)
	caseLikeV1 := jsonv2.JoinOptions(jsonv2.MatchCaseInsensitiveNames(true), jsonv1.MatchCaseSensitiveDelimiter(true))
	impls := []struct {
		name   string
		decode func([]byte, *Task) error
	}{
		{"encoding-json", func(d []byte, t *Task) error { return json.Unmarshal(d, t) }},
		{"walk", DecodeStored},
		{"json-v2", func(d []byte, t *Task) error { return jsonv2.Unmarshal(d, t, caseLikeV1) }},
		{"json-v2-v1-options", func(d []byte, t *Task) error { return jsonv2.Unmarshal(d, t, jsonv1.DefaultOptionsV1()) }},
		{"goccy", func(d []byte, t *Task) error { return goccy.Unmarshal(d, t) }},
	}
	for _, c := range []struct {
		name string
		data []byte
	}{{"fleet", fleet}, {"every-field", encoded(b)[0]}} {
		for _, impl := range impls {
			b.Run("task="+c.name+"/impl="+impl.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					var t Task
					if err := impl.decode(c.data, &t); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
