package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

func newToolsetsCommand(lookupEnv env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "toolsets",
		Short: "List, show, register, enable, disable and deregister toolsets",
		Long: `A toolset groups tools under a title and model-facing guidance: the text a
model reads before it uses them (see docs/exports.md). Exports carry the
guidance of the toolsets of the tools they hold; a disabled toolset exports
nothing. Toolsets shape what models are shown, never who may call what
(scopes do).`,
		Args: noArgs,
		RunE: showHelp,
	}
	cf := addClientFlags(cmd)
	registry := func(c *client) toolsvcv1.RegistryServiceClient { return toolsvcv1.NewRegistryServiceClient(c.conn) }

	list := &cobra.Command{
		Use:   "list",
		Short: "List the toolsets you may see, by name",
		Args:  noArgs,
	}
	limit := addLimitFlag(list)
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkLimit(*limit); err != nil {
			return err
		}
		return cf.withClient(cmd, lookupEnv, func(c *client) error {
			sets, err := collect(c, *limit, maxPage, func(ctx context.Context, size int32, token string) ([]*toolsvcv1.Toolset, string, error) {
				resp, err := registry(c).ListToolsets(ctx, &toolsvcv1.ListToolsetsRequest{PageSize: size, PageToken: token})
				return resp.GetToolsets(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(&toolsvcv1.ListToolsetsResponse{Toolsets: sets})
			}
			tw := newTable(c.stdout, "NAME!", "VERSION", "SOURCE", "ENABLED", "TITLE", "TOOLS")
			for _, ts := range sets {
				tw.row(ts.GetName(), fmt.Sprint(ts.GetVersion()), strings.ToLower(enumName(ts.GetSource())),
					map[bool]string{true: "no", false: "yes"}[ts.GetDisabled()], ts.GetTitle(), strings.Join(ts.GetTools(), ","))
			}
			return tw.flush()
		})
	}

	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show one toolset with its guidance",
		Args:  exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.GetToolsetResponse, error) {
					return registry(c).GetToolset(ctx, &toolsvcv1.GetToolsetRequest{Name: args[0]})
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(resp)
				}
				return printToolset(c.stdout, resp.GetToolset())
			})
		},
	}

	var validateOnly bool
	var expected int64
	register := &cobra.Command{
		Use:   "register FILE",
		Short: "Create or replace a toolset from a YAML or JSON file (operators)",
		Long: `Create a toolset or replace its definition from FILE ("-": standard input): the
Toolset message as YAML or JSON (name, title, guidance, tools, disabled), a
RegisterToolsetRequest body {"toolset": {...}}, or a tools file with exactly
one entry under "toolsets:". Every tool it names must be registered.`,
		Example: `  toolsvc toolsets register notes-toolset.yaml`,
		Args:    exactArgs("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if expected < 0 {
				return usage(fmt.Errorf("--expected-version must be positive (or 0: create or replace), not %d", expected))
			}
			ts, err := readToolsetFile(args[0], cmd.InOrStdin())
			if err != nil {
				return err
			}
			req := &toolsvcv1.RegisterToolsetRequest{Toolset: ts, ExpectedVersion: expected, ValidateOnly: validateOnly}
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				return registerToolset(c, req, validateOnly)
			})
		},
	}
	register.Flags().BoolVar(&validateOnly, "validate-only", false, "check the definition; write nothing")
	register.Flags().Int64Var(&expected, "expected-version", 0, "succeed only if the stored toolset has this version (0: create or replace)")

	enable := func(use, short string, disabled bool) *cobra.Command {
		return &cobra.Command{
			Use:   use,
			Short: short,
			Args:  exactArgs("NAME"),
			RunE: func(cmd *cobra.Command, args []string) error {
				return cf.withClient(cmd, lookupEnv, func(c *client) error {
					resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.GetToolsetResponse, error) {
						return registry(c).GetToolset(ctx, &toolsvcv1.GetToolsetRequest{Name: args[0]})
					})
					if err != nil {
						return err
					}
					ts := resp.GetToolset()
					ts.Disabled = disabled
					// Only if nobody changed it meanwhile.
					return registerToolset(c, &toolsvcv1.RegisterToolsetRequest{Toolset: ts, ExpectedVersion: ts.GetVersion()}, false)
				})
			},
		}
	}

	var deregExpected int64
	deregister := &cobra.Command{
		Use:   "deregister NAME",
		Short: "Remove a toolset; its tools stay (operators)",
		Args:  exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if deregExpected < 0 {
				return usage(fmt.Errorf("--expected-version must be positive (or 0: any), not %d", deregExpected))
			}
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.DeregisterToolsetResponse, error) {
					return registry(c).DeregisterToolset(ctx, &toolsvcv1.DeregisterToolsetRequest{Name: args[0], ExpectedVersion: deregExpected})
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(resp)
				}
				fmt.Fprintf(c.stdout, "Deregistered toolset %s (it was at version %d).\n", resp.GetToolset().GetName(), resp.GetToolset().GetVersion())
				return nil
			})
		},
	}
	deregister.Flags().Int64Var(&deregExpected, "expected-version", 0, "succeed only if the stored toolset has this version (0: any)")

	cmd.AddCommand(list, get, register,
		enable("enable NAME", "Enable a toolset: its tools and guidance are exported again (operators)", false),
		enable("disable NAME", "Disable a toolset: it exports nothing (operators)", true),
		deregister)
	return cmd
}

