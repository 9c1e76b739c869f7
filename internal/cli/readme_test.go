package cli

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// readmeStep is one shell block of the README's tested part and the output
// block that follows it.
type readmeStep struct {
	commands []string // one command each; "# exit N" says the status it must end with
	output   []string
}

// readmeSteps reads the blocks between <!-- NAME --> and <!-- /NAME -->
// in the README (every such part, in order: they run as one session).
func readmeSteps(t *testing.T, name string) []readmeStep {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var tested strings.Builder
	for rest := string(b); ; {
		start := strings.Index(rest, "<!-- "+name+" -->")
		if start < 0 {
			break
		}
		end := strings.Index(rest[start:], "<!-- /"+name+" -->")
		if end < 0 {
			t.Fatalf("README.md: a <!-- %s --> part does not end", name)
		}
		tested.WriteString(rest[start : start+end])
		rest = rest[start+end:]
	}
	if tested.Len() == 0 {
		t.Fatalf("README.md has no <!-- %s --> part", name)
	}
	var steps []readmeStep
	sc := bufio.NewScanner(strings.NewReader(tested.String()))
	var block *[]string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "```sh":
			steps = append(steps, readmeStep{})
			block = &steps[len(steps)-1].commands
		case line == "```text":
			if len(steps) == 0 {
				t.Fatal("README: an output block before any command")
			}
			block = &steps[len(steps)-1].output
		case line == "```":
			block = nil
		case block != nil:
			*block = append(*block, line)
		}
	}
	return steps
}

// checkedLine matches the output lines a README run must reproduce (the
// rest holds ids and times that differ from run to run).
var checkedLine = regexp.MustCompile(`^(Outcome|Key|Risk|Gate|  reason):`)

var exitComment = regexp.MustCompile(`\s+# exit (\d+)$`)

// TestReadme runs the README's first call and approval round trip, as a
// new user would, with a fresh build of toolsvc serving and answering:
// every command must exit as the README says and print what the README
// shows (outcomes, keys, risks, gate decisions, refusal reasons).
func TestReadme(t *testing.T) {
	if testing.Short() {
		t.Skip("builds toolsvc and runs a server")
	}
	dir := t.TempDir()
	bin := buildToolsvc(t, dir)
	addr := freeAddr(t)

	ctx, cancel := context.WithCancel(context.Background())
	serve := exec.CommandContext(ctx, bin, "serve", "--listen", addr)
	serve.Env = append(os.Environ(), "TOOLSVC_LOG_LEVEL=warn")
	serve.Stderr = os.Stderr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = serve.Wait()
	})
	waitServing(t, addr)

	runReadme(t, dir, "readme-test", checkedLine, 5, "TOOLSVC_ADDR="+addr)
}

// mcpCheckedLine matches the lines of the README's MCP part a run must
// reproduce: outcomes, the tools listed, the text of the results.
var mcpCheckedLine = regexp.MustCompile(`^(Outcome:|NAME |echo |notes__write |  echo: hello|  created /mcp\\.md)`)

// TestReadmeMCP runs the README's MCP front door part as a new user would:
// a fresh build serving with --mcp-listen, toolsvc mcp listing the demo
// tools and calling echo, and a parked notes.write approved with the CLI
// while the call is held, whose result arrives in the same request.
func TestReadmeMCP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds toolsvc and runs a server")
	}
	dir := t.TempDir()
	bin := buildToolsvc(t, dir)
	addr, mcpAddr := freeAddr(t), freeAddr(t)

	ctx, cancel := context.WithCancel(context.Background())
	serve := exec.CommandContext(ctx, bin, "serve", "--listen", addr, "--mcp-listen", mcpAddr)
	serve.Env = append(os.Environ(), "TOOLSVC_LOG_LEVEL=warn")
	serve.Stderr = os.Stderr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = serve.Wait()
	})
	waitServing(t, addr)

	runReadme(t, dir, "readme-mcp-test", mcpCheckedLine, 2, "TOOLSVC_ADDR="+addr, "TOOLSVC_MCP_URL=http://"+mcpAddr+"/mcp")
}

