// Package deploy holds the files that run shardcron outside a developer's
// shell: a container image (Dockerfile), a systemd unit, a docker-compose
// cluster (3-member etcd, 3 nodes) and a Kubernetes example. Its tests
// parse each file and check what a mistake would break: the flags and
// variables they use exist, the stop timeouts outlast the drain, health
// checks ask /readyz, nothing runs as root, and the binary builds static.
package deploy
