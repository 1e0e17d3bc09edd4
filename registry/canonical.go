package registry

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/shardcron/shardcron/task"
)

// A shape is how encoding/json writes a Go type, as far as stored tasks
// use it. canonical checks that a JSON text is exactly what json.Marshal
// (without HTML escaping) would write for the value json.Unmarshal reads
// from it: then the text can be passed on as is, and decoding it and
// encoding it again would only give the same bytes back. A text that is
// not canonical (written by hand, or by a version with other fields or
// defaults) is refused, never guessed at: its reader decodes it instead.
type shape struct {
	kind   shapeKind
	fields []shapeField // kindStruct, in the struct's order
	elem   *shape       // kindPtr, kindSlice, kindMap (the values)
	bits   int          // kindInt, kindUint
}

type shapeKind uint8

const (
	kindString shapeKind = iota
	kindBool
	kindInt
	kindUint
	kindDuration // task.Duration: a duration string
	kindTime     // time.Time: an RFC 3339 string
	kindRaw      // json.RawMessage: any JSON, compacted
	kindStruct
	kindPtr
	kindSlice
	kindMap // string keys
)

type shapeField struct {
	name      string
	omitEmpty bool
	omitZero  bool // only on kindTime (time's IsZero)
	shape     *shape
}

var (
	typeTime     = reflect.TypeFor[time.Time]()
	typeDuration = reflect.TypeFor[task.Duration]()
	typeRaw      = reflect.TypeFor[json.RawMessage]()
	typeMarsh    = reflect.TypeFor[json.Marshaler]()
	typeText     = reflect.TypeFor[encoding.TextMarshaler]()
)

// shapeOf returns the shape of t, or an error naming the part of t it
// cannot follow (a type with its own encoding, an embedded struct, a
// tag option it does not know): the caller then never passes JSON of t
// through.
func shapeOf(t reflect.Type) (*shape, error) {
	switch t {
	case typeTime:
		return &shape{kind: kindTime}, nil
	case typeDuration:
		return &shape{kind: kindDuration}, nil
	case typeRaw:
		return &shape{kind: kindRaw}, nil
	}
	if t.Implements(typeMarsh) || reflect.PointerTo(t).Implements(typeMarsh) ||
		t.Implements(typeText) || reflect.PointerTo(t).Implements(typeText) {
		return nil, fmt.Errorf("%s has its own JSON encoding", t)
	}
	switch t.Kind() {
	case reflect.String:
		return &shape{kind: kindString}, nil
	case reflect.Bool:
		return &shape{kind: kindBool}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return &shape{kind: kindInt, bits: t.Bits()}, nil
	case reflect.Uint, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return &shape{kind: kindUint, bits: t.Bits()}, nil
	case reflect.Pointer:
		return elemShape(kindPtr, t)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return nil, fmt.Errorf("%s is written as base64", t)
		}
		return elemShape(kindSlice, t)
	case reflect.Map:
		if t.Key() != reflect.TypeFor[string]() {
			return nil, fmt.Errorf("%s has keys other than plain strings", t)
		}
		return elemShape(kindMap, t)
	case reflect.Struct:
		return structShape(t)
	}
	return nil, fmt.Errorf("%s: kind %s is not followed", t, t.Kind())
}

func elemShape(kind shapeKind, t reflect.Type) (*shape, error) {
	elem, err := shapeOf(t.Elem())
	if err != nil {
		return nil, err
	}
	return &shape{kind: kind, elem: elem}, nil
}

