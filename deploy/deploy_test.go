package deploy

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/shardcron/shardcron/internal/buildinputs"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// serverFlags returns the flags 'shardcron server --help' lists, from the
// binary built from this tree.
func serverFlags(t *testing.T, bin string) map[string]bool {
	t.Helper()
	out, err := exec.Command(bin, "server", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("server --help: %v\n%s", err, out)
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 30 {
		t.Fatalf("found %d flags in --help", len(flags))
	}
	return flags
}

// build builds the binary as the Dockerfile does: CGO_ENABLED=0, static.
func build(t *testing.T) string {
	t.Helper()
	// So that go test reruns this when the binary\'s sources change.
	if _, err := buildinputs.Open(); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "shardcron")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "../cmd/shardcron")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
	if out, err := exec.Command("file", bin).Output(); err == nil && !strings.Contains(string(out), "statically linked") {
		t.Errorf("the binary is not static: %s", out)
	}
	return bin
}

// checkEnv fails for a SHARDCRON_* variable that names no server flag.
func checkEnv(t *testing.T, where, name string, flags map[string]bool) {
	t.Helper()
	flag, ok := strings.CutPrefix(name, "SHARDCRON_")
	if !ok {
		return
	}
	if f := strings.ToLower(strings.ReplaceAll(flag, "_", "-")); !flags[f] {
		t.Errorf("%s sets %s, which is no server flag's variable", where, name)
	}
}

