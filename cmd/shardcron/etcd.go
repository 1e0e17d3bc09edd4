package main

import (
	"log/slog"
	"net"
	"strconv"
	"time"

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
// hour resumes its watches instead of reloading.
func startEtcd(dir string, log *slog.Logger, clientAddr, peerAddr string, timeout time.Duration) (*etcdembed.Server, error) {
	return etcdembed.Start(etcdembed.Config{
		Dir: dir, Logger: log,
		ClientAddr: clientAddr, PeerAddr: peerAddr,
		CompactionRetention: time.Hour, StartTimeout: timeout,
	})
}
