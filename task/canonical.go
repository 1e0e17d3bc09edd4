package task

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// A shape is how encoding/json writes a Go type, as far as tasks use it.
// A JSON text is canonical for a shape when it is exactly what the
// encoder (without HTML escaping, as the registry stores tasks) writes for
// the value json.Unmarshal reads from it. A canonical text can be passed on
// as it is, since decoding and encoding it again gives the same bytes, and
// read by walking it once (walk), which gives the value json.Unmarshal
// gives. A text that is not canonical (written by hand, or by a version
// with other fields or defaults) is refused, never guessed at: its reader
// falls back to encoding/json.
type shape struct {
	kind   shapeKind
	fields []shapeField // kindStruct, in the struct's order
	elem   *shape       // kindPtr, kindSlice, kindMap (the values)
	bits   int          // kindInt, kindUint
	typ    reflect.Type
}

type shapeKind uint8

const (
	kindString shapeKind = iota
	kindBool
	kindInt
	kindUint
	kindDuration // Duration: a duration string
	kindTime     // time.Time: an RFC 3339 string
	kindRaw      // json.RawMessage: any JSON, compacted
	kindStruct
	kindPtr
	kindSlice
	kindMap // string keys
)

type shapeField struct {
	name      string
	index     int // of the Go field
	omitEmpty bool
	omitZero  bool // only on kindTime (time's IsZero)
	shape     *shape
}

var (
	typeTime     = reflect.TypeFor[time.Time]()
	typeDuration = reflect.TypeFor[Duration]()
	typeRaw      = reflect.TypeFor[json.RawMessage]()
	typeMarsh    = reflect.TypeFor[json.Marshaler]()
	typeText     = reflect.TypeFor[encoding.TextMarshaler]()
)

// shapeOf returns the shape of t, or an error naming the part of t it
// cannot follow (a type with its own encoding, an embedded struct, a
// tag option it does not know): JSON of t is then always left to
// encoding/json.
func shapeOf(t reflect.Type) (*shape, error) {
	s, err := bareShape(t)
	if err != nil {
		return nil, err
	}
	s.typ = t
	return s, nil
}

func bareShape(t reflect.Type) (*shape, error) {
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
		sf := shapeField{name: name, index: i}
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

// walk checks that b[i:] begins with a canonical value of s and, when v is
// valid (settable, and zero), sets v to the value json.Unmarshal reads from
// it. It returns the offset after the value, and whether the value is
// empty as omitempty means it (the encoder would leave its field out). On
// a text that is not canonical, v may be left half set.
func (s *shape) walk(b []byte, i int, v reflect.Value) (end int, empty, ok bool) {
	if i >= len(b) {
		return 0, false, false
	}
	set := v.IsValid()
	switch s.kind {
	case kindString:
		if end, ok = canonicalString(b, i); ok && set {
			ok = setString(v, b[i+1:end-1])
		}
		return end, end == i+2, ok
	case kindBool:
		var val bool
		switch {
		case bytes.HasPrefix(b[i:], []byte("true")):
			end, val = i+4, true
		case bytes.HasPrefix(b[i:], []byte("false")):
			end = i + 5
		default:
			return 0, false, false
		}
		if set {
			v.SetBool(val)
		}
		return end, !val, true
	case kindInt, kindUint:
		return s.walkInt(b, i, v)
	case kindDuration:
		return walkDuration(b, i, v)
	case kindTime:
		return walkTime(b, i, v)
	case kindRaw:
		if bytes.HasPrefix(b[i:], []byte("null")) {
			return 0, false, false // read as "null", an edge not worth following
		}
		if end, ok = compactValue(b, i, 0); ok && set {
			v.SetBytes(bytes.Clone(b[i:end]))
		}
		return end, false, ok
	case kindPtr:
		if bytes.HasPrefix(b[i:], []byte("null")) {
			return i + 4, true, true
		}
		var elem reflect.Value
		if set {
			p := reflect.New(s.elem.typ)
			v.Set(p)
			elem = p.Elem()
		}
		end, _, ok = s.elem.walk(b, i, elem)
		return end, false, ok
	case kindSlice:
		return s.walkSlice(b, i, v)
	case kindMap:
		return s.walkMap(b, i, v)
	case kindStruct:
		end, _, ok = s.walkStruct(b, i, v, nil)
		return end, false, ok
	}
	return 0, false, false
}

// common are the values most tasks share: their enums and defaults.
var common = func() map[string]string {
	m := map[string]string{}
	for _, c := range []string{DefaultTimezone, DefaultHTTPMethod, "GET", "PUT",
		string(ExecutorHTTP), string(ExecutorExec), string(ExecutorHandler), string(ExecutorNoop),
		string(MisfireFireOnce), string(MisfireSkip), string(MisfireFireAll),
		string(ConcurrencyAllow), string(ConcurrencyForbid), string(ConcurrencyBufferOne), string(ConcurrencyReplace),
		string(NotifyFailure), string(NotifyRecovery), string(NotifyMisfire), string(CaptureFailure), string(CaptureAlways)} {
		m[c] = c
	}
	return m
}()

// setString sets v to the JSON string body raw (canonical: any escape is
// one Go's strconv reads the same).
func setString(v reflect.Value, raw []byte) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		if c, ok := common[string(raw)]; ok {
			v.SetString(c) // shared, not allocated again for every task
			return true
		}
		v.SetString(string(raw))
		return true
	}
	str, err := strconv.Unquote(`"` + string(raw) + `"`)
	if err != nil {
		return false
	}
	v.SetString(str)
	return true
}