func TestDeploy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := build(t)
	flags := serverFlags(t, bin)

	t.Run("Dockerfile", func(t *testing.T) {
		d := read(t, "Dockerfile")
		for _, want := range []string{"CGO_ENABLED=0", "VOLUME [\"/data\"]", "STOPSIGNAL SIGTERM"} {
			if !strings.Contains(d, want) {
				t.Errorf("Dockerfile lacks %s", want)
			}
		}
		if n := len(regexp.MustCompile(`(?m)^FROM `).FindAllString(d, -1)); n < 2 {
			t.Errorf("Dockerfile has %d stages, want a build stage and a runtime stage", n)
		}
		user := regexp.MustCompile(`(?m)^USER (\S+)`).FindStringSubmatch(d)
		if user == nil || strings.HasPrefix(user[1], "root") || strings.HasPrefix(user[1], "0:") || user[1] == "0" {
			t.Errorf("Dockerfile runs as %v, want a non-root user", user)
		}
		hc := regexp.MustCompile(`(?s)HEALTHCHECK.*?CMD (\[.*?\])`).FindStringSubmatch(d)
		if hc == nil || !strings.Contains(hc[1], `"ready"`) {
			t.Fatalf("HEALTHCHECK does not run 'shardcron ready' (GET /readyz): %v", hc)
		}
		// It asks the probe listener, which needs no client certificate
		// when the API serves mutual TLS.
		probe := regexp.MustCompile(`SHARDCRON_PROBE_LISTEN=(\S+)`).FindStringSubmatch(d)
		if probe == nil || !strings.Contains(hc[1], `"http://`+probe[1]+`"`) {
			t.Errorf("HEALTHCHECK %s does not ask the probe listener (SHARDCRON_PROBE_LISTEN %v)", hc[1], probe)
		}
		if out, err := exec.Command(bin, "ready", "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "/readyz") {
			t.Errorf("shardcron ready --help: %v %s", err, out)
		}
		for _, m := range regexp.MustCompile(`(SHARDCRON_[A-Z_]+)=`).FindAllStringSubmatch(d, -1) {
			checkEnv(t, "Dockerfile", m[1], flags)
		}
	})

	t.Run("systemd", func(t *testing.T) {
		unit := read(t, "systemd/shardcron.service")
		keys := map[string]string{}
		sc := bufio.NewScanner(strings.NewReader(unit))
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), "="); ok && !strings.HasPrefix(k, "#") {
				keys[k] = v
				if k == "Environment" {
					name, _, _ := strings.Cut(v, "=")
					checkEnv(t, "the unit", name, flags)
				}
			}
		}
		if keys["KillSignal"] != "SIGTERM" {
			t.Errorf("KillSignal=%s", keys["KillSignal"])
		}
		stop, err := time.ParseDuration(keys["TimeoutStopSec"] + "s")
		drain := regexp.MustCompile(`--drain-timeout (\S+)`).FindStringSubmatch(keys["ExecStart"])
		if err != nil || drain == nil {
			t.Fatalf("TimeoutStopSec %q, ExecStart %q", keys["TimeoutStopSec"], keys["ExecStart"])
		}
		d, err := time.ParseDuration(drain[1])
		// Stopping waits up to 30 s for the others to prepare the node's
		// partitions (engine prepareWait), then drains.
		if err != nil || stop <= d+30*time.Second {
			t.Errorf("TimeoutStopSec %v does not outlast --drain-timeout %v plus the 30 s hand-over", stop, d)
		}
		if keys["User"] == "" || keys["User"] == "root" {
			t.Errorf("User=%q", keys["User"])
		}
		sa, err := exec.LookPath("systemd-analyze")
		if err != nil {
			t.Log("systemd-analyze not found: the unit was parsed, not verified")
			return
		}
		dir := t.TempDir()
		local := strings.ReplaceAll(unit, "/usr/local/bin/shardcron", bin)
		if err := os.WriteFile(filepath.Join(dir, "shardcron.service"), []byte(local), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(sa, "verify", filepath.Join(dir, "shardcron.service")).CombinedOutput(); err != nil {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	})

	t.Run("compose", func(t *testing.T) {
		var c struct {
			Services map[string]struct {
				Image       string            `json:"image"`
				Environment map[string]string `json:"environment"`
				StopGrace   string            `json:"stop_grace_period"`
				Build       *struct {
					Dockerfile string `json:"dockerfile"`
				} `json:"build"`
			} `json:"services"`
			Secrets map[string]struct {
				File string `json:"file"`
			} `json:"secrets"`
		}
		if err := yaml.Unmarshal([]byte(read(t, "docker-compose.yml")), &c); err != nil {
			t.Fatal(err)
		}
		var etcds, nodes []string
		for name, s := range c.Services {
			switch {
			case strings.HasPrefix(name, "etcd-"):
				etcds = append(etcds, name)
				if s.Environment["ETCD_NAME"] != name || !strings.Contains(s.Environment["ETCD_INITIAL_CLUSTER"], name+"=http://"+name+":2380") {
					t.Errorf("%s: ETCD_NAME %q, initial cluster %q", name, s.Environment["ETCD_NAME"], s.Environment["ETCD_INITIAL_CLUSTER"])
				}
			case strings.HasPrefix(name, "node-"):
				nodes = append(nodes, name)
				if s.Build == nil || s.Build.Dockerfile != "deploy/Dockerfile" {
					t.Errorf("%s is not built from deploy/Dockerfile", name)
				}
				for k := range s.Environment {
					checkEnv(t, name, k, flags)
				}
				if s.Environment["SHARDCRON_NODE_ID"] != name || s.Environment["SHARDCRON_ADVERTISE"] != name+":8080" {
					t.Errorf("%s: node id %q, advertise %q", name, s.Environment["SHARDCRON_NODE_ID"], s.Environment["SHARDCRON_ADVERTISE"])
				}
				if g, err := time.ParseDuration(s.StopGrace); err != nil || g < 60*time.Second {
					t.Errorf("%s: stop_grace_period %q does not outlast the hand-over and the drain", name, s.StopGrace)
				}
				for _, e := range []string{"etcd-1", "etcd-2", "etcd-3"} {
					if !strings.Contains(s.Environment["SHARDCRON_ETCD"], "http://"+e+":2379") {
						t.Errorf("%s does not reach %s", name, e)
					}
				}
			}
		}
		if len(etcds) != 3 || len(nodes) != 3 {
			t.Errorf("etcd members %v, nodes %v; want 3 and 3", etcds, nodes)
		}
		for name, s := range c.Secrets {
			if _, err := os.Stat(s.File); err != nil {
				t.Errorf("secret %s: %v", name, err)
			}
		}
	})

	t.Run("kubernetes", func(t *testing.T) {
		kinds := map[string]map[string]any{}
		for _, doc := range strings.Split(read(t, "kubernetes/shardcron.yaml"), "\n---\n") {
			var o map[string]any
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatalf("%v in:\n%s", err, doc)
			}
			name := o["metadata"].(map[string]any)["name"].(string)
			kinds[o["kind"].(string)+"/"+name] = o
		}
		headless := kinds["Service/shardcron-headless"]
		if headless == nil || headless["spec"].(map[string]any)["clusterIP"] != "None" {
			t.Fatal("no headless Service shardcron-headless")
		}
		if kinds["PodDisruptionBudget/shardcron"] == nil {
			t.Error("no PodDisruptionBudget")
		}
		ss := kinds["StatefulSet/shardcron"]
		if ss == nil {
			t.Fatal("no StatefulSet shardcron")
		}
		spec := ss["spec"].(map[string]any)
		if spec["serviceName"] != "shardcron-headless" {
			t.Errorf("serviceName %v", spec["serviceName"])
		}
		pod := spec["template"].(map[string]any)["spec"].(map[string]any)
		if g, _ := pod["terminationGracePeriodSeconds"].(float64); g < 60 {
			t.Errorf("terminationGracePeriodSeconds %v does not outlast the hand-over and the drain", g)
		}
		c := pod["containers"].([]any)[0].(map[string]any)
		env := map[string]string{}
		for _, e := range c["env"].([]any) {
			m := e.(map[string]any)
			v, _ := m["value"].(string)
			env[m["name"].(string)] = v
			checkEnv(t, "the StatefulSet", m["name"].(string), flags)
		}
		// Every probe asks the probe listener's port, which kubelet
		// reaches without the client certificate mutual TLS asks for.
		ports := map[string]string{}
		for _, p := range c["ports"].([]any) {
			m := p.(map[string]any)
			ports[m["name"].(string)] = fmt.Sprint(m["containerPort"])
		}
		if _, port, _ := strings.Cut(env["SHARDCRON_PROBE_LISTEN"], ":"); port == "" || ports["probes"] != port {
			t.Errorf("SHARDCRON_PROBE_LISTEN %q, container port probes %q", env["SHARDCRON_PROBE_LISTEN"], ports["probes"])
		}
		for kind, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"} {
			probe, _ := c[kind].(map[string]any)
			get, _ := probe["httpGet"].(map[string]any)
			if get["path"] != path || get["port"] != "probes" {
				t.Errorf("%s %v, want %s on the port probes", kind, get, path)
			}
		}
		if !strings.Contains(env["SHARDCRON_ADVERTISE"], "$(POD_NAME).shardcron-headless.") {
			t.Errorf("SHARDCRON_ADVERTISE %q does not use the headless service", env["SHARDCRON_ADVERTISE"])
		}
		if sc := pod["securityContext"].(map[string]any); sc["runAsNonRoot"] != true {
			t.Error("pods may run as root")
		}
	})
}
