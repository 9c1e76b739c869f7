package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/idempotency"
)

// MCP client flags (see docs/mcp.md#the-command-line-client).
const (
	flagMCPURL      = "url"
	flagMCPProtocol = "protocol"
	defaultMCPURL   = "http://127.0.0.1:8080/mcp"
	envMCPURL       = config.EnvPrefix + "_MCP_URL"
)

// mcpFlags are the flags of the MCP client commands.
type mcpFlags struct {
	url, principal, protocol string
	timeout                  time.Duration
	output                   string
	access                   accessFlags
}

func newMCPCommand(lookupEnv env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Use the MCP front door as an MCP client would (tools, call)",
		Long: `Talk to a toolsvc's MCP front door (toolsvc serve --mcp-listen) with an MCP
client: list the tools a principal is given, call one and print what the
client receives. It is the MCP SDK's own client; MCP-speaking agents see the
same. docs/mcp.md has the rules (held calls, the plain retry, _meta).`,
		Args: noArgs,
		RunE: showHelp,
	}
	f := &mcpFlags{}
	fs := cmd.PersistentFlags()
	fs.StringVar(&f.url, flagMCPURL, defaultMCPURL, "the front door's URL (or "+envMCPURL+")")
	fs.StringVar(&f.principal, flagPrincipal, "", "principal to act as while the server's authentication is off, sent as X-Toolsvc-Principal (or "+envPrincipal+")")
	fs.StringVar(&f.protocol, flagMCPProtocol, "", "MCP protocol revision to speak: 2025-06-18, 2025-11-25 or 2026-07-28 (default: the newest)")
	fs.DurationVar(&f.timeout, flagTimeout, 2*time.Minute, "deadline of each request (a held call waits for its approval)")
	fs.StringVarP(&f.output, flagOutput, "o", outputTable, "output format: table (for people) or json (the MCP result, for scripts)")
	f.access.register(fs)
	cmd.AddCommand(newMCPToolsCommand(f, lookupEnv), newMCPCallCommand(f, lookupEnv))
	return cmd
}

// connect opens a session with the front door.
func (f *mcpFlags) connect(cmd *cobra.Command, lookupEnv env) (*mcp.ClientSession, context.Context, context.CancelFunc, error) {
	fs := cmd.Flags()
	u, principal := f.url, f.principal
	lookupEnv.fill(fs, flagMCPURL, envMCPURL, &u, false)
	lookupEnv.fill(fs, flagPrincipal, envPrincipal, &principal, true)
	principal = strings.TrimSpace(principal)
	var problems []string
	parsed, err := url.Parse(u)
	if err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
		problems = append(problems, fmt.Sprintf("--%s: want http(s)://host:port/mcp, not %q", flagMCPURL, u))
	}
	if principal != "" {
		if err := auth.ValidatePrincipalID(principal); err != nil {
			problems = append(problems, fmt.Sprintf("--principal: %v", err))
		}
	}
	switch f.protocol {
	case "", "2025-06-18", "2025-11-25", "2026-07-28":
	default:
		problems = append(problems, fmt.Sprintf("--%s must be 2025-06-18, 2025-11-25 or 2026-07-28, not %q", flagMCPProtocol, f.protocol))
	}
	if f.timeout <= 0 {
		problems = append(problems, fmt.Sprintf("--timeout must be positive, not %s", f.timeout))
	}
	if f.output != outputTable && f.output != outputJSON {
		problems = append(problems, fmt.Sprintf("--output must be table or json, not %q", f.output))
	}
	access := f.access
	if err := access.resolve(fs, lookupEnv); err != nil {
		problems = append(problems, err.Error())
	}
	token, err := access.bearer()
	if err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) == 0 && parsed.Scheme == "https" {
		access.tls = true
	}
	if len(problems) == 0 && token != "" {
		if err := checkPlaintextToken(hostPort(parsed), &access); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return nil, nil, nil, usage(errors.New(strings.Join(problems, "; ")))
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if access.usesTLS() {
		if tr.TLSClientConfig, err = access.tlsConfig(hostPort(parsed)); err != nil {
			return nil, nil, nil, usage(err)
		}
	}
	h := http.Header{"User-Agent": {"toolsvc-cli/" + buildVersion()}}
	if principal != "" {
		h.Set(auth.PrincipalHeader, principal)
	}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "toolsvc-cli", Version: buildVersion()}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		// Input-required results are printed, not answered.
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
	})
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	var so *mcp.ClientSessionOptions
	if f.protocol != "" {
		so = &mcp.ClientSessionOptions{ProtocolVersion: f.protocol}
	}
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: u, HTTPClient: &http.Client{Transport: headers{base: tr, h: h}}, DisableStandaloneSSE: true,
	}, so)
	if err != nil {
		cancel()
		fmt.Fprintln(cmd.ErrOrStderr(), wrapped(fmt.Sprintf("toolsvc: MCP at %s: %v", u, err)))
		return nil, nil, nil, &exitError{code: exitRPC}
	}
	return cs, ctx, cancel, nil
}

// hostPort is a URL's host:port, the port from the scheme when absent.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// headers adds headers to every request.
type headers struct {
	base http.RoundTripper
	h    http.Header
}

func (t headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, vs := range t.h {
		r.Header[k] = vs
	}
	return t.base.RoundTrip(r)
}

