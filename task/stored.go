package task

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
)

// Reading task JSON that shardcron wrote, and passing stored tasks on as
// responses, through github.com/go-json-experiment/json (the Go team's
// encoding/json/v2 prototype): about twice as fast as encoding/json on a
// stored task (BenchmarkDecodeStored), with a tokenizer (jsontext) that
// checks JSON without decoding it. The registry writes stored tasks with encoding/json
// (marshalStored), and only it writes them.

// jsonOptions make json v2 read as encoding/json does what the encoder
// can write: a name given twice and invalid UTF-8 (both can be in a
// handler's payload, which is any JSON the user gave) are read, not
// refused.
var jsonOptions = jsonv2.JoinOptions(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))

// storedOptions also match names as encoding/json does: a
// case-insensitive match when no name matches exactly, '_' and '-'
// significant.
var storedOptions = jsonv2.JoinOptions(jsonOptions, jsonv2.MatchCaseInsensitiveNames(true), jsonv1.MatchCaseSensitiveDelimiter(true))

// DecodeStored reads JSON that shardcron wrote into v, which it overwrites
// as json.Unmarshal would into a zero value: a stored task into a *Task, or
// into a struct of some of Task's fields (the rest are skipped), and API
// answers that hold tasks. What it reads, json.Unmarshal reads the same,
// and what the encoder writes it reads (FuzzDecodeStored checks both). It
// applies no default and checks nothing (DecodeTask does both).
func DecodeStored(data []byte, v any) error {
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv.Elem().SetZero() // json v2 merges into what v holds
	}
	return jsonv2.Unmarshal(data, v, storedOptions)
}

// unmarshal is json.Unmarshal, faster on what it reads (DecodeTask's
// fields; DecodeTask takes a quarter less time with it): json v2 reads
// data, and json.Unmarshal does only when v2 refuses it, into a v set back to its zero value. Errors are thus
// encoding/json's own, and whatever json v2 refuses that encoding/json
// reads is read as encoding/json reads it (FuzzUnmarshal).
func unmarshal(data []byte, v any) error {
	if jsonv2.Unmarshal(data, v, jsonOptions) == nil {
		return nil
	}
	reflect.ValueOf(v).Elem().SetZero()
	return json.Unmarshal(data, v)
}

// ErrStoredOutputField is AppendResponse's refusal of a stored task that
// holds a field only responses write.
var ErrStoredOutputField = errors.New("task: a stored task holds partition, version or state")

// afterVersion are the fields of Task after version, which a response
// writes after partition and version (the encoder keeps the struct's
// order).
var afterVersion = fieldsAfter("version")

func fieldsAfter(name string) map[string]bool {
	after := map[string]bool{}
	seen := false
	for f := range reflect.TypeFor[Task]().Fields() {
		n, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if seen {
			after[strconv.Quote(n)] = true
		}
		seen = seen || n == name
	}
	return after
}

// outputFields are the fields only responses write.
var outputFields = [][]byte{[]byte("partition"), []byte("version"), []byte("state")}

// outputField reports whether name, a member's name as it is written
// (quoted, maybe escaped), is one that encoding/json reads as an output
// field: in any case, as it matches names.
func outputField(name jsontext.Value) bool {
	n := name[1 : len(name)-1]
	if bytes.IndexByte(n, '\\') >= 0 {
		var err error
		if n, err = jsontext.AppendUnquote(nil, name); err != nil {
			return true // not reached: the decoder read a valid name
		}
	}
	for _, f := range outputFields {
		if bytes.EqualFold(n, f) {
			return true
		}
	}
	return false
}

// responses are the tokenizers of AppendResponse.
var responses = sync.Pool{New: func() any { return new(responseReader) }}

type responseReader struct {
	in  bytes.Buffer // aliased by dec: read in place, not copied
	dec jsontext.Decoder
}

// AppendResponse appends stored, a task's JSON as the registry stores it,
// with the output-only fields partition and version (when not 0) where the
// encoder writes them, without decoding it: for a stored task as the
// registry writes it (marshalStored), the bytes of decoding it, setting
// those two and encoding it again. stored is checked as JSON, not as a task:
// an error when it is not one JSON object or holds partition, version or
// state (ErrStoredOutputField); a value written by hand that is such an
// object is passed on as it is. dst is returned as it is on error.
func AppendResponse(dst, stored []byte, partition int, version int64) ([]byte, error) {
	r := responses.Get().(*responseReader)
	defer responses.Put(r)
	r.in = *bytes.NewBuffer(stored)
	r.dec.Reset(&r.in, jsonOptions)
	defer r.dec.Reset(&r.in) // drop stored before the pool keeps r

	if tok, err := r.dec.ReadToken(); err != nil {
		return dst, err
	} else if tok.Kind() != '{' {
		return dst, fmt.Errorf("task: stored task is JSON %v, not an object", tok.Kind())
	}
	// insert is where partition and version go: before the first field
	// that comes after them, else before the closing brace.
	insert, before, after := -1, 0, false
	for n := 0; r.dec.PeekKind() != '}'; n++ {
		off := int(r.dec.InputOffset()) // the end of the previous value
		name, err := r.dec.ReadValue()
		if err != nil {
			return dst, err
		}
		if outputField(name) {
			return dst, ErrStoredOutputField
		}
		if insert < 0 && afterVersion[string(name)] {
			insert, before, after = off, n, true
		}
		if err := r.dec.SkipValue(); err != nil {
			return dst, err
		}
		if insert < 0 {
			before = n + 1
		}
	}
	end := int(r.dec.InputOffset())
	if _, err := r.dec.ReadToken(); err != nil {
		return dst, err
	}
	if _, err := r.dec.ReadToken(); err == nil {
		return dst, errors.New("task: stored task has data after its object")
	} else if !errors.Is(err, io.EOF) {
		return dst, err
	}
	if insert < 0 {
		insert = end
	}
	dst = append(dst, stored[:insert]...)
	if before > 0 {
		dst = append(dst, ',')
	}
	dst = strconv.AppendInt(append(dst, `"partition":`...), int64(partition), 10)
	if version != 0 { // omitempty
		dst = strconv.AppendInt(append(dst, `,"version":`...), version, 10)
	}
	if before == 0 && after {
		dst = append(dst, ',')
	}
	return append(dst, stored[insert:]...), nil
}
