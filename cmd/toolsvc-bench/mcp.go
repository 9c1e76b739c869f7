package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolsvc/toolsvc/internal/config"
)

// The MCP cells: an MCP server's tool called directly by an MCP client,
// and the same tool called through toolsvc's MCP front door, where the
// server is an MCP connector (memory store and Postgres). The difference is
// what the front door and the pipeline add.
const (
	subjMCPDirect   = "mcp/direct"
	subjMCPMemory   = "mcp/memory"
	subjMCPPostgres = "mcp/postgres"
)

// mcpConnector is the connector id of the upstream server in toolsvc: its
// echo tool is exported as bench__echo.
const (
	mcpConnector = "bench"
	mcpToolName  = "echo"
	mcpExported  = mcpConnector + "__" + mcpToolName
)

// upstream is the MCP server measured: stateless streamable HTTP with one
// read-only tool.
type upstream struct {
	url  string
	srv  *http.Server
	done chan struct{}
}

type echoIn struct {
	Message string `json:"message" jsonschema:"the text to echo"`
}

type echoOut struct {
	Message string `json:"message"`
}

func startUpstream() (*upstream, error) {
	s := mcp.NewServer(&mcp.Implementation{Name: "bench-upstream", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: mcpToolName, Description: "Echo the message.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, echoOut, error) {
			return nil, echoOut{Message: in.Message}, nil
		})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true})
	u := &upstream{url: "http://" + lis.Addr().String() + "/mcp", done: make(chan struct{}),
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		defer close(u.done)
		_ = u.srv.Serve(lis)
	}()
	return u, nil
}

func (u *upstream) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := u.srv.Shutdown(ctx)
	<-u.done
	return err
}

// withFrontDoor configures a toolsvc with the front door on a free port and
// the upstream server as an MCP connector (a tools file in dir).
func withFrontDoor(up *upstream, dir string) (func(*config.Config), error) {
	file := filepath.Join(dir, "connectors.yaml")
	def := fmt.Sprintf("connectors:\n  - {id: %s, type: mcp, transport: http, url: %q}\n", mcpConnector, up.url)
	if err := os.WriteFile(file, []byte(def), 0o600); err != nil {
		return nil, err
	}
	return func(c *config.Config) {
		c.ToolsFile = file
		c.MCP.Listen = "127.0.0.1:0"
	}, nil
}

// mcpHTTP is the HTTP client of every MCP caller: connections kept for as
// many callers as a cell has, so that callers do not dial per call.
func mcpHTTP(maxCallers int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 2 * maxCallers
	tr.MaxIdleConnsPerHost = 2 * maxCallers
	return &http.Client{Transport: principalHeaderTransport{tr}}
}

// principalHeaderTransport names the benchmark's principal on every
// request (the front door's authentication is off).
type principalHeaderTransport struct{ base http.RoundTripper }

func (t principalHeaderTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(principalHeader, principal)
	return t.base.RoundTrip(r)
}

