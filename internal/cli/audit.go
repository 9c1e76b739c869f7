package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

func newAuditCommand(lookupEnv env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Read the audit trail (operators)",
		Args:  noArgs,
		RunE:  showHelp,
	}
	cf := addClientFlags(cmd)

	var since string
	req := &toolsvcv1.ListAuditEventsRequest{}
	list := &cobra.Command{
		Use:   "list",
		Short: "List audit events, oldest first",
		Long: `List audit events in the order they were written, oldest first. Filters
combine with AND; --by filters on the principal that caused an event
(--principal says who is asking, as on every client command). --since takes a duration back from now (1h, 30m) or a time
(RFC 3339, e.g. 2026-05-01T14:00:00Z). Without --limit every matching event is
listed, following page tokens.`,
		Example: `  toolsvc audit list --call 01K2...
  toolsvc audit list --tool notes --type approval.resolved --type gate.required --since 1h
  toolsvc audit list --by agent-1 --limit 20 -o json`,
		Args: noArgs,
	}
	limit := addLimitFlag(list)
	fs := list.Flags()
	fs.StringVar(&req.CallId, "call", "", "only events of this call")
	fs.StringVar(&req.TraceId, "trace", "", "only events of this trace")
	fs.StringVar(&req.TaskId, "task", "", "only events of this task")
	// Not --principal: that flag says who is asking, on every client command.
	fs.StringVar(&req.Principal, "by", "", "only events caused by this principal")
	fs.StringVar(&req.Tool, "tool", "", "only events of this tool")
	fs.StringSliceVar(&req.Types, "type", nil, "only events of these types, e.g. tool_call.succeeded (repeatable)")
	var wide bool
	fs.BoolVarP(&wide, "wide", "w", false, "every column (risk, gate, call id) and whole details, however wide")
	fs.StringVar(&since, "since", "", "only events at or after this time: a duration back from now (1h) or RFC 3339")
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkLimit(*limit); err != nil {
			return err
		}
		if since != "" {
			t, err := parseSince(since, time.Now())
			if err != nil {
				return err
			}
			req.StartTime = timestamppb.New(t)
		}
		return cf.withClient(cmd, lookupEnv, func(c *client) error {
			events, err := collect(c, *limit, maxAuditPage, func(ctx context.Context, size int32, token string) ([]*toolsvcv1.AuditEvent, string, error) {
				r := &toolsvcv1.ListAuditEventsRequest{
					PageSize: size, PageToken: token, Types: req.Types, CallId: req.CallId, TraceId: req.TraceId,
					TaskId: req.TaskId, Principal: req.Principal, Tool: req.Tool, StartTime: req.StartTime,
				}
				resp, err := toolsvcv1.NewAuditServiceClient(c.conn).ListAuditEvents(ctx, r)
				return resp.GetEvents(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(&toolsvcv1.ListAuditEventsResponse{Events: events})
			}
			if wide {
				tw := newTable(c.stdout, "SEQ!", "TIME!", "TYPE!", "PRINCIPAL!", "TOOL!", "RISK!", "GATE!", "OUTCOME!", "CALL!", "DETAIL!")
				for _, e := range events {
					tw.row(fmt.Sprint(e.GetSequence()), short(e.GetTime()), e.GetType(), orDash(e.GetPrincipal()),
						orDash(toolAction(e)), orDash(enumName(e.GetRisk())), orDash(enumName(e.GetGateDecision())),
						orDash(enumName(e.GetOutcome())), orDash(e.GetCallId()), orDash(compactJSON(e.GetDetail())))
				}
				return tw.flush()
			}
			// To fit a terminal the table leaves out risk, gate and call id
			// (--wide and -o json have them) and cuts the detail.
			tw := newTable(c.stdout, "SEQ!", "TIME!", "TYPE!", "PRINCIPAL", "TOOL", "OUTCOME", "DETAIL")
			for _, e := range events {
				tw.row(fmt.Sprint(e.GetSequence()), shortDay(e.GetTime()), e.GetType(), orDash(e.GetPrincipal()), orDash(toolAction(e)),
					orDash(enumName(e.GetOutcome())), orDash(oneLine(compactJSON(e.GetDetail()), 200)))
			}
			return tw.flush()
		})
	}
	cmd.AddCommand(list)
	return cmd
}

// parseSince reads --since: a positive duration back from now, or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, usage(fmt.Errorf("--since %q: a duration must be positive (how far back)", s))
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, usage(fmt.Errorf("--since %q: want a duration back from now (1h, 30m) or an RFC 3339 time (2026-05-01T14:00:00Z)", s))
}

// toolAction is "tool.action", or the tool alone.
func toolAction(e *toolsvcv1.AuditEvent) string {
	if e.GetAction() == "" {
		return e.GetTool()
	}
	return e.GetTool() + "." + e.GetAction()
}
