// Package export owns what models are shown of the registry: the name each
// (tool, action) is exported under, the strict form of an input schema that
// OpenAI's and Anthropic's strict modes both accept (and how arguments
// written against it map back to the registered schema), and the exported
// tool definitions in each provider's format, for one principal, with the
// guidance of their toolsets. Exports are byte-stable: identical state gives
// identical bytes, whatever the replica and whenever it is asked.
//
// The gRPC ExportTools handler, the CLI's `tools export` and the MCP front
// door all build their answers here, so that they share one mapping of
// names. A server builds exports with one Exporter:
//
//	exports := export.NewExporter() // one per process: it caches per tool version
//	out, err := exports.Build(reg.Snapshot(), principal, export.Options{Format: export.FormatMCP})
//	// out.Entries[i].Definition is a tools/list entry (_meta MetaTool, MetaAction),
//	// out.Guidance the principal's toolset guidance (an MCP server's instructions).
//
// and resolves a name a model calls with registry.ResolveExported (or
// passes it to ExecuteTool as the tool, with no action). The rules are
// documented in docs/exports.md.
package export
