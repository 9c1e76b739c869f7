package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

// Page size limits of the list RPCs (see the .proto files).
const (
	maxPage      = 500
	maxAuditPage = 1000
)

func newToolsCommand(lookupEnv env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tools",
		Short: "List, show, register, deregister, sync and export tools",
		Args:  noArgs,
		RunE:  showHelp,
	}
	cf := addClientFlags(cmd)
	registry := func(c *client) toolsvcv1.RegistryServiceClient { return toolsvcv1.NewRegistryServiceClient(c.conn) }

	list := &cobra.Command{
		Use:   "list",
		Short: "List the registered tools, by name",
		Args:  noArgs,
	}
	limit := addLimitFlag(list)
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkLimit(*limit); err != nil {
			return err
		}
		return cf.withClient(cmd, lookupEnv, func(c *client) error {
			tools, err := collect(c, *limit, maxPage, func(ctx context.Context, size int32, token string) ([]*toolsvcv1.Tool, string, error) {
				resp, err := registry(c).ListTools(ctx, &toolsvcv1.ListToolsRequest{PageSize: size, PageToken: token})
				return resp.GetTools(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(&toolsvcv1.ListToolsResponse{Tools: tools})
			}
			return printToolTable(c.stdout, tools)
		})
	}

	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show one tool: its settings, policies and actions with their arguments",
		Args:  exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.GetToolResponse, error) {
					return registry(c).GetTool(ctx, &toolsvcv1.GetToolRequest{Name: args[0]})
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(resp)
				}
				return printTool(c.stdout, resp.GetTool())
			})
		},
	}

	var validateOnly bool
	var expected int64
	register := &cobra.Command{
		Use:   "register FILE",
		Short: "Create or replace a tool from a YAML or JSON file (operators)",
		Long: `Create a tool or replace its definition from FILE ("-": standard input), which
holds one tool in any of these shapes:

  - the Tool message as YAML or JSON, with the .proto's field names
    (snake_case or lowerCamelCase);
  - a RegisterToolRequest body, {"tool": {...}}, as in the grpcurl examples;
  - the tools file format (--tools-file of toolsvc serve) with exactly one
    entry under "tools:".

Enums may be short (default_risk: HIGH, provider_type: mcp) and durations Go
durations (timeout: 90s, approval_ttl: 2h). The server validates every field:
a bad definition is refused with one line per problem and nothing is written.`,
		Example: `  toolsvc tools register weather.yaml
  toolsvc tools register weather.yaml --validate-only
  toolsvc tools register weather.yaml --expected-version 3`,
		Args: exactArgs("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if expected < 0 {
				return usage(fmt.Errorf("--expected-version must be positive (or 0: any), not %d", expected))
			}
			tool, err := readToolFile(args[0], cmd.InOrStdin())
			if err != nil {
				return err
			}
			req := &toolsvcv1.RegisterToolRequest{Tool: tool, ExpectedVersion: expected, ValidateOnly: validateOnly}
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.RegisterToolResponse, error) {
					return registry(c).RegisterTool(ctx, req)
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(resp)
				}
				t := resp.GetTool()
				switch {
				case validateOnly:
					fmt.Fprintf(c.stdout, "Tool %s is valid; nothing was written.\n", t.GetName())
				case resp.GetCreated():
					fmt.Fprintf(c.stdout, "Created tool %s, version %d.\n", t.GetName(), t.GetVersion())
				default:
					fmt.Fprintf(c.stdout, "Registered tool %s, version %d (an unchanged definition keeps its version).\n", t.GetName(), t.GetVersion())
				}
				return nil
			})
		},
	}
	register.Flags().BoolVar(&validateOnly, "validate-only", false, "check the definition; write nothing")
	register.Flags().Int64Var(&expected, "expected-version", 0, "succeed only if the stored tool has this version (0: create or replace)")

	var deregExpected int64
	deregister := &cobra.Command{
		Use:   "deregister NAME",
		Short: "Remove a tool (operators)",
		Args:  exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if deregExpected < 0 {
				return usage(fmt.Errorf("--expected-version must be positive (or 0: any), not %d", deregExpected))
			}
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.DeregisterToolResponse, error) {
					return registry(c).DeregisterTool(ctx, &toolsvcv1.DeregisterToolRequest{Name: args[0], ExpectedVersion: deregExpected})
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(resp)
				}
				fmt.Fprintf(c.stdout, "Deregistered tool %s (it was at version %d).\n", resp.GetTool().GetName(), resp.GetTool().GetVersion())
				return nil
			})
		},
	}
	deregister.Flags().Int64Var(&deregExpected, "expected-version", 0, "succeed only if the stored tool has this version (0: any)")

	sync := &cobra.Command{
		Use:   "sync NAME",
		Short: "Discover a connector's tools again (operators)",
		Long: `Ask a connector's server again what it offers (an MCP server's tools/list)
and store what changed: a changed schema, annotation or description makes a
new version of the tool, so approvals given for the old one are not used.`,
		Args: exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.SyncToolResponse, error) {
					return registry(c).SyncTool(ctx, &toolsvcv1.SyncToolRequest{Name: args[0]})
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(resp)
				}
				t := resp.GetTool()
				if resp.GetChanged() {
					fmt.Fprintf(c.stdout, "Tool %s changed: now version %d with %d action(s).\n", t.GetName(), t.GetVersion(), len(t.GetActions()))
				} else {
					fmt.Fprintf(c.stdout, "Tool %s is unchanged (version %d, %d action(s)).\n", t.GetName(), t.GetVersion(), len(t.GetActions()))
				}
				return nil
			})
		},
	}

	cmd.AddCommand(list, get, register, deregister, sync, newExportCommand(cf, lookupEnv))
	return cmd
}