// mcpSubject measures tools/call of name at url: caller i has an MCP session
// of its own (the client's default revision, 2026-07-28), kept from cell to
// cell and closed when the run ends.
func mcpSubject(e *env, subjectName, url, name string, hc *http.Client) subject {
	var (
		mu       sync.Mutex
		sessions = map[int]*mcp.ClientSession{}
	)
	e.onClose(func() error {
		mu.Lock()
		defer mu.Unlock()
		var errs []error
		for _, cs := range sessions {
			errs = append(errs, cs.Close())
		}
		return errors.Join(errs...)
	})
	session := func(ctx context.Context, i int) (*mcp.ClientSession, error) {
		mu.Lock()
		defer mu.Unlock()
		if cs, ok := sessions[i]; ok {
			return cs, nil
		}
		c := mcp.NewClient(&mcp.Implementation{Name: "toolsvc-bench", Version: "1"}, nil)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, DisableStandaloneSSE: true}, nil)
		if err != nil {
			return nil, fmt.Errorf("connect %s: %w", url, err)
		}
		sessions[i] = cs
		return cs, nil
	}
	return subject{name: subjectName, caller: func(ctx context.Context, _, _, i int) (func(context.Context) error, error) {
		cs, err := session(ctx, i)
		if err != nil {
			return nil, err
		}
		params := &mcp.CallToolParams{Name: name, Arguments: map[string]any{"message": "hello, benchmark"}}
		return func(ctx context.Context) error {
			res, err := cs.CallTool(ctx, params)
			if err != nil {
				return fmt.Errorf("tools/call %s: %w", name, err)
			}
			if res.IsError {
				var text []string
				for _, c := range res.Content {
					if tc, ok := c.(*mcp.TextContent); ok {
						text = append(text, tc.Text)
					}
				}
				return fmt.Errorf("tools/call %s: isError: %s", name, strings.Join(text, " "))
			}
			return nil
		}, nil
	}}
}

// mcpSetup starts the upstream server and adds the direct subject; the
// front-door subjects are added by the stores' setup (frontDoorSubject).
func mcpSetup(e *env, o *options) (*upstream, *http.Client, func(*config.Config), error) {
	up, err := startUpstream()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("MCP server: %w", err)
	}
	e.onClose(up.stop)
	dir, err := os.MkdirTemp("", "toolsvc-bench-")
	if err != nil {
		return nil, nil, nil, err
	}
	e.onClose(func() error { return os.RemoveAll(dir) })
	tweak, err := withFrontDoor(up, dir)
	if err != nil {
		return nil, nil, nil, err
	}
	maxCallers := 0
	for _, c := range o.callers {
		maxCallers = max(maxCallers, c)
	}
	return up, mcpHTTP(maxCallers), tweak, nil
}

// frontDoorURL is a toolsvc's MCP endpoint.
func (s *toolsvcServer) frontDoorURL() (string, error) {
	if s.mcpAddr == "" {
		return "", errors.New("toolsvc serves no MCP front door")
	}
	return "http://" + s.mcpAddr + "/mcp", nil
}

// addedDefs are the latencies the report shows as added by toolsvc: the
// median p50 of sub over the repetitions less base's, at each caller count.
var addedDefs = []struct{ name, sub, base, target string }{
	{"mcp/memory − mcp/direct", subjMCPMemory, subjMCPDirect, "≤ 1 ms at 1"},
	{"mcp/postgres − mcp/direct", subjMCPPostgres, subjMCPDirect, "≤ 3 ms at 1"},
}

// addedRow is one added latency at one caller count: per repetition the
// difference of the two subjects' p50, and their median.
type addedRow struct {
	Added   string    `json:"added"`
	Callers int       `json:"callers"`
	Median  float64   `json:"median_us"`
	PerRep  []float64 `json:"per_rep_us"`
	Target  string    `json:"target"`
}

// addedLatencies computes addedDefs from the cells.
func addedLatencies(o *options, cells []cell) []addedRow {
	type key struct {
		subject      string
		rep, callers int
	}
	p50 := map[key]float64{}
	for _, c := range cells {
		if c.Calls > 0 {
			p50[key{c.Subject, c.Rep, c.Callers}] = c.P50Micros
		}
	}
	var rows []addedRow
	for _, d := range addedDefs {
		for _, n := range o.callers {
			row := addedRow{Added: d.name, Callers: n, Target: d.target}
			for rep := 1; rep <= o.reps; rep++ {
				s, okS := p50[key{d.sub, rep, n}]
				b, okB := p50[key{d.base, rep, n}]
				if okS && okB {
					row.PerRep = append(row.PerRep, s-b)
				}
			}
			if len(row.PerRep) > 0 {
				row.Median = median(row.PerRep)
				rows = append(rows, row)
			}
		}
	}
	return rows
}
