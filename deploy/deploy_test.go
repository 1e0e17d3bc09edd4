package deploy

import (
	"bufio"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/shardcron/shardcron/internal/buildinputs"
	"github.com/shardcron/shardcron/store"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// serverHelp returns what 'shardcron server --help' prints, from the
// binary built from this tree.
func serverHelp(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(bin, "server", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("server --help: %v\n%s", err, out)
	}
	return string(out)
}

// serverFlags returns the flags that help lists.
func serverFlags(t *testing.T, help string) map[string]bool {
	t.Helper()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  --([a-z0-9-]+)`).FindAllStringSubmatch(help, -1) {
		flags[m[1]] = true
	}
	if len(flags) < 30 {
		t.Fatalf("found %d flags in --help", len(flags))
	}
	return flags
}

// settings returns the server flags that a deploy file sets, by name:
// from SHARDCRON_* variables and from command-line arguments, which win.
func settings(env map[string]string, args []string) map[string]string {
	s := map[string]string{}
	for k, v := range env {
		if flag, ok := strings.CutPrefix(k, "SHARDCRON_"); ok {
			s[strings.ToLower(strings.ReplaceAll(flag, "_", "-"))] = v
		}
	}
	for i := 0; i < len(args); i++ {
		name, ok := strings.CutPrefix(strings.TrimPrefix(args[i], "-"), "-")
		if !ok {
			continue
		}
		if n, v, ok := strings.Cut(name, "="); ok {
			s[n] = v
		} else if i+1 < len(args) {
			s[name] = args[i+1]
			i++
		}
	}
	return s
}

// engineDuration reads a duration constant of the engine, such as
// "prepareWait = 30 * time.Second", from its source.
func engineDuration(t *testing.T, file, name string) time.Duration {
	t.Helper()
	m := regexp.MustCompile(`\b` + name + `\s+=\s+(\d+) \* time\.Second\b`).FindStringSubmatch(read(t, filepath.Join("../engine", file)))
	if m == nil {
		t.Fatalf("no %s = N * time.Second in engine/%s", name, file)
	}
	d, _ := time.ParseDuration(m[1] + "s")
	return d
}

// stopBound is how long a node with these settings may take to stop on
// SIGTERM (server.go and Engine.Close, one after the other): the API
// requests under way (--shutdown-timeout), the wait for the other nodes to
// prepare its partitions (engine prepareWait), the release's wait for runs
// (--release-run-wait), running executions (--drain-timeout), the alerts
// still queued (engine notifyGrace), then the cache's compactions
// (store.DefaultSettleTimeout). A stop timeout shorter than this kills a
// node in the middle of its hand-over or of its drain.
func stopBound(t *testing.T, help string, set map[string]string) time.Duration {
	t.Helper()
	flag := func(name string) time.Duration {
		v, ok := set[name]
		if !ok {
			m := regexp.MustCompile(`(?m)^  --` + name + ` duration\n(?:.*\n)*?.*\(default (\S+)\)$`).FindStringSubmatch(help)
			if m == nil {
				t.Fatalf("no default of --%s in server --help", name)
			}
			v = m[1]
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("--%s %q: %v", name, v, err)
		}
		return d
	}
	return flag("shutdown-timeout") + engineDuration(t, "timings.go", "prepareWait") + flag("release-run-wait") +
		flag("drain-timeout") + engineDuration(t, "notify.go", "notifyGrace") + store.DefaultSettleTimeout
}

// dockerfileEnv returns the SHARDCRON_* variables the image sets (ENV).
func dockerfileEnv(t *testing.T) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, m := range regexp.MustCompile(`(SHARDCRON_[A-Z_]+)=(\S+)`).FindAllStringSubmatch(read(t, "Dockerfile"), -1) {
		env[m[1]] = m[2]
	}
	return env
}

// checkStarts starts 'shardcron server' with a deploy file's arguments and
// variables, against an etcd that is not there, and wants it to get as far
// as etcd: every setting parsed and was accepted (one that is not exits 2 at
// once, naming it). What cannot be used here is replaced, its form checked
// first: the data directory and the files of secrets by the test's own, the
// addresses to listen on by 127.0.0.1 and a port the kernel picks, the etcd
// endpoints' hosts by 127.0.0.1:1, where nothing answers (no name is looked
// up).
func checkStarts(t *testing.T, bin, where string, args []string, env map[string]string) {
	t.Helper()
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("deploy-test-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := []string{"PATH=" + os.Getenv("PATH"), "SHARDCRON_START_TIMEOUT=1s", "SHARDCRON_DATA_DIR=" + filepath.Join(dir, "data")}
	for k, v := range env {
		switch {
		case k == "GOMEMLIMIT":
			// The Go runtime's: a malformed one stops the binary at once.
		case !strings.HasPrefix(k, "SHARDCRON_"), k == "SHARDCRON_DATA_DIR", k == "SHARDCRON_START_TIMEOUT":
			continue
		case strings.HasSuffix(k, "_FILE"):
			v = secret
		case strings.HasSuffix(k, "LISTEN"):
			if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
				t.Errorf("%s: %s=%q is not host:port", where, k, v)
			}
			v = "127.0.0.1:0"
		case k == "SHARDCRON_ETCD":
			var eps []string
			for _, ep := range strings.Split(v, ",") {
				u, err := url.Parse(ep)
				if err != nil || u.Port() == "" || (u.Scheme != "http" && u.Scheme != "https") {
					t.Errorf("%s: etcd endpoint %q is not an http or https URL with a port", where, ep)
					continue
				}
				u.Host = "127.0.0.1:1"
				eps = append(eps, u.String())
			}
			v = strings.Join(eps, ",")
		}
		vars = append(vars, k+"="+v)
	}
	if _, ok := env["SHARDCRON_ETCD"]; !ok {
		vars = append(vars, "SHARDCRON_ETCD=http://127.0.0.1:1") // not an embedded etcd
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir, cmd.Env = dir, vars
	out, err := cmd.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.HasPrefix(last, "shardcron server: etcd at ") {
		t.Errorf("%s: shardcron %s with %q: %v, want exit 1 at etcd, its settings accepted:\n%s", where, strings.Join(args, " "), vars[1:], err, out)
	}
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
	help := serverHelp(t, bin)
	flags := serverFlags(t, help)

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
		keys, env := map[string]string{}, map[string]string{}
		sc := bufio.NewScanner(strings.NewReader(unit))
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), "="); ok && !strings.HasPrefix(k, "#") {
				keys[k] = v
				if k == "Environment" {
					name, value, _ := strings.Cut(v, "=")
					checkEnv(t, "the unit", name, flags)
					env[name] = value
				}
			}
		}
		// The settings file the unit reads, from the example the unit's
		// comment starts it from: every variable it names (those commented
		// out too) is a flag's.
		if keys["EnvironmentFile"] != "-/etc/shardcron/shardcron.env" || !strings.Contains(unit, "deploy/systemd/shardcron.env.example") {
			t.Errorf("EnvironmentFile=%s, or the unit does not name deploy/systemd/shardcron.env.example", keys["EnvironmentFile"])
		}
		example := read(t, "systemd/shardcron.env.example")
		for _, m := range regexp.MustCompile(`(?m)^#?(SHARDCRON_[A-Z_]+)=`).FindAllStringSubmatch(example, -1) {
			checkEnv(t, "shardcron.env.example", m[1], flags)
		}
		file := maps.Clone(env)
		for _, m := range regexp.MustCompile(`(?m)^(SHARDCRON_[A-Z_]+)=(.*)$`).FindAllStringSubmatch(example, -1) {
			file[m[1]] = m[2]
		}
		if keys["KillSignal"] != "SIGTERM" {
			t.Errorf("KillSignal=%s", keys["KillSignal"])
		}
		cmdline := strings.Fields(keys["ExecStart"])
		if len(cmdline) < 2 || cmdline[0] != "/usr/local/bin/shardcron" || cmdline[1] != "server" {
			t.Fatalf("ExecStart=%s", keys["ExecStart"])
		}
		stop, err := time.ParseDuration(keys["TimeoutStopSec"] + "s")
		if bound := stopBound(t, help, settings(file, cmdline[2:])); err != nil || stop <= bound {
			t.Errorf("TimeoutStopSec %q does not outlast the stop of a node, %v (stopBound)", keys["TimeoutStopSec"], bound)
		}
		checkStarts(t, bin, "the unit with shardcron.env.example", cmdline[1:], file)
		// The unit's user must exist: its install steps create it.
		if keys["User"] == "" || keys["User"] == "root" {
			t.Errorf("User=%q", keys["User"])
		} else if !regexp.MustCompile(`(?m)^#\s+useradd .*\b` + keys["User"] + `$`).MatchString(unit) {
			t.Errorf("the unit's install steps do not create its User=%s (useradd): without it the unit fails, status 217/USER", keys["User"])
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
				// The container runs the image with these variables added.
				env := dockerfileEnv(t)
				maps.Copy(env, s.Environment)
				bound := stopBound(t, help, settings(env, nil))
				if g, err := time.ParseDuration(s.StopGrace); err != nil || g <= bound {
					t.Errorf("%s: stop_grace_period %q does not outlast the stop of a node, %v (stopBound)", name, s.StopGrace, bound)
				}
				if name == "node-1" {
					checkStarts(t, bin, name, []string{"server"}, env)
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
		c := pod["containers"].([]any)[0].(map[string]any)
		env := map[string]string{}
		for _, e := range c["env"].([]any) {
			m := e.(map[string]any)
			v, _ := m["value"].(string)
			env[m["name"].(string)] = v
			checkEnv(t, "the StatefulSet", m["name"].(string), flags)
		}
		// The container runs the image (its ENV) with these variables, the
		// dependent ones ($(POD_NAME)) expanded by kubelet.
		image := dockerfileEnv(t)
		for k, v := range env {
			v = strings.NewReplacer("$(POD_NAME)", "shardcron-0", "$(POD_NAMESPACE)", "default").Replace(v)
			if strings.Contains(v, "$(") {
				t.Errorf("%s=%q: a variable kubelet does not expand", k, v)
			}
			image[k] = v
		}
		var args []string
		for _, a := range c["args"].([]any) {
			args = append(args, a.(string))
		}
		// On SIGTERM the node stops accepting API requests at once: a
		// preStop sleep keeps it serving while the terminating pod leaves
		// the Service's endpoints. The image (scratch) has no sleep or
		// shell to exec: the hook is Kubernetes' own sleep action. kubelet
		// runs it before SIGTERM, inside the grace period.
		lifecycle, _ := c["lifecycle"].(map[string]any)
		preStop, _ := lifecycle["preStop"].(map[string]any)
		sleep, _ := preStop["sleep"].(map[string]any)
		secs, _ := sleep["seconds"].(float64)
		if len(preStop) != 1 || secs < 1 || secs > 15 {
			t.Errorf("lifecycle.preStop %v, want only a sleep of 1-15 seconds (the image has no shell to exec)", preStop)
		}
		bound := stopBound(t, help, settings(image, args)) + time.Duration(secs)*time.Second
		if g, _ := pod["terminationGracePeriodSeconds"].(float64); time.Duration(g)*time.Second <= bound {
			t.Errorf("terminationGracePeriodSeconds %v does not outlast the preStop sleep and the stop of a node, %v (stopBound)", g, bound)
		}
		// GOMEMLIMIT, the Go GC's soft limit, some 90% of the container's
		// memory limit: the GC works harder near the limit instead of the
		// pod being OOM-killed, with room left for what the runtime does
		// not count. checkStarts runs the binary with it: the runtime
		// refuses a malformed one.
		limits, _ := c["resources"].(map[string]any)["limits"].(map[string]any)
		limit, lok := quantity(fmt.Sprint(limits["memory"]))
		soft, sok := goMemLimit(env["GOMEMLIMIT"])
		if !lok || !sok || soft < 0.8*limit || soft > 0.95*limit {
			t.Errorf("GOMEMLIMIT %q against limits.memory %v: want 80-95%% of the limit", env["GOMEMLIMIT"], limits["memory"])
		}
		checkStarts(t, bin, "the StatefulSet", args, image)
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

// quantity reads a Kubernetes quantity of bytes ("2Gi", "1500M", "512").
func quantity(q string) (float64, bool) {
	m := regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$`).FindStringSubmatch(q)
	if m == nil {
		return 0, false
	}
	var v float64
	fmt.Sscan(m[1], &v)
	unit := map[string]float64{"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
	return v * unit[m[2]], true
}

// goMemLimit reads a GOMEMLIMIT as the Go runtime does: bytes, with an
// optional unit B, KiB, MiB, GiB or TiB.
func goMemLimit(s string) (float64, bool) {
	m := regexp.MustCompile(`^([0-9]+)(B|KiB|MiB|GiB|TiB)?$`).FindStringSubmatch(s)
	if m == nil {
		return 0, false
	}
	var v float64
	fmt.Sscan(m[1], &v)
	unit := map[string]float64{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
	return v * unit[m[2]], true
}

// ignoreRule is a line of a .dockerignore as docker build reads it.
type ignoreRule struct {
	re     *regexp.Regexp
	except bool // !pattern: keeps what earlier lines left out
}

// readDockerignore reads a .dockerignore: a pattern is relative to the
// context's root (a leading / changes nothing), * and ? match within a
// path element, ** across elements.
func readDockerignore(t *testing.T, file string) []ignoreRule {
	t.Helper()
	var rules []ignoreRule
	for _, line := range strings.Split(read(t, file), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		except := strings.HasPrefix(line, "!")
		p := strings.TrimPrefix(path.Clean(strings.TrimPrefix(line, "!")), "/")
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(p); i++ {
			switch {
			case strings.HasPrefix(p[i:], "**/"):
				re.WriteString("(.*/)?")
				i += 2
			case strings.HasPrefix(p[i:], "**"):
				re.WriteString(".*")
				i++
			case p[i] == '*':
				re.WriteString("[^/]*")
			case p[i] == '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(p[i : i+1]))
			}
		}
		re.WriteString("$")
		rules = append(rules, ignoreRule{regexp.MustCompile(re.String()), except})
	}
	return rules
}

// ignored reports whether docker build leaves the file at p (relative to
// the context) out: the last rule that matches it, or a directory above
// it, decides.
func ignored(rules []ignoreRule, p string) bool {
	out := false
	for _, r := range rules {
		for q := path.Clean(p); ; q = path.Dir(q) {
			if r.re.MatchString(q) {
				out = !r.except
				break
			}
			if !strings.Contains(q, "/") {
				break
			}
		}
	}
	return out
}

// TestDockerignore: deploy/Dockerfile's context is the repository root,
// which COPY . . copies whole into the build stage. The data directories
// README.md's commands create there (an embedded etcd holds every task,
// headers and notify urls included) and the binary it builds stay out;
// nothing the binary is built from, and nothing git tracks, is left out.
func TestDockerignore(t *testing.T) {
	// So that go test reruns this when the files go list names change.
	if _, err := buildinputs.Open(); err != nil {
		t.Fatal(err)
	}
	rules := readDockerignore(t, "../.dockerignore")
	readme := read(t, "../README.md")
	out := []string{"shardcron-data/etcd/member/snap/db", "shardcron-data/cache/MANIFEST", "api/api.test", "cpu.out"}
	for _, m := range regexp.MustCompile(`--data-dir ([^\s`+"`"+`]+)`).FindAllStringSubmatch(readme, -1) {
		if d := m[1]; !strings.HasPrefix(d, "/") && !strings.ContainsAny(d, "<$") {
			out = append(out, path.Join(d, "etcd/member/snap/db"), path.Join(d, "cache/MANIFEST"))
		}
	}
	for _, m := range regexp.MustCompile(`go build -o (\S+)`).FindAllStringSubmatch(readme, -1) {
		out = append(out, m[1])
	}
	for _, p := range out {
		if !ignored(rules, p) {
			t.Errorf(".dockerignore keeps %s in the build context", p)
		}
	}

	// What the binary is built from: go.mod, go.sum, and the files of the
	// module's packages it links, embedded ones included.
	list := exec.Command("go", "list", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}
{{end}}{{range .SFiles}}{{$d}}/{{.}}
{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}
{{end}}{{end}}{{end}}`, "./cmd/shardcron")
	list.Dir = ".."
	listed, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	in := []string{"go.mod", "go.sum"}
	for _, f := range strings.Fields(string(listed)) {
		rel, err := filepath.Rel(root, f)
		if err != nil || strings.HasPrefix(rel, "..") {
			t.Fatalf("%s is outside %s", f, root)
		}
		in = append(in, filepath.ToSlash(rel))
	}
	if len(in) < 50 {
		t.Fatalf("go list named %d files", len(in))
	}
	// Git's files: one left out would also make the go command stamp the
	// binary's version +dirty.
	if git, err := exec.Command("git", "-C", "..", "ls-files").Output(); err == nil {
		in = append(in, strings.Fields(string(git))...)
	} else {
		t.Logf("git ls-files: %v: checked the build's files only", err)
	}
	for _, p := range in {
		if ignored(rules, p) {
			t.Errorf(".dockerignore leaves out %s", p)
		}
	}
}

// TestPrometheusRules: the alerting rules are where the README says, and
// promtool, where installed, checks them (their YAML, PromQL and
// templates) and runs their cases (prometheus/alerts_test.yml: a healthy
// cluster raises nothing, each rule fires on what it is for and waits out
// its blips). api's TestMetrics_AlertRules checks, without promtool, that
// every metric, label and label value they use is one a node exports.
func TestPrometheusRules(t *testing.T) {
	for _, f := range []string{"prometheus/alerts.yml", "prometheus/alerts_test.yml"} {
		if _, err := os.Stat(f); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(read(t, "../README.md"), "| `deploy/prometheus/alerts.yml` |") {
		t.Error("README.md's Deployment table does not list deploy/prometheus/alerts.yml")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not found: the rules were parsed (api's TestMetrics_AlertRules), not run")
		return
	}
	for _, args := range [][]string{{"check", "rules", "prometheus/alerts.yml"}, {"test", "rules", "prometheus/alerts_test.yml"}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
