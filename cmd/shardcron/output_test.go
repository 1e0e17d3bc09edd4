package main

import "testing"

// A cursor the list hints at is pasted into a shell: a task id with a
// space, a quote or a glob in it must come back as one word, itself.
func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"list/2":        "list/2",
		"a@b:c=d,e+f%g": "a@b:c=d,e+f%g",
		"a b":           "'a b'",
		"it's":          `'it'\''s'`,
		"*":             "'*'",
		"$HOME":         "'$HOME'",
		"":              "''",
		"é":             "'é'",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}
