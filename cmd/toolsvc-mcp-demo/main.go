// Command toolsvc-mcp-demo is a small MCP server for trying toolsvc's MCP
// connector: a notebook kept in memory, with read-only tools (list_notes,
// read_note), a write (add_note) and a destructive one (delete_note), each
// annotated so that toolsvc derives its risk.
//
// Over stdio (the default), toolsvc starts it:
//
//	connectors:
//	  - id: notebook
//	    type: mcp
//	    transport: stdio
//	    command: [toolsvc-mcp-demo]
//
// Over streamable HTTP it listens on an address; when MCP_DEMO_TOKEN is set
// it requires "Authorization: Bearer $MCP_DEMO_TOKEN" on every request:
//
//	MCP_DEMO_TOKEN=s3cret toolsvc-mcp-demo -http 127.0.0.1:9000
//
//	connectors:
//	  - id: notebook
//	    type: mcp
//	    transport: http
//	    url: http://127.0.0.1:9000/mcp
//	    headers: {Authorization: {secret: token, prefix: "Bearer "}}
//
// -stateless serves HTTP without sessions, which the 2026-07-28 revision of
// the protocol requires; stdio speaks every revision.
package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// tokenEnv names the variable holding the bearer token HTTP requests need.
const tokenEnv = "MCP_DEMO_TOKEN" //nolint:gosec // G101: the name of a variable, not a credential

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "toolsvc-mcp-demo:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends, or until stdin closes for stdio.
func run(ctx context.Context, args []string, stdin io.ReadCloser, stdout io.WriteCloser, stderr io.Writer) error {
	fs := flag.NewFlagSet("toolsvc-mcp-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("http", "", "serve streamable HTTP at this address (path /mcp) instead of stdio")
	stateless := fs.Bool("stateless", false, "serve HTTP without sessions (needed for protocol revision 2026-07-28)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	// Logs go to stderr: on stdio, stdout is the protocol.
	log := slog.New(slog.NewTextHandler(stderr, nil))
	srv := newServer(&notebook{notes: map[string]string{"welcome": "This note comes from toolsvc-mcp-demo."}})
	if *addr == "" {
		return srv.Run(ctx, &sdk.IOTransport{Reader: stdin, Writer: stdout})
	}
	return serveHTTP(ctx, srv, *addr, *stateless, os.Getenv(tokenEnv), log)
}

// serveHTTP serves srv at addr until ctx ends.
func serveHTTP(ctx context.Context, srv *sdk.Server, addr string, stateless bool, token string, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: handler(srv, stateless, token), ReadHeaderTimeout: 10 * time.Second}
	go func() { //nolint:gosec // G118: the shutdown runs once ctx is done, so it needs a context of its own
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(shutdown)
	}()
	log.Info("serving MCP over streamable HTTP", "url", "http://"+ln.Addr().String()+"/mcp",
		"stateless", stateless, "token_required", token != "")
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// handler serves MCP at /mcp, behind a bearer token when one is set.
func handler(srv *sdk.Server, stateless bool, token string) http.Handler {
	mcp := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv },
		&sdk.StreamableHTTPOptions{Stateless: stateless})
	mux := http.NewServeMux()
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, r *http.Request) {
		if token != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+token)) != 1 {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		mcp.ServeHTTP(w, r)
	})
	return mux
}

// notebook holds the notes.
type notebook struct {
	mu    sync.Mutex
	notes map[string]string
}

type titleArgs struct {
	Title string `json:"title" jsonschema:"the note's title"`
}

type addArgs struct {
	Title   string `json:"title" jsonschema:"the note's title"`
	Content string `json:"content" jsonschema:"the note's text"`
}

type noteList struct {
	Titles []string `json:"titles"`
}

type note struct {
	Title   string `json:"title"`
	Content string `json:"content"`
}

// newServer builds the MCP server and its four tools.
func newServer(nb *notebook) *sdk.Server {
	srv := sdk.NewServer(&sdk.Implementation{Name: "toolsvc-mcp-demo", Version: "1.0.0"}, nil)
	closedWorld := false
	sdk.AddTool(srv, &sdk.Tool{
		Name:        "list_notes",
		Description: "List the titles of all notes.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &closedWorld},
	}, func(context.Context, *sdk.CallToolRequest, struct{}) (*sdk.CallToolResult, noteList, error) {
		nb.mu.Lock()
		defer nb.mu.Unlock()
		titles := make([]string, 0, len(nb.notes))
		for t := range nb.notes {
			titles = append(titles, t)
		}
		slices.Sort(titles)
		return nil, noteList{Titles: titles}, nil
	})
	sdk.AddTool(srv, &sdk.Tool{
		Name:        "read_note",
		Description: "Read a note by its title.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &closedWorld},
	}, func(_ context.Context, _ *sdk.CallToolRequest, in titleArgs) (*sdk.CallToolResult, note, error) {
		nb.mu.Lock()
		defer nb.mu.Unlock()
		content, ok := nb.notes[in.Title]
		if !ok {
			// A tool error: the model sees it and can correct itself.
			return nil, note{}, fmt.Errorf("no note titled %q", in.Title)
		}
		return nil, note{Title: in.Title, Content: content}, nil
	})
	notDestructive := false
	sdk.AddTool(srv, &sdk.Tool{
		Name:        "add_note",
		Description: "Add a note, or replace the note with the same title.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &notDestructive, IdempotentHint: true, OpenWorldHint: &closedWorld},
	}, func(_ context.Context, _ *sdk.CallToolRequest, in addArgs) (*sdk.CallToolResult, note, error) {
		if in.Title == "" {
			return nil, note{}, errors.New("a note needs a title")
		}
		nb.mu.Lock()
		defer nb.mu.Unlock()
		nb.notes[in.Title] = in.Content
		return nil, note{Title: in.Title, Content: in.Content}, nil
	})
	destructive := true
	sdk.AddTool(srv, &sdk.Tool{
		Name:        "delete_note",
		Description: "Delete a note for good.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &destructive, OpenWorldHint: &closedWorld},
	}, func(_ context.Context, _ *sdk.CallToolRequest, in titleArgs) (*sdk.CallToolResult, noteList, error) {
		nb.mu.Lock()
		defer nb.mu.Unlock()
		if _, ok := nb.notes[in.Title]; !ok {
			return nil, noteList{}, fmt.Errorf("no note titled %q", in.Title)
		}
		delete(nb.notes, in.Title)
		titles := make([]string, 0, len(nb.notes))
		for t := range nb.notes {
			titles = append(titles, t)
		}
		slices.Sort(titles)
		return nil, noteList{Titles: titles}, nil
	})
	return srv
}
