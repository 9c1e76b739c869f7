package frontdoor_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// npmDir holds the test-only npm package of the MCP client (installed by
// .ci/run with npm ci).
var npmDir = filepath.Join("testdata", "npm")

// requireNode returns node's path, or fails (under CI) or skips the test
// when node or the npm packages are missing.
func requireNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(npmDir, "node_modules", "@modelcontextprotocol", "sdk", "package.json"))
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the npm MCP client needs node and its packages (npm ci --prefix %s): %v", npmDir, err)
		}
		t.Skipf("no npm MCP client (npm ci --prefix %s): %v", npmDir, err)
	}
	return node
}

// npmPlan is what client.mjs runs.
type npmPlan struct {
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	TLS     *npmTLS           `json:"tls,omitempty"`
	Steps   []npmStep         `json:"steps"`
}

type npmTLS struct {
	CA   string `json:"ca"`
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
}

type npmStep struct {
	Op        string         `json:"op"`
	Name      string         `json:"name,omitempty"`
	Arguments map[string]any `json:"arguments,omitempty"`
	Meta      map[string]any `json:"meta,omitempty"`
}

// npmLine is one line client.mjs printed.
type npmLine struct {
	Step            any    `json:"step"`
	OK              bool   `json:"ok"`
	Error           string `json:"error"`
	ProtocolVersion string `json:"protocolVersion"`
	Tools           []struct {
		Name        string          `json:"name"`
		Annotations map[string]any  `json:"annotations"`
		Meta        map[string]any  `json:"_meta"`
		InputSchema json.RawMessage `json:"inputSchema"`
	} `json:"tools"`
	Result *struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		StructuredContent map[string]any `json:"structuredContent"`
		IsError           bool           `json:"isError"`
		Meta              map[string]any `json:"_meta"`
	} `json:"result"`
}

func (l npmLine) meta(key string) string {
	if l.Result == nil {
		return ""
	}
	s, _ := l.Result.Meta[key].(string)
	return s
}

// runNPM runs a plan with the npm client and returns its lines: the
// connection's, then one per step.
func runNPM(t *testing.T, node string, plan npmPlan) []npmLine {
	t.Helper()
	in, err := json.Marshal(plan)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(testCtx(t), node, "client.mjs")
	cmd.Dir = npmDir
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node client.mjs: %v\n%s\n%s", err, out, stderr.String())
	}
	var lines []npmLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var l npmLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("client.mjs printed %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	if len(lines) != len(plan.Steps)+1 || !lines[0].OK {
		t.Fatalf("client.mjs: %s\n%s", out, stderr.String())
	}
	return lines
}

// wantNPMOutcome checks a step's result.
func wantNPMOutcome(t *testing.T, what string, l npmLine, outcome string) {
	t.Helper()
	if !l.OK || l.Result == nil {
		t.Fatalf("%s: %+v", what, l)
	}
	if got := l.meta("io.toolsvc/outcome"); got != outcome || l.Result.IsError != (outcome != "SUCCEEDED") {
		t.Fatalf("%s: outcome %q isError %v, want %s: %+v", what, got, l.Result.IsError, outcome, l.Result)
	}
}

