package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/logbuf"
)

// TestServer_SecretsNeverShow runs a node that holds every kind of secret
// (auth and read tokens from the environment and a file, an etcd password
// from a file, a task with a secret header and a password in its URL that
// fails on every fire), at debug level, and greps everything it printed,
// its --help, the history and the errors the API answered: no secret
// appears. It also checks that 'shardcron version' and build_info agree.
func TestServer_SecretsNeverShow(t *testing.T) {
	dir := t.TempDir()
	secrets := map[string]string{
		"auth":  "auth-SECRET-e1",
		"read":  "read-SECRET-f2",
		"etcd":  "etcd-SECRET-a3",
		"hdr":   "hdr-SECRET-b4",
		"url":   "url-SECRET-c5",
		"token": "wrong-SECRET-d6",
		// Alerts (issue 9): the default notify url's password and token,
		// and a task's notify header.
		"notifypw":  "notifypw-SECRET-g7",
		"notifytok": "notifytok-SECRET-h8",
		"notifyhdr": "notifyhdr-SECRET-i9",
	}
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := closed.Addr().String()
	closed.Close()
	// The alerts of the failing task go to the node's --notify-url, a dead
	// address with a password and a token in it, with a secret header:
	// every delivery fails and is logged.
	notifyURL := "http://alerts:" + secrets["notifypw"] + "@" + dead + "/alert?token=" + secrets["notifytok"]
	env := []string{"SHARDCRON_AUTH_TOKEN=" + secrets["auth"], "SHARDCRON_READ_TOKEN_FILE=" + write("read", secrets["read"]),
		"SHARDCRON_NOTIFY_URL=" + notifyURL}

	// --help with the secrets in the environment.
	help := exec.Command(binPath, "server", "--help")
	help.Env = append(os.Environ(), append(env, "SHARDCRON_ETCD_PASSWORD="+secrets["etcd"])...)
	out, _ := help.CombinedOutput()
	printed := string(out)

	p := startServerEnv(t, env, true, "--data-dir", filepath.Join(dir, "data"), "--partitions", "8", "--log-level", "debug",
		"--etcd-user", "root", "--etcd-password-file", write("etcd", secrets["etcd"]))
	p.waitReady(t)
	do := func(method, path, token, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, p.API+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	task, _ := json.Marshal(map[string]any{
		"schedule": "* * * * * *",
		"executor": map[string]any{"type": "http", "url": "http://user:" + secrets["url"] + "@" + dead + "/hook",
			"headers": map[string]string{"X-Secret": secrets["hdr"]}},
		"notify": map[string]any{"headers": map[string]string{"X-Notify": secrets["notifyhdr"]}},
	})
	if code, body := do("PUT", "/v1/tasks/leaky", secrets["auth"], string(task)); code != http.StatusOK {
		t.Fatalf("PUT: %d %s", code, body)
	}
	var answers strings.Builder
	for _, r := range []struct{ method, path, token string }{
		{"PUT", "/v1/tasks/leaky", secrets["read"]}, {"GET", "/v1/tasks", secrets["token"]},
		{"GET", "/v1/tasks", ""}, {"DELETE", "/v1/tasks/leaky", secrets["read"]},
	} {
		_, body := do(r.method, r.path, r.token, string(task))
		answers.WriteString(body)
	}
	var history string
	etcdtest.WaitFor(t, 20*time.Second, func() bool {
		_, history = do("GET", "/v1/tasks/leaky/history", secrets["read"], "")
		return strings.Contains(history, `"failed"`)
	})

	// The alert of the failure was tried and failed: its errors are in
	// the log.
	var metrics string
	etcdtest.WaitFor(t, 20*time.Second, func() bool {
		_, metrics = do("GET", "/metrics", "", "")
		return strings.Contains(metrics, `shardcron_notify_total{result="failed"} 1`)
	})

	// build_info and 'shardcron version' name the same version.
	vout, _, _ := runCLI(t, "", "version", "--output", "json")
	var v struct{ Version string }
	if err := json.Unmarshal([]byte(vout), &v); err != nil || v.Version == "" {
		t.Fatalf("version --output json: %q %v", vout, err)
	}
	if m := regexp.MustCompile(`shardcron_build_info\{[^}]*version="([^"]*)"`).FindStringSubmatch(metrics); m == nil || m[1] != v.Version {
		t.Fatalf("build_info %v, shardcron version %q", m, v.Version)
	}

	if code := p.stop(); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
	everything := map[string]string{"--help": printed, "the node's output": p.log(), "API error answers": answers.String(), "history": history}
	for where, text := range everything {
		for name, secret := range secrets {
			if strings.Contains(text, secret) {
				t.Errorf("the %s secret appears in %s:\n%s", name, where, text)
			}
		}
	}
	if !bytes.Contains([]byte(p.log()), []byte(`"level":"DEBUG"`)) {
		t.Error("the node logged nothing at debug level: the check proves little")
	}
}

func TestBuildVersion(t *testing.T) {
	info := func(v string) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) { return &debug.BuildInfo{Main: debug.Module{Version: v}}, true }
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	for _, tc := range []struct {
		ldflags string
		read    func() (*debug.BuildInfo, bool)
		want    string
	}{
		{"v1.2.3", info("v9.9.9"), "v1.2.3"}, // -ldflags wins
		{"dev", info("v1.4.0"), "v1.4.0"},    // go install ...@v1.4.0
		{"dev", info("(devel)"), "dev"},
		{"dev", info(""), "dev"},
		{"dev", none, "dev"},
	} {
		if got := buildVersion(tc.ldflags, tc.read); got != tc.want {
			t.Errorf("buildVersion(%q) = %q, want %q", tc.ldflags, got, tc.want)
		}
	}
}

