package store

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// AsideSuffix is appended to a data directory's path by SetAside.
const AsideSuffix = ".corrupt"

// SetAside renames the data directory dir to dir+AsideSuffix, replacing
// the one an earlier SetAside left there, so that Open starts an empty
// directory at dir. It is the recovery from an Open error matching
// ErrCorrupt: the directory holds a cache and execution history only
// (etcd is authoritative), so a node that sets it aside reloads its
// partitions from etcd and loses only the history. Keeping the last
// damaged copy, rather than deleting it, leaves it to be looked at; a
// node that keeps corrupting its directory does not fill the disk with
// copies.
//
// It returns the new path and the bytes the directory's files held (the
// history that is no longer read). The caller must not hold dir open: a
// failed Open has released it.
func SetAside(dir string) (aside string, size int64, err error) {
	dir = filepath.Clean(dir)
	aside = dir + AsideSuffix
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil // a size is for the log only: count what can be read
	})
	if err := os.RemoveAll(aside); err != nil {
		return "", 0, fmt.Errorf("store: remove the earlier copy %s: %w", aside, err)
	}
	if err := os.Rename(dir, aside); err != nil {
		return "", 0, fmt.Errorf("store: set aside %s as %s: %w", dir, aside, err)
	}
	return aside, size, nil
}