func registerToolset(c *client, req *toolsvcv1.RegisterToolsetRequest, validateOnly bool) error {
	resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.RegisterToolsetResponse, error) {
		return toolsvcv1.NewRegistryServiceClient(c.conn).RegisterToolset(ctx, req)
	})
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(resp)
	}
	ts := resp.GetToolset()
	state := map[bool]string{true: "disabled", false: "enabled"}[ts.GetDisabled()]
	switch {
	case validateOnly:
		fmt.Fprintf(c.stdout, "Toolset %s is valid; nothing was written.\n", ts.GetName())
	case resp.GetCreated():
		fmt.Fprintf(c.stdout, "Created toolset %s, version %d (%s).\n", ts.GetName(), ts.GetVersion(), state)
	default:
		fmt.Fprintf(c.stdout, "Registered toolset %s, version %d (%s; an unchanged definition keeps its version).\n", ts.GetName(), ts.GetVersion(), state)
	}
	return nil
}

func printToolset(w io.Writer, ts *toolsvcv1.Toolset) error {
	f := newFields(w)
	f.add("Name", ts.GetName())
	f.add("Title", ts.GetTitle())
	f.add("Enabled", map[bool]string{true: "no", false: "yes"}[ts.GetDisabled()])
	f.add("Version", fmt.Sprint(ts.GetVersion()))
	f.add("Source", strings.ToLower(enumName(ts.GetSource())))
	f.add("Tools", strings.Join(ts.GetTools(), ", "))
	f.add("Created", when(ts.GetCreateTime()))
	f.add("Updated", when(ts.GetUpdateTime()))
	if err := f.flush(); err != nil {
		return err
	}
	if g := ts.GetGuidance(); g != "" {
		fmt.Fprintf(w, "\nGuidance:\n%s\n", g)
	}
	return nil
}

// readToolsetFile reads the one toolset definition in path ("-": stdin).
func readToolsetFile(path string, stdin io.Reader) (*toolsvcv1.Toolset, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(stdin)
		path = "standard input"
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, usage(fmt.Errorf("read toolset definition: %w", err))
	}
	ts, problems := parseToolsetDoc(data)
	if len(problems) > 0 {
		return nil, usage(fmt.Errorf("%s: %d problem(s):\n  %s", path, len(problems), strings.Join(problems, "\n  ")))
	}
	return ts, nil
}

func parseToolsetDoc(data []byte) (*toolsvcv1.Toolset, []string) {
	doc, err := decodeDocument(data)
	if err != nil {
		return nil, []string{err.Error()}
	}
	top, ok := doc.(map[string]any)
	if !ok {
		return nil, []string{fmt.Sprintf("want a mapping (a toolset, {\"toolset\": ...} or a tools file), not %s", docKind(doc))}
	}
	m, path := top, "toolset"
	switch {
	case top["toolsets"] != nil:
		items, ok := top["toolsets"].([]any)
		if len(top) > 1 || !ok || len(items) != 1 {
			return nil, []string{"toolsets: want a file with only a list of exactly one toolset (serve --tools-file loads many)"}
		}
		if m, ok = items[0].(map[string]any); !ok {
			return nil, []string{fmt.Sprintf("toolsets[0]: want a mapping, not %s", docKind(items[0]))}
		}
		path = "toolsets[0]"
	case top["toolset"] != nil:
		if m, ok = top["toolset"].(map[string]any); !ok || len(top) > 1 {
			return nil, []string{"a request body holds only a \"toolset\" mapping"}
		}
	}
	var problems []string
	normalizeMessage(m, (&toolsvcv1.Toolset{}).ProtoReflect().Descriptor(), path, &problems)
	if len(problems) > 0 {
		return nil, problems
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, []string{err.Error()}
	}
	ts := &toolsvcv1.Toolset{}
	if err := protojson.Unmarshal(raw, ts); err != nil {
		return nil, []string{strings.TrimPrefix(err.Error(), "proto: ")}
	}
	return ts, nil
}
