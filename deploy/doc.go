// Package deploy holds the files that run shardcron outside a developer's
// shell: a container image (Dockerfile, with the repository's
// .dockerignore), a systemd unit with an example of its settings, a
// docker-compose cluster (3-member etcd, 3 nodes), a Kubernetes example
// and Prometheus alerting rules (prometheus/alerts.yml, with cases for
// promtool test rules).
// Its tests parse each file and check what a mistake would break: the
// flags and variables they use exist and a node starts with them, the stop
// timeouts outlast a node's stop (a preStop sleep included), GOMEMLIMIT
// sits below the pod's memory limit, health checks ask /readyz, nothing runs
// as root, the unit's user is created, the build context keeps the sources
// and leaves local state out, and the binary builds static; promtool, where
// installed, checks the alerting rules and runs their cases (api's tests
// check the metrics and labels they use).
package deploy
