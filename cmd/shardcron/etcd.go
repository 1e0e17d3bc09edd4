package main

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// embeddedEtcd is the single-member etcd a node starts when no --etcd is
// given: the single-machine default.
type embeddedEtcd struct {
	etcd     *embed.Etcd
	endpoint string // the client URL it actually listens on
}

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

// startEtcd starts an embedded etcd with its data in dir and its log in
// logFile, and waits until it serves. It keeps one hour of history
// (auto-compaction), so a node that restarts within the hour resumes its
// watches instead of reloading.
func startEtcd(dir, logFile, clientAddr, peerAddr, logLevel string, timeout time.Duration) (*embeddedEtcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = "shardcron"
	cfg.Dir = dir
	cu := url.URL{Scheme: "http", Host: clientAddr}
	pu := url.URL{Scheme: "http", Host: peerAddr}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.EnableGRPCGateway = false // it dials its own advertised address, which may be port 0
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "1h"
	cfg.LogLevel = logLevel
	cfg.LogOutputs = []string{logFile}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s (client %s, peer %s): %w", dir, clientAddr, peerAddr, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(timeout):
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s did not become ready within %v (see %s)", dir, timeout, logFile)
	}
	return &embeddedEtcd{etcd: e, endpoint: "http://" + e.Clients[0].Addr().String()}, nil
}

func (e *embeddedEtcd) Close() { e.etcd.Close() }