func structShape(t reflect.Type) (*shape, error) {
	s := &shape{kind: kindStruct}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if !f.IsExported() || tag == "-" {
			continue
		}
		if f.Anonymous {
			return nil, fmt.Errorf("%s.%s is embedded", t, f.Name)
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		sf := shapeField{name: name}
		for _, o := range strings.Split(opts, ",") {
			switch o {
			case "":
			case "omitempty":
				sf.omitEmpty = true
			case "omitzero":
				sf.omitZero = true
			default:
				return nil, fmt.Errorf("%s.%s: tag option %q is not followed", t, f.Name, o)
			}
		}
		fs, err := shapeOf(f.Type)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", t, f.Name, err)
		}
		if sf.omitZero && (sf.omitEmpty || fs.kind != kindTime) {
			return nil, fmt.Errorf("%s.%s: omitzero is followed on a time alone", t, f.Name)
		}
		if sf.omitEmpty && (fs.kind == kindStruct || fs.kind == kindTime) {
			return nil, fmt.Errorf("%s.%s: omitempty on a struct", t, f.Name)
		}
		sf.shape = fs
		s.fields = append(s.fields, sf)
	}
	return s, nil
}

// canonical checks that b[i:] begins with a canonical value of s; it
// returns the offset after the value, and whether the value is empty as
// omitempty means it (the encoder would leave its field out).
func (s *shape) canonical(b []byte, i int) (end int, empty, ok bool) {
	if i >= len(b) {
		return 0, false, false
	}
	switch s.kind {
	case kindString:
		end, ok = canonicalString(b, i)
		return end, end == i+2, ok
	case kindBool:
		switch {
		case bytes.HasPrefix(b[i:], []byte("true")):
			return i + 4, false, true
		case bytes.HasPrefix(b[i:], []byte("false")):
			return i + 5, true, true
		}
		return 0, false, false
	case kindInt, kindUint:
		return s.canonicalInt(b, i)
	case kindDuration:
		var d task.Duration
		return roundTrips(b, i, &d, func() bool { return d == 0 })
	case kindTime:
		var t time.Time
		return roundTrips(b, i, &t, func() bool { return t.IsZero() })
	case kindRaw:
		if bytes.HasPrefix(b[i:], []byte("null")) {
			return 0, false, false // read as "null", an edge not worth following
		}
		end, ok = compactValue(b, i, 0)
		return end, false, ok
	case kindPtr:
		if bytes.HasPrefix(b[i:], []byte("null")) {
			return i + 4, true, true
		}
		end, _, ok = s.elem.canonical(b, i)
		return end, false, ok
	case kindSlice:
		return s.canonicalSlice(b, i)
	case kindMap:
		return s.canonicalMap(b, i)
	case kindStruct:
		end, _, ok = s.canonicalStruct(b, i, nil)
		return end, false, ok
	}
	return 0, false, false
}

// roundTrips checks a string that v reads and writes back as it is; empty
// tells whether v is then empty.
func roundTrips(b []byte, i int, v interface {
	json.Marshaler
	json.Unmarshaler
}, empty func() bool) (end int, isEmpty, ok bool) {
	end, ok = canonicalString(b, i)
	if !ok || v.UnmarshalJSON(b[i:end]) != nil {
		return 0, false, false
	}
	out, err := v.MarshalJSON()
	return end, empty(), err == nil && bytes.Equal(out, b[i:end])
}

func (s *shape) canonicalInt(b []byte, i int) (end int, empty, ok bool) {
	j := i
	if j < len(b) && b[j] == '-' && s.kind == kindInt {
		j++
	}
	d := j
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	switch {
	case j == d, b[d] == '0' && j > d+1, b[d] == '0' && d > i: // no digit, a leading 0, -0
		return 0, false, false
	}
	if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E') {
		return 0, false, false
	}
	var err error
	if s.kind == kindInt {
		_, err = strconv.ParseInt(string(b[i:j]), 10, s.bits)
	} else {
		_, err = strconv.ParseUint(string(b[i:j]), 10, s.bits)
	}
	return j, j == i+1 && b[i] == '0', err == nil
}

func (s *shape) canonicalSlice(b []byte, i int) (end int, empty, ok bool) {
	if bytes.HasPrefix(b[i:], []byte("null")) {
		return i + 4, true, true
	}
	end, n, ok := elements(b, i, '[', ']', func(i, _ int) (int, bool) {
		end, _, ok := s.elem.canonical(b, i)
		return end, ok
	})
	return end, n == 0, ok
}

