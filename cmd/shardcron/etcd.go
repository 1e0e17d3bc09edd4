package main

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/shardcron/shardcron/internal/etcdembed"
)

// derivedAddr returns the loopback address of an embedded etcd port: the
// API port plus offset, so that two dev nodes on one machine (8080, 8081)
// do not collide. Port 0, or one that would not fit, stays 0: the kernel
// picks it.
func derivedAddr(listen string, offset int) string {
	_, port, err := net.SplitHostPort(listen)
	p, _ := strconv.Atoi(port)
	if err != nil || p == 0 || p+offset > 65535 {
		return "127.0.0.1:0"
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p+offset))
}

// startEtcd starts the embedded etcd with its data in dir, its warnings
// and errors in the node's log, and waits until it serves. It keeps one
// hour of history (auto-compaction), so a node that restarts within the
// hour resumes its watches instead of reloading. quota is its space quota
// in bytes. It gives up when ctx ends: the node is asked to stop, or the
// start's deadline passes. timeout, --start-timeout, only keeps
// etcdembed's default (30 s) from coming first: the deadline, set before,
// always does.
func startEtcd(ctx context.Context, dir string, log *slog.Logger, clientAddr, peerAddr string, quota int64, timeout time.Duration) (*etcdembed.Server, error) {
	return etcdembed.Start(ctx, etcdembed.Config{
		Dir: dir, Logger: log,
		ClientAddr: clientAddr, PeerAddr: peerAddr,
		CompactionRetention: time.Hour, QuotaBytes: quota, StartTimeout: timeout,
	})
}

// The embedded etcd's space quota. etcd's own default, 2 GiB, is filled by
// 1 M tasks (about 0.8 GB with their index keys) and two rewrites of every
// one of them within the one to two hours of history it keeps; 8 GiB is the
// most etcd recommends. etcd takes any quota, but one under 64 MiB is a
// unit left out ("--etcd-quota 8" is 8 bytes), refused rather than raising
// the NOSPACE alarm at the first write.
const (
	defaultEtcdQuota byteSize = 8 << 30
	minEtcdQuota     byteSize = 64 << 20
)

// byteSize is a flag of bytes, written with a unit: 8GiB, 512MiB, 2GB.
type byteSize int64

func (b byteSize) String() string { return humanize.IBytes(uint64(b)) }

func (b *byteSize) Set(s string) error {
	n, err := humanize.ParseBytes(s)
	if err != nil || n > math.MaxInt64 {
		return errors.New("not a size such as 8GiB or 512MiB")
	}
	*b = byteSize(n)
	return nil
}
