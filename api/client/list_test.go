package client

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestDecodeListPage: an answer laid out as the server writes it (a task a
// line) and any other JSON of the same answer read as encoding/json reads
// them; a broken answer is an error.
func TestDecodeListPage(t *testing.T) {
	task1 := `{"id":"a","schedule":"* * * * *","timezone":"UTC","executor":{"type":"noop"},"timeout":"1m0s",` +
		`"retry":{"max_attempts":1,"backoff":"1s","max_backoff":"1m0s"},"misfire":"fire_once","catchup_window":"1m0s",` +
		`"concurrency":"allow","jitter":"0s","paused":false,"labels":{"g":"1"},"partition":3,"version":7,` +
		`"created_at":"2026-12-03T09:00:00.123Z","updated_at":"2026-12-03T09:00:00.123Z"}`
	task2 := `{ "id": "b,\n", "schedule": "@hourly", "executor": {"type": "noop"}, "state": {"owner": "n", "fires": 3} }`
	for name, body := range map[string]string{
		"server layout":      `{"tasks":[` + task1 + "\n," + task1 + "\n" + `],"next_cursor":"a"}` + "\n",
		"empty page":         `{"tasks":[],"next_cursor":""}` + "\n",
		"partial":            `{"tasks":[` + task1 + "\n" + `],"next_cursor":"","partial":["n2: down"]}` + "\n",
		"one line":           `{"tasks":[` + task1 + `,` + task1 + `],"next_cursor":"a"}`,
		"not canonical":      `{"tasks":[` + strings.ReplaceAll(task2, "\n", `\n`) + "\n" + `],"next_cursor":"b,\n"}`,
		"indented":           "{\n  \"tasks\": [\n    " + task1 + "\n  ],\n  \"next_cursor\": \"a\"\n}\n",
		"cursor before":      `{"next_cursor":"a","tasks":[` + task1 + "\n]}",
		"a null task":        `{"tasks":[null],"next_cursor":""}`,
		"a line of two":      `{"tasks":[` + task1 + task1 + "\n" + `],"next_cursor":""}`,
		"truncated":          `{"tasks":[` + task1 + "\n,",
		"a task that breaks": `{"tasks":[{"id":5}` + "\n" + `],"next_cursor":""}`,
	} {
		var want ListResponse
		werr := json.Unmarshal([]byte(body), &want)
		got, err := decodeListPage([]byte(body))
		if (err != nil) != (werr != nil) {
			t.Errorf("%s: error %v, encoding/json's %v", name, err, werr)
			continue
		}
		if err == nil && !reflect.DeepEqual(got, &ListPage{Tasks: want.Tasks, NextCursor: want.NextCursor, Partial: want.Partial}) {
			t.Errorf("%s:\n got %+v\nwant %+v", name, got, want)
		}
	}
}