// walkDuration reads a Duration written as Go writes it ("1m30s").
func walkDuration(b []byte, i int, v reflect.Value) (end int, empty, ok bool) {
	end, ok = canonicalString(b, i)
	if !ok {
		return 0, false, false
	}
	d, reason := parseDuration(b[i:end])
	if reason != "" || d.String() != string(b[i+1:end-1]) {
		return 0, false, false
	}
	if v.IsValid() {
		v.SetInt(int64(d))
	}
	return end, d == 0, true
}

// walkTime reads a time.Time written as its MarshalJSON writes it.
func walkTime(b []byte, i int, v reflect.Value) (end int, empty, ok bool) {
	end, ok = canonicalString(b, i)
	if !ok {
		return 0, false, false
	}
	var t time.Time
	if t.UnmarshalJSON(b[i:end]) != nil {
		return 0, false, false
	}
	var buf [64]byte
	if !bytes.Equal(t.AppendFormat(buf[:0], time.RFC3339Nano), b[i+1:end-1]) {
		return 0, false, false
	}
	if v.IsValid() {
		*v.Addr().Interface().(*time.Time) = t
	}
	return end, t.IsZero(), true
}

func (s *shape) walkInt(b []byte, i int, v reflect.Value) (end int, empty, ok bool) {
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
	if s.kind == kindInt {
		n, err := strconv.ParseInt(string(b[i:j]), 10, s.bits)
		if err != nil {
			return 0, false, false
		}
		if v.IsValid() {
			v.SetInt(n)
		}
	} else {
		n, err := strconv.ParseUint(string(b[i:j]), 10, s.bits)
		if err != nil {
			return 0, false, false
		}
		if v.IsValid() {
			v.SetUint(n)
		}
	}
	return j, j == i+1 && b[i] == '0', true
}

func (s *shape) walkSlice(b []byte, i int, v reflect.Value) (end int, empty, ok bool) {
	if bytes.HasPrefix(b[i:], []byte("null")) {
		return i + 4, true, true
	}
	if v.IsValid() {
		v.Set(reflect.MakeSlice(v.Type(), 0, 0)) // [] is an empty slice, not nil
	}
	if i, ok = open(b, i, '['); !ok {
		return 0, false, false
	}
	for n := 0; ; n++ {
		var more bool
		if i, more, ok = item(b, i, n, ']'); !ok || !more {
			return i, n == 0, ok
		}
		var elem reflect.Value
		if i, elem, ok = s.walkElem(b, i, v); !ok {
			return 0, false, false
		}
		if elem.IsValid() {
			v.Set(reflect.Append(v, elem))
		}
	}
}

// walkElem walks an element of a slice or map at b[i:], read into a new
// value (elem) when v, the slice or map, is valid.
func (s *shape) walkElem(b []byte, i int, v reflect.Value) (end int, elem reflect.Value, ok bool) {
	if v.IsValid() {
		elem = reflect.New(s.elem.typ).Elem()
	}
	end, _, ok = s.elem.walk(b, i, elem)
	return end, elem, ok
}

