package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer = testutil.Buffer

func envOf(m map[string]string) env {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func runCmd(t *testing.T, environ map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := run(ctx, args, &stdout, &stderr, envOf(environ))
	return code, stdout.String(), stderr.String()
}

func TestVersion(t *testing.T) {
	code, out, _ := runCmd(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "toolsvc ") {
		t.Fatalf("exit %d, output %q", code, out)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"frobnicate"},
		{"serve", "--no-such-flag"},
		{"serve", "extra"},
		{"migrate", "sideways"},
		{"migrate", "status"}, // no database URL
	} {
		code, _, stderr := runCmd(t, nil, args...)
		if code != exitUsage || !strings.HasPrefix(stderr, "toolsvc: ") {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
}

func TestServeBadConfigurationListsEveryProblem(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("listen: 0.0.0.0:50051\nshutdown_timeout: soon\nunknown_thing: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCmd(t, map[string]string{"TOOLSVC_LOG_FORMAT": "xml"},
		"serve", "--config", file, "--log-level", "loud")
	if code != exitUsage {
		t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"listen:", "loopback", "shutdown_timeout:", "unknown_thing: unknown key", "log.format:", "log.level:", `"loud"`} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "goroutine") || strings.Contains(stderr, "panic") {
		t.Fatalf("stack trace on bad configuration:\n%s", stderr)
	}
}

// serveInBackground runs `toolsvc serve` with args until the test ends and
// returns the address it listens on (from its start log line).
func serveInBackground(t *testing.T, environ map[string]string, args ...string) (addr string, stderr *syncBuffer, stop func() int) {
	t.Helper()
	stderr = &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...), &syncBuffer{}, stderr, envOf(environ))
	}()
	var once sync.Once
	code := -1
	stop = func() int {
		once.Do(func() {
			cancel()
			code = <-done
		})
		return code
	}
	t.Cleanup(func() { stop() })

	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case c := <-done:
			done <- c
			t.Fatalf("serve exited with %d:\n%s", c, stderr.String())
		default:
		}
		sc := bufio.NewScanner(strings.NewReader(stderr.String()))
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "toolsvc serving" {
				return line["listen"].(string), stderr, stop
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("serve did not start:\n%s", stderr.String())
	return "", nil, nil
}

func listTools(t *testing.T, addr string) []string {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := toolsvcv1.NewRegistryServiceClient(conn).ListTools(ctx, &toolsvcv1.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range resp.Tools {
		names = append(names, tl.Name)
	}
	return names
}

func TestServeQuickStart(t *testing.T) {
	addr, stderr, stop := serveInBackground(t, nil)
	if got := listTools(t, addr); len(got) != 6 {
		t.Fatalf("demo tools: %v", got)
	}
	logs := stderr.String()
	for _, want := range []string{`"store":"memory"`, `"tools":6`, `"level":"WARN","msg":"authentication is off`} {
		if !strings.Contains(logs, want) {
			t.Errorf("start log lacks %s:\n%s", want, logs)
		}
	}
	if code := stop(); code != 0 {
		t.Fatalf("exit %d after shutdown:\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), `"msg":"drained"`) {
		t.Fatalf("no drain on shutdown:\n%s", stderr.String())
	}
}

func TestServeRefusesDatabaseBehindMigrations(t *testing.T) {
	dbURL := pgtest.NewEmptyDatabase(t)
	code, _, stderr := runCmd(t, nil, "serve", "--listen", "127.0.0.1:0", "--database-url", dbURL)
	if code != exitFailure || !strings.Contains(stderr, "database schema is behind") || !strings.Contains(stderr, "toolsvc migrate up") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
}

func TestMigrateUpAndStatus(t *testing.T) {
	dbURL := pgtest.NewEmptyDatabase(t)
	environ := map[string]string{"TOOLSVC_DATABASE_URL": dbURL}

	code, out, stderr := runCmd(t, environ, "migrate", "status")
	if code != 0 || !strings.Contains(out, "0001") || !strings.Contains(out, "pending") || strings.Contains(out, " applied ") {
		t.Fatalf("status before: exit %d\n%s%s", code, out, stderr)
	}

	code, out, stderr = runCmd(t, nil, "migrate", "up", "--database-url", dbURL)
	if code != 0 || !strings.Contains(out, "applied 0001_") {
		t.Fatalf("up: exit %d\n%s%s", code, out, stderr)
	}
	code, out, _ = runCmd(t, environ, "migrate", "up")
	if code != 0 || !strings.Contains(out, "up to date") {
		t.Fatalf("second up: exit %d\n%s", code, out)
	}

	code, out, stderr = runCmd(t, environ, "migrate", "status")
	if code != 0 || strings.Contains(out, "pending") || !strings.Contains(out, "applied") || !strings.Contains(out, "up to date") {
		t.Fatalf("status after: exit %d\n%s%s", code, out, stderr)
	}

	// The migrated database serves, without demo tools by default.
	addr, stderr2, stop := serveInBackground(t, environ)
	if got := listTools(t, addr); len(got) != 0 {
		t.Fatalf("Postgres serves %v without demo_tools", got)
	}
	if !strings.Contains(stderr2.String(), `"store":"postgres"`) {
		t.Fatalf("start log:\n%s", stderr2.String())
	}
	if code := stop(); code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr2.String())
	}
}

// TestServeAuthenticationWithoutDatabase: with authentication on and no
// database, toolsvc refuses to start, saying how to go on; asked for by
// name, the memory store serves, without the demo tools unless they are
// asked for too.
func TestServeAuthenticationWithoutDatabase(t *testing.T) {
	file := filepath.Join(t.TempDir(), "auth.yaml")
	conf := "auth: {enabled: true}\nprincipals: [{id: agent-1, roles: [agent], token_sha256: \"" +
		strings.Repeat("0", 63) + "1\"}]\n"
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCmd(t, nil, "serve", "--listen", "127.0.0.1:0", "--config", file)
	if code != exitUsage || !strings.Contains(stderr, "database_url: authentication is on but no database is configured") ||
		!strings.Contains(stderr, "store: memory") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}

	_, stderr2, stop := serveInBackground(t, nil, "--config", file, "--store", "memory")
	for _, want := range []string{`"store":"memory"`, `"tools":0`, `"demo_tools":false`} {
		if !strings.Contains(stderr2.String(), want) {
			t.Errorf("start log lacks %s:\n%s", want, stderr2.String())
		}
	}
	if code := stop(); code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr2.String())
	}
	_, stderr3, stop := serveInBackground(t, map[string]string{"TOOLSVC_STORE": "memory", "TOOLSVC_DEMO_TOOLS": "true"}, "--config", file)
	if !strings.Contains(stderr3.String(), `"tools":6`) {
		t.Errorf("demo tools asked for, start log:\n%s", stderr3.String())
	}
	stop()
}