// canonicalMap: the encoder sorts a map's keys; a key with an escape is
// refused, so that its bytes order as its string does.
func (s *shape) canonicalMap(b []byte, i int) (end int, empty, ok bool) {
	if bytes.HasPrefix(b[i:], []byte("null")) {
		return i + 4, true, true
	}
	var prev []byte
	end, n, ok := elements(b, i, '{', '}', func(i, n int) (int, bool) {
		key, j, ok := plainKey(b, i)
		if !ok || (n > 0 && bytes.Compare(key, prev) <= 0) {
			return 0, false
		}
		prev = key
		end, _, ok := s.elem.canonical(b, j)
		return end, ok
	})
	return end, n == 0, ok
}

// canonicalStruct checks an object of s's fields, in their order, with
// every field the encoder writes and none it leaves out; closing is the
// offset of its '}'. at, when not nil, is called with each field's index
// and the offset of its key before the field is checked; it returns false
// to refuse the field.
func (s *shape) canonicalStruct(b []byte, i int, at func(field, off int) bool) (end int, closing int, ok bool) {
	next := 0 // the first field that may come
	end, _, ok = elements(b, i, '{', '}', func(i, _ int) (int, bool) {
		key, j, ok := plainKey(b, i)
		if !ok {
			return 0, false
		}
		k := next
		for k < len(s.fields) && s.fields[k].name != string(key) {
			if !s.fields[k].omitEmpty && !s.fields[k].omitZero {
				return 0, false // skipped over a field the encoder would write
			}
			k++
		}
		if k == len(s.fields) || (at != nil && !at(k, i)) {
			return 0, false // unknown, out of order, repeated or refused
		}
		f := s.fields[k]
		end, empty, ok := f.shape.canonical(b, j)
		if !ok || (empty && (f.omitEmpty || f.omitZero)) {
			return 0, false
		}
		next = k + 1
		return end, true
	})
	if !ok {
		return 0, 0, false
	}
	for _, f := range s.fields[next:] {
		if !f.omitEmpty && !f.omitZero {
			return 0, 0, false // the encoder would write it
		}
	}
	return end, end - 1, true
}

// elements checks the array or object at b[i:], opened by open and closed
// by close, its elements separated by commas and each checked by elem
// (given its offset and its index, it returns the offset after it). It
// returns the offset after the close and how many elements it holds.
func elements(b []byte, i int, open, close byte, elem func(i, n int) (int, bool)) (end, n int, ok bool) {
	if i >= len(b) || b[i] != open {
		return 0, 0, false
	}
	i++
	for n = 0; ; n++ {
		if i >= len(b) {
			return 0, 0, false
		}
		if b[i] == close {
			return i + 1, n, true
		}
		if n > 0 {
			if b[i] != ',' {
				return 0, 0, false
			}
			i++
		}
		if i, ok = elem(i, n); !ok {
			return 0, 0, false
		}
	}
}

// plainKey reads an object key without escapes and its colon; it returns
// the key and the offset of its value.
func plainKey(b []byte, i int) (key []byte, value int, ok bool) {
	end, ok := canonicalString(b, i)
	if !ok || end >= len(b) || b[end] != ':' {
		return nil, 0, false
	}
	key = b[i+1 : end-1]
	if bytes.IndexByte(key, '\\') >= 0 {
		return nil, 0, false
	}
	return key, end + 1, true
}

