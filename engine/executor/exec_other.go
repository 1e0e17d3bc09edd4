//go:build !unix

package executor

import "fmt"

// NewExec fails with an error wrapping ErrUnsupported: exec relies on Unix
// process groups to kill a command and all its descendants.
func NewExec(spec ExecSpec) (Executor, error) {
	if err := spec.check(false); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%w: exec executor needs Unix process groups", ErrUnsupported)
}
