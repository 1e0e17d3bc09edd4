package deploy

import (
	"bufio"
	"fmt"
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