// runReadme runs the commands of the README's parts name in one shell in
// dir, with env added: every command must exit as the README says and
// print the lines of its output block that checked matches.
func runReadme(t *testing.T, dir, name string, checked *regexp.Regexp, minSteps int, env ...string) {
	t.Helper()
	// One shell runs every command, so that variables set by one reach the
	// next; a marker after each command carries its exit status.
	steps := readmeSteps(t, name)
	if len(steps) < minSteps {
		t.Fatalf("README: %d tested steps", len(steps))
	}
	var script strings.Builder
	var wants [][]int // per step, per command: the exit status the README says
	for i, s := range steps {
		var codes []int
		for j, c := range s.commands {
			want := 0
			if m := exitComment.FindStringSubmatch(c); m != nil {
				want, _ = strconv.Atoi(m[1])
				c = strings.TrimSuffix(c, m[0])
			}
			codes = append(codes, want)
			fmt.Fprintf(&script, "%s\necho \"@@ %d %d $?\"\n", c, i, j)
		}
		wants = append(wants, codes)
	}
	sh := exec.Command("bash", "-c", script.String())
	sh.Dir = dir
	sh.Env = append(append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH")), env...)
	out, err := sh.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's commands: %v\n%s", err, out)
	}

	// Split the output by step and check it.
	got := make([]strings.Builder, len(steps))
	statuses := map[[2]int]int{}
	step := 0
	for _, line := range strings.Split(string(out), "\n") {
		var i, j, code int
		if n, _ := fmt.Sscanf(line, "@@ %d %d %d", &i, &j, &code); n == 3 {
			statuses[[2]int{i, j}] = code
			if j == len(steps[i].commands)-1 {
				step = i + 1
			}
			continue
		}
		if step < len(got) {
			got[step].WriteString(line + "\n")
		}
	}
	for i, s := range steps {
		for j, c := range s.commands {
			if code, ok := statuses[[2]int{i, j}]; !ok || code != wants[i][j] {
				t.Errorf("README command %q exited %d (ran: %v), want %d\n%s", c, code, ok, wants[i][j], got[i].String())
			}
		}
		for _, want := range s.output {
			if checked.MatchString(want) && !strings.Contains(got[i].String(), want+"\n") {
				t.Errorf("README step %d: output lacks %q; it printed:\n%s", i, want, got[i].String())
			}
		}
		for _, line := range strings.Split(got[i].String(), "\n") {
			if len([]rune(line)) > termWidth {
				t.Errorf("README step %d printed a line of %d characters:\n%s", i, len([]rune(line)), line)
			}
		}
	}
}

// buildToolsvc builds cmd/toolsvc into dir and returns the binary's path.
func buildToolsvc(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "toolsvc")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/toolsvc").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// freeAddr returns a loopback address no one listens on at the moment.
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// waitServing waits until the server at addr answers health checks.
func waitServing(t *testing.T, addr string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("toolsvc at %s is not serving: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDocsLinks: every relative link in the README and docs/ points at a
// file that exists and, with a #fragment, at a heading of that file.
func TestDocsLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"), filepath.Join(root, "BENCHMARKS.md"))
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		inFence := false
		for n, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "```") {
				inFence = !inFence
			}
			if inFence {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, frag, _ := strings.Cut(target, "#")
				path := page
				if file != "" {
					path = filepath.Join(filepath.Dir(page), file)
					if _, err := os.Stat(path); err != nil {
						t.Errorf("%s:%d: link to %s: no such file", page, n+1, target)
						continue
					}
				}
				if frag != "" && strings.HasSuffix(path, ".md") && !hasAnchor(t, path, frag) {
					t.Errorf("%s:%d: link to %s: no such heading", page, n+1, target)
				}
			}
		}
	}
}

// hasAnchor reports whether the markdown file has a heading whose GitHub
// anchor is frag.
func hasAnchor(t *testing.T, path, frag string) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	strip := regexp.MustCompile(`[^a-z0-9 _-]`)
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		if strings.ReplaceAll(strip.ReplaceAllString(h, ""), " ", "-") == frag {
			return true
		}
	}
	return false
}
