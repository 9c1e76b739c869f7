package cli

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// consoleSteps reads the shell blocks between <!-- readme-console --> and
// <!-- /readme-console --> in the README, with the ports it names replaced.
func consoleSteps(t *testing.T, replace *strings.Replacer) (sh []string, text []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start, end := strings.Index(s, "<!-- readme-console -->"), strings.Index(s, "<!-- /readme-console -->")
	if start < 0 || end < start {
		t.Fatal("README.md has no <!-- readme-console --> part")
	}
	var cur *strings.Builder
	var kind string
	sc := bufio.NewScanner(strings.NewReader(s[start:end]))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "```sh" || line == "```text":
			cur, kind = &strings.Builder{}, line
		case line == "```" && cur != nil:
			if kind == "```sh" {
				sh = append(sh, replace.Replace(cur.String()))
			} else {
				text = append(text, cur.String())
			}
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		}
	}
	return sh, text
}

// TestReadmeConsole follows the README's console walk-through with a fresh
// build: the setup, the server with its console, the receiver, the parked
// call, its approval in the console (signing in and posting the forms a
// browser would; internal/e2e/browser does it in Chromium), the retry, and
// the receiver's verified deliveries.
func TestReadmeConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("builds toolsvc and runs a server")
	}
	dir := t.TempDir()
	buildToolsvc(t, dir) // on PATH for the README's commands
	grpcAddr, consoleAddr, hookAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	sh, text := consoleSteps(t, strings.NewReplacer("127.0.0.1:8080", consoleAddr, "127.0.0.1:9000", hookAddr))
	if len(sh) != 5 || len(text) != 2 {
		t.Fatalf("README console part: %d shell blocks and %d outputs, want 5 and 2", len(sh), len(text))
	}
	env := append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"),
		"TOOLSVC_LISTEN="+grpcAddr, "TOOLSVC_ADDR="+grpcAddr, "TOOLSVC_LOG_LEVEL=warn")
	runSh := func(script string) (string, int) {
		cmd := exec.Command("bash", "-c", script)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	background := func(script string, out io.Writer) {
		ctx, cancel := context.WithCancel(context.Background())
		cmd := exec.CommandContext(ctx, "bash", "-c", "exec "+script)
		cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cancel()
			_ = cmd.Wait()
		})
	}

	if out, code := runSh(sh[0]); code != 0 {
		t.Fatalf("setup exited %d:\n%s", code, out)
	}
	serverLog, received := &syncBuffer{}, &syncBuffer{}
	background(sh[1], serverLog)
	background(sh[2], received)
	waitServing(t, grpcAddr)

	// Sign in as alice, as the console's form asks.
	jar, _ := cookiejar.New(nil)
	web := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	base := "http://" + consoleAddr
	get := func(path string) string {
		resp, err := web.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	post := func(path string, form url.Values) string {
		resp, err := web.PostForm(base+path, form)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	field := func(name, page string) string {
		m := regexp.MustCompile(`name="` + name + `" value="([^"]+)"`).FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no %s on the page:\n%s", name, page)
		}
		return m[1]
	}
	landing := post("/signin", url.Values{"signin_token": {field("signin_token", get("/signin"))}, "method": {"principal"}, "principal": {"alice"}})
	if !strings.Contains(landing, "No approvals are waiting") || !strings.Contains(landing, ">alice<") {
		t.Fatalf("after signing in:\n%s", landing)
	}

	if out, code := runSh(sh[3]); code != 3 || !strings.Contains(out, "Outcome:   APPROVAL_REQUIRED") {
		t.Fatalf("the agent's call exited %d:\n%s", code, out)
	}
	list := get("/approvals?state=pending&partial=list")
	m := regexp.MustCompile(`data-approval="([^"]+)"`).FindStringSubmatch(list)
	if m == nil || !strings.Contains(list, "notes.write") {
		t.Fatalf("the pending list:\n%s", list)
	}
	id := m[1]
	page := post("/approvals/"+id+"/resolve", url.Values{"csrf": {field("csrf", get("/approvals/"+id))}, "decision": {"approve"}, "comment": {"fine"}})
	if !strings.Contains(page, "You approved this call") {
		t.Fatalf("after approving:\n%s", page)
	}

	out, code := runSh(sh[4])
	if code != 0 {
		t.Fatalf("the retry exited %d:\n%s", code, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(text[0]), "\n") {
		if !strings.Contains(out, line+"\n") {
			t.Errorf("the retry's output lacks %q:\n%s", line, out)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, want := range []string{"verified  approval.pending  notes.write for agent-1  PENDING  approval " + id,
		"verified  approval.resolved  notes.write for agent-1  APPROVED by alice  approval " + id} {
		for !strings.Contains(received.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("the receiver did not print %q:\n%s\nserver:\n%s", want, received.String(), serverLog.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if !strings.Contains(received.String(), base+"/approvals/"+id) {
		t.Errorf("the messages do not link to the approval's page:\n%s", received.String())
	}
}
