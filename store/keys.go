package store

import (
	"encoding/binary"
	"math"
	"time"
)

// Key layout (see doc.go). Every key starts with a one-letter namespace and
// a slash so the namespaces never share a prefix.
const (
	nsTask     = "t/" // t/<partition uint32 BE>/<task id>   -> task value (opaque)
	nsRevision = "r/" // r/<partition uint32 BE>             -> synced revision (int64 BE)
	nsHistory  = "h/" // h/<task id>\x00<suffix>             -> encoded Execution

	// historySuffixLen is ^scheduled_at ms (8) + ^attempt (4) + ^seq (8).
	historySuffixLen = 8 + 4 + 8
)

// taskPrefix is "t/<p>/": every cached task of p, and nothing else.
func taskPrefix(p uint32) []byte {
	b := make([]byte, 0, len(nsTask)+5)
	b = append(b, nsTask...)
	b = binary.BigEndian.AppendUint32(b, p)
	return append(b, '/')
}

func taskKey(p uint32, id string) []byte {
	b := make([]byte, 0, len(nsTask)+5+len(id))
	b = append(b, nsTask...)
	b = binary.BigEndian.AppendUint32(b, p)
	b = append(b, '/')
	return append(b, id...)
}

func revisionKey(p uint32) []byte {
	b := make([]byte, 0, len(nsRevision)+4)
	b = append(b, nsRevision...)
	return binary.BigEndian.AppendUint32(b, p)
}

// historyPrefix is "h/<task id>\x00". A task id holds no control character,
// so no other task's keys start with it; a key under it whose length is
// not exactly prefix+historySuffixLen is not one of this task's records
// (it could only come from an id containing \x00) and is skipped.
func historyPrefix(taskID string) []byte {
	b := make([]byte, 0, len(nsHistory)+len(taskID)+1+historySuffixLen)
	b = append(b, nsHistory...)
	b = append(b, taskID...)
	return append(b, 0)
}

// appendHistoryKey appends the key of a record: the prefix, then the
// scheduled time in ms, the attempt and a per-store sequence number, each
// bit-inverted so that a forward scan of the prefix yields the newest
// scheduled time first, then the highest attempt, then the last recorded.
// The sequence number only keeps two records of the same fire and attempt
// apart.
func appendHistoryKey(b []byte, taskID string, scheduledAt time.Time, attempt int, seq uint64) []byte {
	b = append(b, nsHistory...)
	b = append(b, taskID...)
	b = append(b, 0)
	// Flipping the sign bit orders signed milliseconds as unsigned.
	ms := uint64(scheduledAt.UnixMilli()) ^ (1 << 63)
	b = binary.BigEndian.AppendUint64(b, ^ms)
	b = binary.BigEndian.AppendUint32(b, ^clampAttempt(attempt))
	return binary.BigEndian.AppendUint64(b, ^seq)
}

func clampAttempt(a int) uint32 {
	switch {
	case a < 0:
		return 0
	case uint64(a) > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(a)
}