// TestSecretFiles_WarnWhenOthersCanRead: a token file that every user of
// the machine may read (or write) is taken, since refusing it would stop
// a node at a restart, but the node logs a warning naming the file and
// its mode, and so does a client command on stderr; a file of mode 0600
// or 0640 is no concern.
func TestSecretFiles_WarnWhenOthersCanRead(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(name+"-SECRET-w1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	loose, tight, group := file("loose", 0o644), file("tight", 0o600), file("group", 0o640)
	dead := deadServer(t)

	r := cli("", "nodes", "--server", dead, "--token-file", loose)
	wantCLI(t, r, 1, nil, []string{"warning: --token-file " + loose + " can be read by every user of this machine (mode 0644): chmod 600 it"})
	// Writable by others only: said as it is.
	if r := cli("", "nodes", "--server", dead, "--token-file", file("writable", 0o602)); !strings.Contains(r.stderr, "can be written by every user of this machine (mode 0602)") {
		t.Errorf("--token-file of mode 0602: stderr %q, want a warning that every user can write it", r.stderr)
	}
	for _, f := range []string{tight, group} {
		if r := cli("", "nodes", "--server", dead, "--token-file", f); strings.Contains(r.stderr, "warning") {
			t.Errorf("--token-file of mode %s: %s", map[string]string{tight: "0600", group: "0640"}[f], r.stderr)
		}
	}

	p := startServer(t, true, "--data-dir", filepath.Join(dir, "data"), "--auth-token-file", loose, "--read-token-file", tight)
	p.kill()
	<-p.exited
	log := p.log()
	if !strings.Contains(log, `"level":"WARN"`) || !strings.Contains(log, "--auth-token-file "+loose+" can be read by every user of this machine (mode 0644)") {
		t.Errorf("the node did not warn of its loose token file:\n%s", log)
	}
	if strings.Contains(log, "--read-token-file") || strings.Contains(log, "SECRET") {
		t.Errorf("the node warned of a tight file, or printed the token:\n%s", log)
	}
}

// TestSecretFiles_WarnOfLooseKeys: a private key's file that every user
// of the machine may read is taken with a token file's warning: the
// node's --tls-key at each load (a renewed key may come with a looser
// mode than the first had), its --etcd-key, a client command's --key.
func TestSecretFiles_WarnOfLooseKeys(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	certPEM, keyPEM := ca.issue(t, 1)
	writeFile(t, certFile, certPEM)
	writeFile(t, keyFile, keyPEM) // mode 0600
	var logs logbuf.Buffer
	tf, err := loadTLS(certFile, keyFile, "", nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "every user") {
		t.Errorf("a --tls-key of mode 0600 warned of:\n%s", logs.String())
	}
	if err := os.Chmod(keyFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tf.reload(); err != nil {
		t.Fatal(err)
	}
	if want := "--tls-key " + keyFile + " can be read by every user of this machine (mode 0644): chmod 600 it"; !strings.Contains(logs.String(), want) {
		t.Errorf("the node did not warn of its loose --tls-key at its reload; want %q in:\n%s", want, logs.String())
	}
	// A key given by its variable is named so, as the files' errors are.
	if _, err := loadTLS(certFile, keyFile, "", envFlags{"tls-key": true}, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	if want := "SHARDCRON_TLS_KEY " + keyFile + " can be read by every user"; !strings.Contains(logs.String(), want) {
		t.Errorf("want %q in:\n%s", want, logs.String())
	}

	f := serverFlags{etcdKey: keyFile}
	if err := f.readSecrets(); err != nil {
		t.Fatal(err)
	}
	if want := "--etcd-key " + keyFile + " can be read by every user of this machine (mode 0644)"; len(f.secretWarnings) != 1 || !strings.Contains(f.secretWarnings[0], want) {
		t.Errorf("warnings of the node's files %q, want one: %q", f.secretWarnings, want)
	}

	r := cli("", "nodes", "--server", deadServer(t), "--cert", certFile, "--key", keyFile)
	wantCLI(t, r, 1, nil, []string{"warning: --key " + keyFile + " can be read by every user of this machine (mode 0644): chmod 600 it"})
}

// The warning of a loose secret's file names the file as it was given,
// as the errors of its flag do: it said --auth-token-file, --etcd-key,
// --token-file and --key of files that their variables gave.
func TestSecretFiles_LooseFileNamedAsGiven(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	certFile, keyFile, token := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "token")
	certPEM, keyPEM := ca.issue(t, 1)
	writeFile(t, certFile, certPEM)
	writeFile(t, keyFile, keyPEM)
	writeFile(t, token, []byte("SECRET\n"))
	for _, p := range []string{keyFile, token} {
		if err := os.Chmod(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const loose = " can be read by every user of this machine (mode 0644)"

	for _, given := range []envFlags{nil, {"auth-token-file": true, "etcd-key": true}} {
		f := serverFlags{authTokenFile: token, etcdKey: keyFile, fromEnv: given}
		if err := f.readSecrets(); err != nil {
			t.Fatal(err)
		}
		want := []string{given.givenAs("auth-token-file") + " " + token + loose, given.givenAs("etcd-key") + " " + keyFile + loose}
		if len(f.secretWarnings) != 2 || !strings.HasPrefix(f.secretWarnings[0], want[0]) || !strings.HasPrefix(f.secretWarnings[1], want[1]) {
			t.Errorf("given %v: warnings %q, want %q", given, f.secretWarnings, want)
		}
	}

	dead := deadServer(t)
	wantCLI(t, cli("", "nodes", "--server", dead, "--token-file", token, "--cert", certFile, "--key", keyFile), 1, nil,
		[]string{"warning: --token-file " + token + loose, "warning: --key " + keyFile + loose})
	t.Setenv(envName("token-file"), token)
	t.Setenv(envName("key"), keyFile)
	wantCLI(t, cli("", "nodes", "--server", dead, "--cert", certFile), 1, nil,
		[]string{"warning: SHARDCRON_TOKEN_FILE " + token + loose, "warning: SHARDCRON_KEY " + keyFile + loose})
}