// walkMap: the encoder sorts a map's keys; a key with an escape is
// refused, so that its bytes order as its string does.
func (s *shape) walkMap(b []byte, i int, v reflect.Value) (end int, empty, ok bool) {
	if bytes.HasPrefix(b[i:], []byte("null")) {
		return i + 4, true, true
	}
	if v.IsValid() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	if i, ok = open(b, i, '{'); !ok {
		return 0, false, false
	}
	var prev []byte
	for n := 0; ; n++ {
		var more bool
		if i, more, ok = item(b, i, n, '}'); !ok || !more {
			return i, n == 0, ok
		}
		key, j, ok := plainKey(b, i)
		if !ok || (n > 0 && bytes.Compare(key, prev) <= 0) {
			return 0, false, false
		}
		prev = key
		var elem reflect.Value
		if i, elem, ok = s.walkElem(b, j, v); !ok {
			return 0, false, false
		}
		if elem.IsValid() {
			v.SetMapIndex(reflect.ValueOf(string(key)), elem)
		}
	}
}

// walkStruct walks an object of s's fields, in their order, with every
// field the encoder writes and none it leaves out; closing is the offset
// of its '}'. Field k of s is set in v's Go field into[k] when into is not
// nil (-1: not set), else in the field's own. at, when not nil, is called
// with each field's index and the offset of its key before the field is
// walked; it returns false to refuse the field.
func (s *shape) walkStruct(b []byte, i int, v reflect.Value, into []int, at ...func(field, off int) bool) (end int, closing int, ok bool) {
	if i, ok = open(b, i, '{'); !ok {
		return 0, 0, false
	}
	next := 0 // the first field that may come
	for n := 0; ; n++ {
		var more bool
		if i, more, ok = item(b, i, n, '}'); !ok {
			return 0, 0, false
		}
		if !more {
			break
		}
		key, j, ok := plainKey(b, i)
		if !ok {
			return 0, 0, false
		}
		k := next
		for k < len(s.fields) && s.fields[k].name != string(key) {
			if !s.fields[k].omitEmpty && !s.fields[k].omitZero {
				return 0, 0, false // skipped over a field the encoder would write
			}
			k++
		}
		if k == len(s.fields) || (len(at) > 0 && !at[0](k, i)) {
			return 0, 0, false // unknown, out of order, repeated or refused
		}
		f := s.fields[k]
		var fv reflect.Value
		switch {
		case !v.IsValid():
		case into == nil:
			fv = v.Field(f.index)
		case into[k] >= 0:
			fv = v.Field(into[k])
		}
		var empty bool
		if i, empty, ok = f.shape.walk(b, j, fv); !ok || (empty && (f.omitEmpty || f.omitZero)) {
			return 0, 0, false
		}
		next = k + 1
	}
	for _, f := range s.fields[next:] {
		if !f.omitEmpty && !f.omitZero {
			return 0, 0, false // the encoder would write it
		}
	}
	return i, i - 1, true
}

// open checks that b[i] opens an array or object and returns the offset
// after it.
func open(b []byte, i int, c byte) (int, bool) {
	return i + 1, i < len(b) && b[i] == c
}

// item moves to the n-th element of an array or object closed by close,
// at b[i:]: past the comma before it. more is false at the close, and i
// is then the offset after it.
func item(b []byte, i, n int, close byte) (at int, more, ok bool) {
	switch {
	case i >= len(b):
		return 0, false, false
	case b[i] == close:
		return i + 1, false, true
	case n == 0:
		return i, true, true
	case b[i] == ',':
		return i + 1, true, true
	}
	return 0, false, false
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
	case c == '{' || c == '[':
		close := byte('}')
		if c == '[' {
			close = ']'
		}
		i++
		for n := 0; ; n++ {
			var more bool
			if i, more, ok = item(b, i, n, close); !ok || !more {
				return i, ok
			}
			if c == '{' {
				if i, ok = anyString(b, i); !ok || i >= len(b) || b[i] != ':' {
					return 0, false
				}
				i++
			}
			if i, ok = compactValue(b, i, depth+1); !ok {
				return 0, false
			}
		}
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
