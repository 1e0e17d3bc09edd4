package api

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/shardcron/shardcron/task"
)

// decodeObject decodes a small request body, one JSON object, into dst.
// Unknown fields, a field given twice (`{"dry_run": true, "dry_run":
// false}` must not act as one of them at random) and values of the wrong
// type are refused with the field named in the JSON's terms, not Go's.
//
// A string given as null inside one of the body's fields (a label's value,
// an id of a list) is refused too, as in a task: decoded as "", a selector
// {"labels": {"team": null}} chose the tasks whose team label is empty. A
// field of the body itself given as null is left out, as in a task; the
// body itself given as null is refused: it is no object, and a pause or a
// trigger took it for an empty one.
func decodeObject(b []byte, dst any) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return errors.New("the body: want an object, got null")
	}
	err := jsonv2.Unmarshal(b, dst, jsonv2.RejectUnknownMembers(true), nullElements)
	var se *jsonv2.SemanticError
	var sy *jsontext.SyntacticError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &sy) && errors.Is(sy.Err, jsontext.ErrDuplicateName):
		return fmt.Errorf("%s: given twice", jsonField(sy.JSONPointer))
	case errors.As(err, &sy):
		return fmt.Errorf("malformed JSON at byte %d: %v", sy.ByteOffset, sy.Err)
	case !errors.As(err, &se):
		return err
	case errors.Is(se.Err, errNullElement):
		return fmt.Errorf("%s: want a string, got null", jsonField(se.JSONPointer))
	case errors.Is(se.Err, jsonv2.ErrUnknownName):
		return fmt.Errorf("%s: unknown field", jsonField(se.JSONPointer))
	case errors.Is(se.Err, strconv.ErrRange):
		return fmt.Errorf("%s: %s is out of range", jsonField(se.JSONPointer), se.JSONValue)
	case se.GoType == reflect.TypeFor[time.Time]():
		return fmt.Errorf("%s: want an RFC 3339 time such as 2026-01-02T15:04:05Z", jsonField(se.JSONPointer))
	case se.GoType != nil && se.JSONKind != 0:
		return fmt.Errorf("%s: want %s, got %s", jsonField(se.JSONPointer), jsonWant(se.GoType), task.KindName(se.JSONKind))
	}
	return fmt.Errorf("%s: %v", jsonField(se.JSONPointer), se.Err)
}

// bodyFields says what a small body decoded into dst may be, by the JSON
// names of dst's fields: {"body", "payload"}, or no body, or {}, for a
// request that takes none (a resume).
func bodyFields(dst any) string {
	var names []string
	for f := range reflect.TypeOf(dst).Elem().Fields() {
		n, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		names = append(names, strconv.Quote(n))
	}
	if len(names) == 0 {
		return "no body, or {}"
	}
	return "{" + strings.Join(names, ", ") + "}"
}

// errNullElement is nullElements' refusal.
var errNullElement = errors.New("null in a string's place")

// nullElements refuses null for a string below the body's own fields:
// their elements cannot be left out, so null there is no string.
var nullElements = jsonv2.WithUnmarshalers(jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, _ *string) error {
	if dec.StackDepth() > 1 && dec.PeekKind() == 'n' {
		return errNullElement
	}
	return jsonv2.SkipFunc
}))

// jsonField names the field at p, "labels.team"; the body itself at the
// top.
func jsonField(p jsontext.Pointer) string {
	if p == "" {
		return "the body"
	}
	return task.FieldPath(p)
}

// jsonWant says what JSON a Go type takes.
func jsonWant(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "another type"
}
