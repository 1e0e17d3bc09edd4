package store

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/shardcron/shardcron/task"
)

// Record value encoding, version 1 (the task id is in the key):
//
//	byte    version (1)
//	byte    flags: bit 0 scheduled_at set, bit 1 started_at set,
//	        bit 2 finished_at set, bit 3 status is a string (not a code)
//	varint  scheduled_at Unix ns            (if set)
//	varint  started_at - scheduled_at ns    (if set; from 0 if scheduled_at is not)
//	varint  finished_at - started_at ns     (if set; from the previous time)
//	varint  attempt
//	byte    status code (1..6)  or  uvarint len + bytes
//	uvarint len + node
//	uvarint len + error
//	uvarint len + output                    (if flags bit 4: a task's capture)
//
// Deltas keep the common record (all three times within seconds of each
// other) to about 30 bytes plus the node name.
const recordVersion = 1

const (
	flagScheduled = 1 << iota
	flagStarted
	flagFinished
	flagStatusString
	flagOutput // the record ends with the captured output
)

var statusCodes = [...]string{1: task.ExecutionOK, 2: task.ExecutionFailed, 3: task.ExecutionTimeout, 4: task.ExecutionSkipped, 5: task.ExecutionMisfired, 6: task.ExecutionCanceled}

func statusCode(s string) byte {
	for i := 1; i < len(statusCodes); i++ {
		if statusCodes[i] == s {
			return byte(i)
		}
	}
	return 0
}

var errBadRecord = errors.New("store: malformed execution record")

// appendRecord appends the encoding of e (without its task id) to b.
func appendRecord(b []byte, e *task.Execution) []byte {
	var flags byte
	if !e.ScheduledAt.IsZero() {
		flags |= flagScheduled
	}
	if !e.StartedAt.IsZero() {
		flags |= flagStarted
	}
	if !e.FinishedAt.IsZero() {
		flags |= flagFinished
	}
	code := statusCode(e.Status)
	if code == 0 {
		flags |= flagStatusString
	}
	if e.Output != "" {
		flags |= flagOutput
	}
	b = append(b, recordVersion, flags)
	var prev int64
	for i, t := range [3]time.Time{e.ScheduledAt, e.StartedAt, e.FinishedAt} {
		if flags&(1<<i) == 0 {
			continue
		}
		ns := t.UnixNano()
		b = binary.AppendVarint(b, ns-prev)
		prev = ns
	}
	b = binary.AppendVarint(b, int64(e.Attempt))
	if code != 0 {
		b = append(b, code)
	} else {
		b = appendString(b, e.Status)
	}
	b = appendString(b, e.Node)
	b = appendString(b, e.Error)
	if flags&flagOutput != 0 {
		b = appendString(b, e.Output)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// recordSize is an upper bound of len(appendRecord(nil, e)).
func recordSize(e *task.Execution) int {
	return 2 + 3*binary.MaxVarintLen64 + binary.MaxVarintLen64 +
		4*binary.MaxVarintLen64 + len(e.Status) + len(e.Node) + len(e.Error) + len(e.Output)
}

// decodeRecord decodes a value written by appendRecord into e, leaving
// e.TaskID alone. It never panics, whatever b holds.
func decodeRecord(b []byte, e *task.Execution) error {
	if len(b) < 2 || b[0] != recordVersion {
		return errBadRecord
	}
	flags := b[1]
	if flags&^(flagScheduled|flagStarted|flagFinished|flagStatusString|flagOutput) != 0 {
		return errBadRecord
	}
	b = b[2:]
	var prev int64
	times := [3]*time.Time{&e.ScheduledAt, &e.StartedAt, &e.FinishedAt}
	for i, t := range times {
		*t = time.Time{}
		if flags&(1<<i) == 0 {
			continue
		}
		d, n := binary.Varint(b)
		if n <= 0 {
			return errBadRecord
		}
		b = b[n:]
		prev += d
		*t = time.Unix(0, prev).UTC()
	}
	a, n := binary.Varint(b)
	if n <= 0 || int64(int(a)) != a {
		return errBadRecord
	}
	e.Attempt = int(a)
	b = b[n:]
	if flags&flagStatusString == 0 {
		if len(b) < 1 || b[0] == 0 || int(b[0]) >= len(statusCodes) {
			return errBadRecord
		}
		e.Status = statusCodes[b[0]]
		b = b[1:]
	} else {
		var ok bool
		if e.Status, b, ok = readString(b); !ok {
			return errBadRecord
		}
	}
	var ok bool
	if e.Node, b, ok = readString(b); !ok {
		return errBadRecord
	}
	if e.Error, b, ok = readString(b); !ok {
		return errBadRecord
	}
	e.Output = ""
	if flags&flagOutput != 0 {
		if e.Output, b, ok = readString(b); !ok {
			return errBadRecord
		}
	}
	if len(b) != 0 {
		return errBadRecord
	}
	return nil
}

func readString(b []byte) (string, []byte, bool) {
	l, n := binary.Uvarint(b)
	if n <= 0 || l > uint64(len(b)-n) {
		return "", nil, false
	}
	b = b[n:]
	return string(b[:l]), b[l:], true
}