func printToolTable(w io.Writer, tools []*toolsvcv1.Tool) error {
	tw := newTable(w, "NAME!", "VERSION", "SOURCE", "RISK", "PREVIEW", "SCOPES", "ACTIONS")
	for _, t := range tools {
		var actions []string
		for _, a := range t.GetActions() {
			actions = append(actions, a.GetName())
		}
		preview := "no"
		if t.GetSupportsPreview() {
			preview = "yes"
		}
		tw.row(t.GetName(), fmt.Sprint(t.GetVersion()), strings.ToLower(enumName(t.GetSource())),
			orDash(enumName(t.GetDefaultRisk())), preview, orDash(strings.Join(t.GetRequiredScopes(), ",")), strings.Join(actions, ","))
	}
	return tw.flush()
}

func printTool(w io.Writer, t *toolsvcv1.Tool) error {
	f := newFields(w)
	f.add("Name", t.GetName())
	f.add("Description", t.GetDescription())
	f.add("Version", fmt.Sprint(t.GetVersion()))
	f.add("Source", strings.ToLower(enumName(t.GetSource())))
	f.add("Provider", strings.TrimSpace(strings.ToLower(enumName(t.GetProviderType()))+" "+t.GetConnectorId()))
	f.add("Default risk", enumName(t.GetDefaultRisk()))
	f.add("Scopes", strings.Join(t.GetRequiredScopes(), ", "))
	f.add("Capabilities", strings.Join(t.GetCapabilities(), ", "))
	f.add("Preview", map[bool]string{true: "yes", false: "no"}[t.GetSupportsPreview()])
	if t.GetTimeout() != nil {
		f.add("Timeout", t.GetTimeout().AsDuration().String())
	}
	if t.GetApprovalTtl() != nil {
		f.add("Approval TTL", t.GetApprovalTtl().AsDuration().String())
	}
	f.add("Config ref", t.GetConfigRef())
	f.add("Audit payloads", map[bool]string{true: "yes", false: "no"}[t.GetAuditPayloads()])
	f.add("Guidance", t.GetGuidance())
	for _, p := range t.GetPolicies() {
		f.add("Policy", policyText(p))
	}
	if c := t.GetConnector(); c != nil {
		f.add("Connector", connectorText(c))
	}
	f.add("Created", when(t.GetCreateTime()))
	f.add("Updated", when(t.GetUpdateTime()))
	if err := f.flush(); err != nil {
		return err
	}
	server := map[string]string{}
	for _, d := range t.GetConnector().GetDiscovered() {
		server[d.GetAction()] = d.GetServerTool()
	}
	fmt.Fprintf(w, "\nActions:\n")
	for _, a := range t.GetActions() {
		risk := enumName(a.GetRisk())
		if risk == "" {
			risk = enumName(t.GetDefaultRisk()) + " (default)"
		}
		fmt.Fprintf(w, "  %s  risk %s  exported as %s\n", a.GetName(), risk, a.GetExportedName())
		if st, ok := server[a.GetName()]; ok && st != a.GetName() {
			fmt.Fprintf(w, "    server tool: %s\n", st)
		}
		fmt.Fprintf(w, "    %s\n", strings.Join(wrap(a.GetDescription(), termWidth-4), "\n    "))
		fmt.Fprintf(w, "    %s\n", strings.Join(wrap("arguments: "+schemaSummary(a.GetInputSchema(), a.GetInputSchemaJson()), termWidth-4), "\n      "))
		// What a model reads about each argument, whole.
		for _, d := range argumentDescriptions(a.GetInputSchema(), a.GetInputSchemaJson()) {
			fmt.Fprintf(w, "      %s\n", strings.Join(wrap(d, termWidth-6), "\n        "))
		}
		if r := a.GetResourceArgument(); r != "" {
			fmt.Fprintf(w, "    resource: %s\n", r)
		}
		if g := a.GetGuidance(); g != "" {
			fmt.Fprintf(w, "    guidance: %s\n", strings.Join(wrap(g, termWidth-14), "\n              "))
		}
	}
	for _, d := range t.GetConnector().GetDiscovered() {
		if d.GetProblem() != "" {
			fmt.Fprintf(w, "  (not offered: server tool %s: %s)\n", d.GetServerTool(), d.GetProblem())
		}
	}
	return nil
}

