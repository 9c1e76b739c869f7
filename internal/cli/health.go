package cli

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

func newHealthCommand(lookupEnv env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Show, watch, drain and restore tool health",
		Args:  noArgs,
		RunE:  showHelp,
	}
	cf := addClientFlags(cmd)
	healthClient := func(c *client) toolsvcv1.ToolHealthServiceClient { return toolsvcv1.NewToolHealthServiceClient(c.conn) }

	var statusFlag string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the health of every tool, by name",
		Args:  noArgs,
	}
	limit := addLimitFlag(list)
	list.Flags().StringVar(&statusFlag, "status", "", "only tools in this status: healthy, degraded or unavailable")
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkLimit(*limit); err != nil {
			return err
		}
		var st toolsvcv1.HealthStatus
		if statusFlag != "" {
			n, err := parseEnum("status", statusFlag, st.Descriptor())
			if err != nil {
				return err
			}
			st = toolsvcv1.HealthStatus(n)
		}
		return cf.withClient(cmd, lookupEnv, func(c *client) error {
			hs, err := collect(c, *limit, maxPage, func(ctx context.Context, size int32, token string) ([]*toolsvcv1.ToolHealth, string, error) {
				resp, err := healthClient(c).ListToolHealth(ctx, &toolsvcv1.ListToolHealthRequest{PageSize: size, PageToken: token, Status: st})
				return resp.GetHealth(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(&toolsvcv1.ListToolHealthResponse{Health: hs})
			}
			tw := newTable(c.stdout, "TOOL!", "STATUS", "ERRORS", "LAST SUCCESS", "LAST ERROR", "NOTE")
			for _, h := range hs {
				tw.row(h.GetTool(), enumName(h.GetStatus()), fmt.Sprint(h.GetConsecutiveErrors()),
					orDash(when(h.GetLastSuccessTime())), orDash(oneLine(h.GetLastError(), 60)), orDash(healthNote(h)))
			}
			return tw.flush()
		})
	}

	get := &cobra.Command{
		Use:   "get TOOL",
		Short: "Show one tool's health",
		Args:  exactArgs("TOOL"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.GetToolHealthResponse, error) {
					return healthClient(c).GetToolHealth(ctx, &toolsvcv1.GetToolHealthRequest{Tool: args[0]})
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(resp)
				}
				return printHealth(c.stdout, resp.GetHealth())
			})
		},
	}

	set := func(use, short string, op toolsvcv1.HealthOperation, reasonRequired bool) *cobra.Command {
		var reason string
		sc := &cobra.Command{
			Use:   use,
			Short: short,
			Args:  exactArgs("TOOL"),
			RunE: func(cmd *cobra.Command, args []string) error {
				if reasonRequired {
					if err := requireFlag("reason", reason); err != nil {
						return err
					}
				}
				req := &toolsvcv1.SetToolHealthRequest{Tool: args[0], Operation: op, Reason: reason}
				return cf.withClient(cmd, lookupEnv, func(c *client) error {
					resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.SetToolHealthResponse, error) {
						return healthClient(c).SetToolHealth(ctx, req)
					})
					if err != nil {
						return err
					}
					if c.json {
						return c.printJSON(resp)
					}
					if op == toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN {
						fmt.Fprintf(c.stdout, "Drained %s: its calls are refused until it is restored.\n\n", args[0])
					} else {
						fmt.Fprintf(c.stdout, "Restored %s.\n\n", args[0])
					}
					return printHealth(c.stdout, resp.GetHealth())
				})
			},
		}
		help := "why; recorded with the override and in the audit trail"
		if reasonRequired {
			help += " (required)"
		}
		sc.Flags().StringVar(&reason, "reason", "", help)
		return sc
	}
	drain := set("drain TOOL --reason TEXT", "Refuse a tool's calls (UNAVAILABLE) until it is restored (operators)", toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN, true)
	restore := set("restore TOOL [--reason TEXT]", "Clear a drain or an open circuit: HEALTHY, error counters reset (operators)", toolsvcv1.HealthOperation_HEALTH_OPERATION_RESTORE, false)

	watch := &cobra.Command{
		Use:   "watch [TOOL...]",
		Short: "Print health changes as they happen, until Ctrl-C",
		Long: `Print the current health of the tools (all, or those named), then one line per
change, on any replica, until interrupted. --timeout does not apply;
--output json prints one JSON object per line.`,
		RunE: func(cmd *cobra.Command, tools []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cmd.SetContext(ctx)
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				stream, err := healthClient(c).WatchToolHealth(c.ctx, &toolsvcv1.WatchToolHealthRequest{Tools: tools})
				return follow(c, stream, err, func(resp *toolsvcv1.WatchToolHealthResponse) string {
					h := resp.GetHealth()
					line := fmt.Sprintf("%s  %-11s %s  errors=%d", orDash(when(h.GetUpdateTime())), enumName(h.GetStatus()), h.GetTool(), h.GetConsecutiveErrors())
					if note := healthNote(h); note != "" {
						line += "  " + note
					}
					if h.GetLastError() != "" {
						line += fmt.Sprintf("  last_error=%q", oneLine(h.GetLastError(), 120))
					}
					return line
				})
			})
		},
	}

	cmd.AddCommand(list, get, drain, restore, watch)
	return cmd
}

// healthNote says why a tool is not simply healthy: a drain, a cool-down,
// a rate limit.
func healthNote(h *toolsvcv1.ToolHealth) string {
	var notes []string
	if h.GetDrained() {
		n := "drained"
		if h.GetOverrideBy() != "" {
			n += " by " + h.GetOverrideBy()
		}
		if h.GetOverrideReason() != "" {
			n += fmt.Sprintf(" (%s)", h.GetOverrideReason())
		}
		notes = append(notes, n)
	}
	if t := h.GetCooldownEndTime(); t != nil {
		notes = append(notes, "probe after "+when(t))
	}
	if t := h.GetRateLimitResetTime(); t != nil {
		notes = append(notes, "rate-limited until "+when(t))
	}
	return strings.Join(notes, "; ")
}

// oneLine shortens text to one line of at most n characters.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func printHealth(w io.Writer, h *toolsvcv1.ToolHealth) error {
	f := newFields(w)
	f.add("Tool", h.GetTool())
	f.add("Status", enumName(h.GetStatus()))
	if h.GetDrained() {
		f.add("Drained", "yes")
	}
	f.add("Override by", h.GetOverrideBy())
	f.add("Override reason", h.GetOverrideReason())
	f.add("Consecutive errors", fmt.Sprint(h.GetConsecutiveErrors()))
	f.add("Last success", when(h.GetLastSuccessTime()))
	f.add("Last error", h.GetLastError())
	f.add("Last error at", when(h.GetLastErrorTime()))
	f.add("Rate limited until", whenRel(h.GetRateLimitResetTime()))
	f.add("Cool-down ends", whenRel(h.GetCooldownEndTime()))
	f.add("Updated", when(h.GetUpdateTime()))
	return f.flush()
}