// canonicalString checks a JSON string as the encoder writes it (without
// HTML escaping): every byte as is but '"', '\\' and control characters,
// which are escaped as \" \\ \b \f \n \r \t or \u00xx, and U+2028 and
// U+2029, which are escaped as \u2028 and \u2029. The caller has checked
// that the text is valid UTF-8.
func canonicalString(b []byte, i int) (end int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	for j := i + 1; j < len(b); j++ {
		c := b[j]
		switch {
		case c == '"':
			return j + 1, true
		case c < 0x20:
			return 0, false
		case c == 0xE2 && j+2 < len(b) && b[j+1] == 0x80 && (b[j+2] == 0xA8 || b[j+2] == 0xA9):
			return 0, false // the encoder escapes U+2028 and U+2029
		case c == '\\':
			if j+1 >= len(b) {
				return 0, false
			}
			switch b[j+1] {
			case '"', '\\', 'b', 'f', 'n', 'r', 't':
				j++
			case 'u':
				if j+5 >= len(b) || !canonicalUnicodeEscape(string(b[j+2:j+6])) {
					return 0, false
				}
				j += 5
			default:
				return 0, false
			}
		}
	}
	return 0, false
}

// canonicalUnicodeEscape reports whether \uXXXX is how the encoder writes
// its character: U+2028, U+2029, or a control character without a short
// escape, in lower-case hex.
func canonicalUnicodeEscape(hex string) bool {
	if hex == "2028" || hex == "2029" {
		return true
	}
	if hex[:2] != "00" || hex[2] > '1' {
		return false
	}
	const digits = "0123456789abcdef"
	c := strings.IndexByte(digits, hex[3])
	if c < 0 || hex[2] < '0' {
		return false
	}
	switch c + 16*int(hex[2]-'0') {
	case '\b', '\f', '\n', '\r', '\t':
		return false
	}
	return true
}

// compactValue checks any JSON value without whitespace, as the encoder
// writes a json.RawMessage without HTML escaping: compacted, its strings
// as they are.
func compactValue(b []byte, i, depth int) (end int, ok bool) {
	if i >= len(b) || depth > 100 {
		return 0, false
	}
	switch c := b[i]; {
	case c == '"':
		return anyString(b, i)
	case c == '{':
		end, _, ok = elements(b, i, '{', '}', func(i, _ int) (int, bool) {
			if i, ok = anyString(b, i); !ok || i >= len(b) || b[i] != ':' {
				return 0, false
			}
			return compactValue(b, i+1, depth+1)
		})
		return end, ok
	case c == '[':
		end, _, ok = elements(b, i, '[', ']', func(i, _ int) (int, bool) { return compactValue(b, i, depth+1) })
		return end, ok
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	default:
		return number(b, i)
	}
}

func literal(b []byte, i int, lit string) (int, bool) {
	if !bytes.HasPrefix(b[i:], []byte(lit)) {
		return 0, false
	}
	return i + len(lit), true
}

// anyString checks a JSON string with any valid escape (the caller has
// checked that the text is valid UTF-8).
func anyString(b []byte, i int) (end int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j + 1, true
		case c < 0x20:
			return 0, false
		case c == '\\':
			if j+1 >= len(b) {
				return 0, false
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j++
			case 'u':
				if j+5 >= len(b) {
					return 0, false
				}
				for _, h := range b[j+2 : j+6] {
					if !strings.ContainsRune("0123456789abcdefABCDEF", rune(h)) {
						return 0, false
					}
				}
				j += 5
			default:
				return 0, false
			}
		}
	}
	return 0, false
}

// number checks a JSON number (RFC 8259's grammar).
func number(b []byte, i int) (end int, ok bool) {
	j := i
	if j < len(b) && b[j] == '-' {
		j++
	}
	digits := func() int {
		k := j
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		return j - k
	}
	start := j
	if n := digits(); n == 0 || (n > 1 && b[start] == '0') {
		return 0, false
	}
	if j < len(b) && b[j] == '.' {
		j++
		if digits() == 0 {
			return 0, false
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if digits() == 0 {
			return 0, false
		}
	}
	return j, true
}

// validText reports whether b can be checked at all: valid UTF-8 (the
// decoder would replace bad bytes, and the encoder write them escaped).
func validText(b []byte) bool { return utf8.Valid(b) }
