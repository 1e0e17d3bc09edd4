package store

import (
	"encoding/binary"
)

// Key layout (see doc.go). Every key starts with a one-letter namespace and
// a slash so the namespaces never share a prefix.
const (
	nsTask     = "t/" // t/<partition uint32 BE>/<task id>   -> [creation revision (int64 BE), user meta metaCreated] + task value (opaque)
	nsRevision = "r/" // r/<partition uint32 BE>             -> synced revision, task count (int64 BE each)
	nsHistory  = "e/" // e/<task id>\x00<class><slot>        -> seq (uint64 BE) + encoded task.Execution
	nsMeta     = "m/" // m/origin, m/history-seq           -> see originKey, seqKey

	// nsOldHistory held one key per execution record, without bound, in
	// versions before the per-task limits; Open deletes it.
	nsOldHistory = "h/"

	// historySuffixLen is the class letter and the slot number.
	historySuffixLen = 2
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

// originKey holds the origin of the cached partitions (SetOrigin).
var originKey = []byte(nsMeta + "origin")

// seqKey holds the highest sequence number of the execution records
// written (uint64 BE), in the same WriteBatch as they are, so that the next
// Open hands out higher ones whatever its clock says.
var seqKey = []byte(nsMeta + "history-seq")

func revisionKey(p uint32) []byte {
	b := make([]byte, 0, len(nsRevision)+4)
	b = append(b, nsRevision...)
	return binary.BigEndian.AppendUint32(b, p)
}

// historyPrefix is "e/<task id>\x00". A task id holds no control character,
// so no other task's keys start with it; a key under it whose length is
// not exactly prefix+historySuffixLen is not one of this task's records
// (it could only come from an id containing \x00) and is skipped.
func historyPrefix(taskID string) []byte {
	b := make([]byte, 0, len(nsHistory)+len(taskID)+1+historySuffixLen)
	b = append(b, nsHistory...)
	b = append(b, taskID...)
	return append(b, 0)
}

// appendSlotKey appends the key of slot of class c of a task: the prefix,
// the class letter and the slot number. A task's records of one class
// take the slots 0 to limit-1 in turn, each write overwriting the oldest.
func appendSlotKey(b []byte, taskID string, c class, slot uint8) []byte {
	b = append(b, nsHistory...)
	b = append(b, taskID...)
	return append(b, 0, classLetters[c], slot)
}