// connectorText summarizes a connector definition: what it reaches, how,
// and which secrets it uses (by key; toolsvc never holds their values).
func connectorText(c *toolsvcv1.Connector) string {
	var parts []string
	if len(c.GetCommand()) == 0 && c.GetUrl() == "" && c.GetBaseUrl() == "" {
		// Not an operator: how the connector is reached is not shown.
		switch c.GetType() {
		case toolsvcv1.ConnectorType_CONNECTOR_TYPE_MCP:
			return "mcp (how it is reached is shown to operators)"
		case toolsvcv1.ConnectorType_CONNECTOR_TYPE_HTTP:
			return "http (how it is reached is shown to operators)"
		}
	}
	switch c.GetType() {
	case toolsvcv1.ConnectorType_CONNECTOR_TYPE_MCP:
		switch {
		case len(c.GetCommand()) > 0:
			parts = append(parts, "mcp over stdio: "+strings.Join(c.GetCommand(), " "))
		default:
			parts = append(parts, "mcp over http: "+c.GetUrl())
		}
	case toolsvcv1.ConnectorType_CONNECTOR_TYPE_HTTP:
		parts = append(parts, "http: "+c.GetBaseUrl())
	}
	var keys []string
	for _, m := range []map[string]*toolsvcv1.ConfigValue{c.GetEnv(), c.GetHeaders()} {
		for _, v := range m {
			if v.GetSecret() != "" {
				keys = append(keys, v.GetSecret())
			}
		}
	}
	if a := c.GetAuth(); a != nil {
		for _, r := range []*toolsvcv1.SecretRef{a.GetBearer(), a.GetBasic().GetPassword(), a.GetHeader().GetValue(), a.GetQuery().GetValue()} {
			if r.GetSecret() != "" {
				keys = append(keys, r.GetSecret())
			}
		}
	}
	if len(keys) > 0 {
		slices.Sort(keys)
		parts = append(parts, "secrets "+strings.Join(slices.Compact(keys), ", "))
	}
	return strings.Join(parts, "; ")
}

