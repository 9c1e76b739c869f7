package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

// exportFormats maps the --format names to the API's.
var exportFormats = []struct {
	name   string
	format toolsvcv1.ExportFormat
}{
	{"openai-chat", toolsvcv1.ExportFormat_EXPORT_FORMAT_OPENAI_CHAT},
	{"openai-responses", toolsvcv1.ExportFormat_EXPORT_FORMAT_OPENAI_RESPONSES},
	{"anthropic", toolsvcv1.ExportFormat_EXPORT_FORMAT_ANTHROPIC},
	{"mcp", toolsvcv1.ExportFormat_EXPORT_FORMAT_MCP},
	{"guidance", toolsvcv1.ExportFormat_EXPORT_FORMAT_GUIDANCE},
}

func exportFormatNames() string {
	names := make([]string, len(exportFormats))
	for i, f := range exportFormats {
		names[i] = f.name
	}
	return strings.Join(names, "|")
}

// newExportCommand is `toolsvc tools export`.
func newExportCommand(cf *clientFlags, lookupEnv env) *cobra.Command {
	var format, toolset string
	var strict bool
	cmd := &cobra.Command{
		Use:   "export --format " + exportFormatNames() + " [--toolset NAME] [--strict]",
		Short: "Print the tools you may call as a model provider's tool definitions",
		Long: `Print the definitions of the tools the principal may call, one per action, as
the JSON array a model provider takes in its "tools": OpenAI Chat Completions
(openai-chat), OpenAI Responses (openai-responses), Anthropic Messages
(anthropic) or MCP tools/list entries (mcp). --format guidance prints the
guidance of the toolsets (and the tools' guidance that does not fit into the
descriptions) as Markdown, the system-prompt text that goes with the tools.

The names are the exported names: a model's tool call goes to ExecuteTool with
the name as the tool and no action. --strict makes every schema valid for
OpenAI's and Anthropic's strict modes at once; an action whose schema cannot
be made strict is left out and named on standard error (the command still
exits 0). The output is byte-stable: the same registry gives the same bytes.
See docs/exports.md.`,
		Example: `  toolsvc tools export --format anthropic --strict > tools.json
  toolsvc tools export --format openai-chat --toolset notes
  toolsvc tools export --format guidance > system-prompt.md`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var f toolsvcv1.ExportFormat
			for _, x := range exportFormats {
				if x.name == strings.ToLower(strings.TrimSpace(format)) {
					f = x.format
				}
			}
			if f == toolsvcv1.ExportFormat_EXPORT_FORMAT_UNSPECIFIED {
				return usage(fmt.Errorf("--format must be one of %s, not %q", exportFormatNames(), format))
			}
			req := &toolsvcv1.ExportToolsRequest{Format: f, Toolset: toolset, Strict: strict}
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.ExportToolsResponse, error) {
					return toolsvcv1.NewRegistryServiceClient(c.conn).ExportTools(ctx, req)
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(resp)
				}
				for _, o := range resp.GetOmitted() {
					fmt.Fprintln(c.stderr, wrapped(fmt.Sprintf("toolsvc: left out %s (%s.%s): %s", o.GetName(), o.GetTool(), o.GetAction(), o.GetReason())))
				}
				for _, w := range resp.GetWarnings() {
					fmt.Fprintln(c.stderr, wrapped("toolsvc: warning: "+w))
				}
				if f == toolsvcv1.ExportFormat_EXPORT_FORMAT_GUIDANCE {
					_, err := fmt.Fprint(c.stdout, resp.GetGuidanceMarkdown())
					return err
				}
				_, err = fmt.Fprintln(c.stdout, resp.GetToolsJson())
				return err
			})
		},
	}
	cmd.Flags().StringVar(&format, "format", "", "the definitions' format: "+exportFormatNames()+" (required)")
	cmd.Flags().StringVar(&toolset, "toolset", "", "only this toolset's tools, in its order")
	cmd.Flags().BoolVar(&strict, "strict", false, "schemas valid for OpenAI's and Anthropic's strict modes")
	return cmd
}