// TestNPMClient drives the front door with the npm SDK's client: it lists
// the tools, calls echo (the client checks the structured content against
// the output schema), sees a failure and an unknown tool, has a call held
// while a person approves it through gRPC, and resumes a parked call with a
// plain retry.
func TestNPMClient(t *testing.T) {
	node := requireNode(t)
	forEachBackend(t, func(t *testing.T, backend string) {
		db := database(t, backend)
		s := startServer(t, serverOptions{databaseURL: db, wait: 40 * time.Second})
		held := make(chan []npmLine, 1)
		go func() {
			held <- runNPM(t, node, npmPlan{URL: s.url, Headers: map[string]string{"X-Toolsvc-Principal": agentA}, Steps: []npmStep{
				{Op: "list"},
				{Op: "call", Name: "echo", Arguments: map[string]any{"message": "from npm"}},
				{Op: "call", Name: "flaky__run", Arguments: map[string]any{"mode": "fail"}},
				{Op: "call", Name: "no_such_tool"},
				{Op: "call", Name: "notes__write", Arguments: map[string]any{"path": "/npm.md", "content": "n"}},
			}})
		}()
		ap := s.pendingApproval(t, agentA, "notes")
		s.resolve(t, ap.GetApprovalId(), true, "npm")
		lines := <-held
		if lines[0].ProtocolVersion != "2025-11-25" {
			t.Fatalf("the npm client negotiated %q", lines[0].ProtocolVersion)
		}
		names := map[string]bool{}
		for _, tool := range lines[1].Tools {
			names[tool.Name] = true
			if tool.Name == "notes__write" && (tool.Annotations["destructiveHint"] != true || tool.Meta["io.toolsvc/tool"] != "notes") {
				t.Fatalf("notes__write as the npm client sees it: %+v", tool)
			}
		}
		if !names["echo"] || !names["notes__write"] {
			t.Fatalf("the npm client was listed %v", names)
		}
		wantNPMOutcome(t, "echo", lines[2], "SUCCEEDED")
		if lines[2].Result.StructuredContent["message"] != "from npm" {
			t.Fatalf("echo's structured content %v", lines[2].Result.StructuredContent)
		}
		if st := s.storedCall(t, agentA, lines[2].meta("io.toolsvc/call_id")); st.GetTool() != "echo" || st.GetResult().GetMessage() != "echo: from npm" {
			t.Fatalf("stored %v", st)
		}
		wantNPMOutcome(t, "a failure", lines[3], "FAILED")
		if lines[4].OK || !strings.Contains(lines[4].Error, "no tool named") {
			t.Fatalf("an unknown tool: %+v", lines[4])
		}
		wantNPMOutcome(t, "the held call", lines[5], "SUCCEEDED")
		if lines[5].meta("io.toolsvc/call_id") != ap.GetCallId() {
			t.Fatalf("the held call ran %v, not %s", lines[5].Result.Meta, ap.GetCallId())
		}

		// The plain retry, with a server that answers at once.
		s0 := startServer(t, serverOptions{databaseURL: database(t, backend), wait: 0, noPage: true})
		plan := npmPlan{URL: s0.url, Headers: map[string]string{"X-Toolsvc-Principal": agentB}, Steps: []npmStep{
			{Op: "list"},
			{Op: "call", Name: "notes__write", Arguments: map[string]any{"path": "/npm-retry.md", "content": "r"}},
		}}
		first := runNPM(t, node, plan)[2]
		wantNPMOutcome(t, "the parked call", first, "APPROVAL_REQUIRED")
		if !strings.Contains(first.Result.Content[0].Text, "same arguments") {
			t.Fatalf("parked text: %q", first.Result.Content[0].Text)
		}
		s0.resolve(t, first.meta("io.toolsvc/approval_id"), true, "npm retry")
		second := runNPM(t, node, plan)[2]
		wantNPMOutcome(t, "the plain retry", second, "SUCCEEDED")
		if second.meta("io.toolsvc/call_id") != first.meta("io.toolsvc/call_id") {
			t.Fatalf("the retry ran %s, not %s", second.meta("io.toolsvc/call_id"), first.meta("io.toolsvc/call_id"))
		}
	})
}

// TestNPMAuthentication: the npm client with a bearer token, and with a
// client certificate over TLS; without credentials it cannot connect.
func TestNPMAuthentication(t *testing.T) {
	node := requireNode(t)
	forEachBackend(t, func(t *testing.T, backend string) {
		s := startAuthServer(t, backend)
		dir := t.TempDir()
		ca := s.pki.serverCA.Write(t, dir, "server-ca")
		certB := s.certB.Write(t, dir, "agent-b")
		steps := []npmStep{{Op: "list"}, {Op: "call", Name: "echo", Arguments: map[string]any{"message": "tls"}}}

		byToken := runNPM(t, node, npmPlan{URL: s.url, TLS: &npmTLS{CA: ca}, Headers: map[string]string{"Authorization": "Bearer " + s.tokens[agentA]}, Steps: steps})
		wantNPMOutcome(t, "a call with a token", byToken[2], "SUCCEEDED")
		if st := s.storedCall(t, "ops", byToken[2].meta("io.toolsvc/call_id")); st.GetPrincipal() != agentA {
			t.Fatalf("stored principal %q", st.GetPrincipal())
		}
		byCert := runNPM(t, node, npmPlan{URL: s.url, TLS: &npmTLS{CA: ca, Cert: certB.Cert, Key: certB.Key}, Steps: steps})
		wantNPMOutcome(t, "a call with a client certificate", byCert[2], "SUCCEEDED")
		if st := s.storedCall(t, "ops", byCert[2].meta("io.toolsvc/call_id")); st.GetPrincipal() != agentB {
			t.Fatalf("stored principal %q", st.GetPrincipal())
		}

		in, _ := json.Marshal(npmPlan{URL: s.url, TLS: &npmTLS{CA: ca}})
		cmd := exec.CommandContext(testCtx(t), node, "client.mjs")
		cmd.Dir, cmd.Stdin = npmDir, bytes.NewReader(in)
		out, err := cmd.Output()
		if err != nil || !strings.Contains(string(out), `"ok":false`) || !strings.Contains(string(out), "no credentials") {
			t.Fatalf("no credentials: %v %s", err, out)
		}
	})
}
