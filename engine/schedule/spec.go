package schedule

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
)

// parsed is a validated spec with its H fields resolved.
type parsed struct {
	resolved string    // the 6 resolved fields joined by spaces, or "@every <d>"
	fields   [6]string // the resolved cron fields; empty for @every
	every    int64     // @every interval in seconds; 0 for cron
}

// field describes one cron field in its 6-field position.
type field struct {
	name       string
	min, max   int            // values robfig accepts
	hmin, hmax int            // the H range, see doc.go
	names      map[string]int // lower-case names, or nil
	nameHint   string         // for messages: what names are accepted
}

var fields = [6]field{
	{name: "second", min: 0, max: 59, hmin: 0, hmax: 59},
	{name: "minute", min: 0, max: 59, hmin: 0, hmax: 59},
	{name: "hour", min: 0, max: 23, hmin: 0, hmax: 23},
	{name: "day-of-month", min: 1, max: 31, hmin: 1, hmax: 28},
	{name: "month", min: 1, max: 12, hmin: 1, hmax: 12, nameHint: " or a month name (jan-dec)", names: map[string]int{
		"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6,
		"jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12,
	}},
	{name: "day-of-week", min: 0, max: 6, hmin: 0, hmax: 6, nameHint: " or a day name (sun-sat)", names: map[string]int{
		"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6,
	}},
}

// descriptors maps each descriptor but @every to its 6-field equivalent,
// the same bit sets robfig's own descriptors produce.
var descriptors = map[string]string{
	"@yearly":   "0 0 0 1 1 *",
	"@annually": "0 0 0 1 1 *",
	"@monthly":  "0 0 0 1 * *",
	"@weekly":   "0 0 0 * * 0",
	"@daily":    "0 0 0 * * *",
	"@midnight": "0 0 0 * * *",
	"@hourly":   "0 0 * * * *",
}

const descriptorList = "@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, @every <duration> or @at <RFC 3339 time>"

// parseSpec validates spec and resolves its H fields for task id. It checks
// at least everything robfig's parser checks, so that robfig never sees an
// input it would refuse, misread (it reads "*-5" as "*") or panic on.
func parseSpec(spec, id string) (parsed, error) {
	fail := func(format string, args ...any) (parsed, error) {
		return parsed{}, &Error{Input: spec, Reason: fmt.Sprintf(format, args...)}
	}
	s := strings.TrimSpace(spec)
	if s == "" {
		return fail("empty schedule: want 5 or 6 cron fields or a descriptor such as @hourly")
	}
	// robfig v3.0.1 panics on some of these ("TZ=x" without a space); the
	// zone has its own field anyway.
	if strings.HasPrefix(s, "TZ=") || strings.HasPrefix(s, "CRON_TZ=") {
		return fail("time zone prefixes are not supported: remove the prefix and put the zone in the timezone field")
	}
	if s[0] == '@' {
		return parseDescriptor(spec, s)
	}
	var p parsed
	fs := strings.Fields(s)
	switch len(fs) {
	case 5:
		p.fields[0] = "0"
		copy(p.fields[1:], fs)
	case 6:
		copy(p.fields[:], fs)
	default:
		return fail("want 5 fields (minute hour day-of-month month day-of-week) or 6 (second first), found %d", len(fs))
	}
	for i := range p.fields {
		r, reason := resolveField(p.fields[i], i, id)
		if reason != "" {
			return fail("%s", reason)
		}
		p.fields[i] = r
	}
	p.resolved = strings.Join(p.fields[:], " ")
	return p, nil
}

func parseDescriptor(spec, s string) (parsed, error) {
	fail := func(format string, args ...any) (parsed, error) {
		return parsed{}, &Error{Input: spec, Reason: fmt.Sprintf(format, args...)}
	}
	fs := strings.Fields(s)
	if fs[0] == "@every" {
		if len(fs) != 2 {
			return fail("want @every <duration>, e.g. @every 30s")
		}
		d, err := time.ParseDuration(fs[1])
		if err != nil {
			return fail("interval %q is not a duration such as 30s or 1h30m", fs[1])
		}
		if d < time.Second || d%time.Second != 0 {
			return fail("interval must be whole seconds and at least 1s")
		}
		return parsed{resolved: "@every " + d.String(), every: int64(d / time.Second)}, nil
	}
	if fs[0] == "@at" {
		// Checked here for Resolve, which has no zone: the zone only moves
		// a time without offset, so "UTC" checks the form.
		if _, err := parseAt(spec, s, ""); err != nil {
			return parsed{}, err
		}
		return parsed{resolved: "@at " + fs[1]}, nil
	}
	r, ok := descriptors[fs[0]]
	if !ok {
		return fail("unknown descriptor %q (want %s)", fs[0], descriptorList)
	}
	if len(fs) > 1 {
		return fail("%s takes no arguments", fs[0])
	}
	p := parsed{resolved: r}
	copy(p.fields[:], strings.Fields(r))
	return p, nil
}

// resolveField checks field text f at position i and replaces its H
// elements by numbers. It returns the resolved text, or a reason.
func resolveField(f string, i int, id string) (string, string) {
	d := &fields[i]
	if !strings.Contains(f, "H") {
		for _, el := range strings.Split(f, ",") {
			if reason := d.checkElement(el, f); reason != "" {
				return "", reason
			}
		}
		return f, ""
	}
	var b strings.Builder
	for j, el := range strings.Split(f, ",") {
		if j > 0 {
			b.WriteByte(',')
		}
		if el == "" || el[0] != 'H' { // no month or day name starts with H
			if reason := d.checkElement(el, f); reason != "" {
				return "", reason
			}
			b.WriteString(el)
			continue
		}
		r, reason := d.resolveH(el, i, id)
		if reason != "" {
			return "", reason
		}
		b.WriteString(r)
	}
	return b.String(), ""
}