func newMCPToolsCommand(f *mcpFlags, lookupEnv env) *cobra.Command {
	return &cobra.Command{
		Use:   "tools",
		Short: "List the tools the front door gives the principal",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cs, ctx, cancel, err := f.connect(cmd, lookupEnv)
			if err != nil {
				return err
			}
			defer cancel()
			defer cs.Close()
			res, err := cs.ListTools(ctx, nil)
			if err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), wrapped("toolsvc: tools/list: "+err.Error()))
				return &exitError{code: exitRPC}
			}
			out := cmd.OutOrStdout()
			if f.output == outputJSON {
				return writeJSON(out, res)
			}
			tw := tabwriter.NewWriter(out, 0, 2, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tTITLE\tHINTS\tDESCRIPTION")
			for _, t := range res.Tools {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, orDash(t.Title), hints(t), firstLine(t.Description, 50))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if in := cs.InitializeResult().Instructions; in != "" {
				fmt.Fprintf(out, "\nInstructions:\n%s\n", indent(in))
			}
			return nil
		},
	}
}

// hints summarises a tool's annotations.
func hints(t *mcp.Tool) string {
	a := t.Annotations
	var out []string
	switch {
	case a == nil:
	case a.ReadOnlyHint:
		out = append(out, "read-only")
	case a.DestructiveHint != nil && *a.DestructiveHint:
		out = append(out, "destructive")
	}
	if h, ok := t.Meta["io.toolsvc/health"].(string); ok {
		out = append(out, strings.ToLower(h))
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ",")
}

// firstLine is the first line of s, at most n characters.
func firstLine(s string, n int) string {
	s, _, _ = strings.Cut(s, "\n")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ")
}

func writeJSON(w interface{ Write([]byte) (int, error) }, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func newMCPCallCommand(f *mcpFlags, lookupEnv env) *cobra.Command {
	var args, key string
	cmd := &cobra.Command{
		Use:   "call NAME",
		Short: "Call a tool by its MCP name and print the result",
		Long: `Call a tool by the name tools/list gives it (echo, notes__write) with --args,
and print the result as an MCP client receives it: its outcome, call and
text. A call parked behind an approval is held by the server (mcp.approval_wait)
while a person decides; calling again with the same arguments resumes it.
Exit status: 0 SUCCEEDED; 1 FAILED or DENIED; 3 the call waits on a person;
4 refused, or the server could not be reached; 5 UNKNOWN (the tool may have
acted).`,
		Args: exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, pos []string) error {
			var arguments json.RawMessage
			if strings.TrimSpace(args) != "" {
				_, v, err := idempotency.Parse([]byte(args))
				if err != nil {
					return usage(fmt.Errorf("--args is not valid JSON: %w", err))
				}
				if _, ok := v.(map[string]any); !ok {
					return usage(fmt.Errorf("--args must be a JSON object like {\"name\": \"value\"}, not %s", jsonKind(v)))
				}
				arguments = json.RawMessage(args)
			}
			cs, ctx, cancel, err := f.connect(cmd, lookupEnv)
			if err != nil {
				return err
			}
			defer cancel()
			defer cs.Close()
			p := &mcp.CallToolParams{Name: pos[0], Arguments: arguments}
			if key != "" {
				p.Meta = mcp.Meta{"io.toolsvc/idempotency_key": key}
			}
			res, err := cs.CallTool(ctx, p)
			if err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), wrapped("toolsvc: tools/call "+pos[0]+": "+err.Error()))
				return &exitError{code: exitRPC}
			}
			if f.output == outputJSON {
				if err := writeJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else if err := printMCPResult(cmd.OutOrStdout(), res); err != nil {
				return err
			}
			return mcpExit(res)
		},
	}
	cmd.Flags().StringVar(&args, "args", "", "arguments as a JSON object")
	idempotencyKeyFlag(cmd, &key, "idempotency key, sent in _meta (io.toolsvc/idempotency_key)")
	return cmd
}

// printMCPResult prints a call's result for people.
func printMCPResult(w interface{ Write([]byte) (int, error) }, res *mcp.CallToolResult) error {
	str := func(k string) string { s, _ := res.Meta[k].(string); return s }
	f := newFields(w)
	outcome := str("io.toolsvc/outcome")
	if res.NeedsInput() {
		outcome += " (input required)"
	}
	f.add("Outcome", outcome)
	f.add("Reason", str("io.toolsvc/reason"))
	f.add("Call", str("io.toolsvc/call_id"))
	f.add("Key", str("io.toolsvc/idempotency_key"))
	f.add("Approval", str("io.toolsvc/approval_id"))
	var text []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text = append(text, tc.Text)
		}
	}
	f.add("Text", strings.Join(text, "\n"))
	for id, r := range res.InputRequests {
		if ep, ok := r.(*mcp.ElicitParams); ok {
			f.add("Input "+id, ep.URL)
		}
	}
	return f.flush()
}

// mcpExit is the exit status of a call's result.
func mcpExit(res *mcp.CallToolResult) error {
	outcome, _ := res.Meta["io.toolsvc/outcome"].(string)
	switch {
	case outcome == "SUCCEEDED" && !res.IsError:
		return nil
	case outcome == "APPROVAL_REQUIRED" || outcome == "PREVIEW_REQUIRED":
		return &exitError{code: exitWaiting}
	case outcome == "ERROR":
		return &exitError{code: exitRPC}
	case outcome == "UNKNOWN":
		return &exitError{code: exitUnknown}
	}
	return &exitError{code: exitFailure}
}
