//go:build unix

package etcdtest

import (
	"fmt"
	"syscall"
	"testing"
)

// RefusedAddr returns a loopback address ("127.0.0.1:port") on which every
// connection is refused, for as long as the test runs. The port belongs to
// a socket that is bound but never listens: unlike a listener that is
// closed again, no other test or package can take the port over meanwhile
// and answer in its place.
func RefusedAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatalf("etcdtest: socket: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("etcdtest: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("etcdtest: getsockname: %v", err)
	}
	in4, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		t.Fatalf("etcdtest: bound to %T", sa)
	}
	return fmt.Sprintf("127.0.0.1:%d", in4.Port)
}