// checkElement checks one element of a list: *, ?, a, a-b, each optionally
// followed by /step. f is the whole field, for messages.
func (d *field) checkElement(el, f string) string {
	if el == "" {
		return fmt.Sprintf("%s %q has an empty list element", d.name, f)
	}
	base, stepText, hasStep := strings.Cut(el, "/")
	if hasStep {
		if _, reason := d.step(stepText, el, d.max-d.min+1); reason != "" {
			return reason
		}
	}
	if base == "*" || base == "?" {
		return ""
	}
	loText, hiText, isRange := strings.Cut(base, "-")
	lo, reason := d.value(loText, el)
	if reason != "" {
		return reason
	}
	if !isRange {
		return ""
	}
	hi, reason := d.value(hiText, el)
	if reason != "" {
		return reason
	}
	if lo > hi {
		return fmt.Sprintf("%s %s: range starts after it ends (ranges do not wrap around: write %s-%d,%d-%s)",
			d.name, el, loText, d.max, d.min, hiText)
	}
	return ""
}

// value parses a number or a name of the field, within robfig's range.
func (d *field) value(text, el string) (int, string) {
	if text == "" {
		return 0, fmt.Sprintf("%s %q: missing number", d.name, el)
	}
	if isDigits(text) {
		n, err := strconv.Atoi(text)
		if err != nil || n < d.min || n > d.max {
			reason := fmt.Sprintf("%s %s out of range %d-%d", d.name, text, d.min, d.max)
			switch {
			case d.name == "day-of-week" && n == 7:
				reason += " (Sunday is 0 or sun)"
			case d.name == "day-of-week" && err == nil && n >= 1970 && n <= 9999: // a year
				reason += " (a schedule has no year field: bound its fires with not_before and not_after, or use @at)"
			}
			return 0, reason
		}
		return n, ""
	}
	if d.names != nil {
		if n, ok := d.names[strings.ToLower(text)]; ok {
			return n, ""
		}
	}
	return 0, fmt.Sprintf("%s %q is not a number%s", d.name, text, d.nameHint)
}

// step parses the step after a /, at least 1 and at most span: a larger step
// would select the start value only, which is never what "*/90" in the minute
// field meant.
func (d *field) step(text, el string, span int) (int, string) {
	if !isDigits(text) {
		return 0, fmt.Sprintf("%s %s: step %q is not a number", d.name, el, text)
	}
	n, err := strconv.Atoi(text)
	if err == nil && n == 0 {
		return 0, fmt.Sprintf("%s %s: step must be at least 1", d.name, el)
	}
	if err != nil || n > span {
		return 0, fmt.Sprintf("%s %s: step %s is larger than the %d values it steps through (for intervals use @every, e.g. @every 90m)",
			d.name, el, text, span)
	}
	return n, ""
}

// resolveH resolves H, H/n, H(a-b) or H(a-b)/n at field position i for task
// id, following the rule in doc.go.
func (d *field) resolveH(el string, i int, id string) (string, string) {
	const want = "want H, H/n, H(a-b) or H(a-b)/n"
	rest := el[1:]
	a, b := d.hmin, d.hmax
	if strings.HasPrefix(rest, "(") {
		end := strings.IndexByte(rest, ')')
		if end < 0 {
			return "", fmt.Sprintf("%s %s: missing ) (%s)", d.name, el, want)
		}
		inner := rest[1:end]
		rest = rest[end+1:]
		loText, hiText, ok := strings.Cut(inner, "-")
		if !ok {
			return "", fmt.Sprintf("%s %s: want a range in H(a-b), e.g. H(%d-%d)", d.name, el, d.hmin, d.hmin+d.hmax/2)
		}
		var reason string
		if a, reason = d.value(loText, el); reason != "" {
			return "", reason
		}
		if b, reason = d.value(hiText, el); reason != "" {
			return "", reason
		}
		if a < d.hmin || b > d.hmax {
			return "", fmt.Sprintf("%s %s: the range of H must lie within %d-%d", d.name, el, d.hmin, d.hmax)
		}
		if a > b {
			return "", fmt.Sprintf("%s %s: range starts after it ends", d.name, el)
		}
	}
	step := 0
	if rest != "" {
		if rest[0] != '/' {
			return "", fmt.Sprintf("%s %q: %s", d.name, el, want)
		}
		var reason string
		if step, reason = d.step(rest[1:], el, b-a+1); reason != "" {
			return "", reason
		}
	}
	h := hashField(id, i)
	if step == 0 {
		return strconv.Itoa(a + int(h%uint64(b-a+1))), ""
	}
	start := a + int(h%uint64(step))
	return strconv.Itoa(start) + "-" + strconv.Itoa(b) + "/" + strconv.Itoa(step), ""
}

// hashField is h of doc.go: XXH64 of the task id, a zero byte and the
// field's index as an ASCII digit. It must never change.
func hashField(id string, i int) uint64 {
	d := xxhash.New()
	_, _ = d.WriteString(id)
	_, _ = d.Write([]byte{0, byte('0' + i)})
	return d.Sum64()
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