func policyText(p *toolsvcv1.Policy) string {
	switch {
	case p.GetSequentialDependency() != nil:
		sd := p.GetSequentialDependency()
		return fmt.Sprintf("%s requires %s earlier in the task", sd.GetAction(), strings.Join(sd.GetRequires(), ", "))
	case p.GetReadBeforeWrite() != nil:
		rw := p.GetReadBeforeWrite()
		s := fmt.Sprintf("read before write: %s must follow %s of the same resource", strings.Join(rw.GetWriteActions(), ", "), strings.Join(rw.GetReadActions(), ", "))
		if len(rw.GetCreateActions()) > 0 {
			s += fmt.Sprintf(" (%s may create it)", strings.Join(rw.GetCreateActions(), ", "))
		}
		return s
	}
	return "unknown policy"
}

// schemaSummary lists an input schema's properties for a person, in the
// order they were registered (from the schema's text; by name if there is
// none): "message (string, required), uppercase (boolean)".
func schemaSummary(s *structpb.Struct, text string) string {
	if s == nil {
		return "none"
	}
	props := s.GetFields()["properties"].GetStructValue().GetFields()
	if len(props) == 0 {
		return "none"
	}
	required := map[string]bool{}
	for _, r := range s.GetFields()["required"].GetListValue().GetValues() {
		required[r.GetStringValue()] = true
	}
	names := propertyOrder(text)
	if len(names) != len(props) {
		names = slices.Sorted(maps.Keys(props))
	}
	var out []string
	for _, n := range names {
		var attrs []string
		if typ := props[n].GetStructValue().GetFields()["type"]; typ != nil {
			switch k := typ.GetKind().(type) {
			case *structpb.Value_StringValue:
				attrs = append(attrs, k.StringValue)
			case *structpb.Value_ListValue:
				var ts []string
				for _, v := range k.ListValue.GetValues() {
					ts = append(ts, v.GetStringValue())
				}
				attrs = append(attrs, strings.Join(ts, "|"))
			}
		}
		if required[n] {
			attrs = append(attrs, "required")
		}
		if enum := enumValues(props[n].GetStructValue()); enum != "" {
			attrs = append(attrs, "one of "+enum)
		}
		if len(attrs) > 0 {
			n += " (" + strings.Join(attrs, ", ") + ")"
		}
		out = append(out, n)
	}
	return strings.Join(out, ", ")
}

// propertyOrder returns the keys of the root "properties" object of a
// schema's JSON text in the order written; nil if it cannot tell.
func propertyOrder(text string) []string {
	dec := json.NewDecoder(strings.NewReader(text))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var skip json.RawMessage
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil
		}
		if key != "properties" {
			if dec.Decode(&skip) != nil {
				return nil
			}
			continue
		}
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			return nil
		}
		var names []string
		for dec.More() {
			name, err := dec.Token()
			if err != nil || dec.Decode(&skip) != nil {
				return nil
			}
			names = append(names, fmt.Sprint(name))
		}
		return names
	}
	return nil
}

// argumentDescriptions are "name: description" for the arguments of a
// schema that have a description, in schemaSummary's order.
func argumentDescriptions(s *structpb.Struct, text string) []string {
	props := s.GetFields()["properties"].GetStructValue().GetFields()
	names := propertyOrder(text)
	if len(names) != len(props) {
		names = slices.Sorted(maps.Keys(props))
	}
	var out []string
	for _, n := range names {
		if d := strings.TrimSpace(props[n].GetStructValue().GetFields()["description"].GetStringValue()); d != "" {
			out = append(out, n+": "+d)
		}
	}
	return out
}

// enumValues lists the values an argument's "enum" allows (JSON text, so
// that "1" and 1 differ), "|"-separated; "" without an enum.
func enumValues(prop *structpb.Struct) string {
	var vals []string
	for _, v := range prop.GetFields()["enum"].GetListValue().GetValues() {
		b, err := json.Marshal(v.AsInterface())
		if err != nil {
			continue
		}
		vals = append(vals, string(b))
	}
	return strings.Join(vals, "|")
}
