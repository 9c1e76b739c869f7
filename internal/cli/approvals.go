package cli

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

func newApprovalsCommand(lookupEnv env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "approvals",
		Short: "See and resolve calls waiting for approval (approvers)",
		Long: `See and resolve calls parked behind the CONFIRM gate. An approver may never
resolve a call they requested themselves; with authentication off, act as
another principal with --principal.`,
		Args: noArgs,
		RunE: showHelp,
	}
	cf := addClientFlags(cmd)
	approvals := func(c *client) toolsvcv1.ApprovalServiceClient { return toolsvcv1.NewApprovalServiceClient(c.conn) }

	var state, tool string
	var quiet, wide bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List approvals, newest first",
		Example: `  toolsvc approvals list --state pending --tool notes
  toolsvc approvals approve "$(toolsvc approvals list --state pending --limit 1 -q)" --comment ok`,
		Args: noArgs,
	}
	limit := addLimitFlag(list)
	list.Flags().StringVar(&state, "state", "", "only approvals in this state: pending, approved, denied, expired, consumed or invalidated")
	list.Flags().StringVar(&tool, "tool", "", "only approvals for this tool")
	list.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the approvals' ids, one per line (for scripts)")
	list.Flags().BoolVarP(&wide, "wide", "w", false, "every column (created, key, call id, resolver, comment) and nothing cut, however wide")
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkLimit(*limit); err != nil {
			return err
		}
		req := &toolsvcv1.ListApprovalsRequest{Tool: tool}
		if state != "" {
			n, err := parseEnum("state", state, toolsvcv1.ApprovalState(0).Descriptor())
			if err != nil {
				return err
			}
			req.State = toolsvcv1.ApprovalState(n)
		}
		return cf.withClient(cmd, lookupEnv, func(c *client) error {
			aps, err := collect(c, *limit, maxPage, func(ctx context.Context, size int32, token string) ([]*toolsvcv1.Approval, string, error) {
				r := &toolsvcv1.ListApprovalsRequest{PageSize: size, PageToken: token, State: req.State, Tool: req.Tool}
				resp, err := approvals(c).ListApprovals(ctx, r)
				return resp.GetApprovals(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(&toolsvcv1.ListApprovalsResponse{Approvals: aps})
			}
			if quiet {
				for _, a := range aps {
					fmt.Fprintln(c.stdout, a.GetApprovalId())
				}
				return nil
			}
			// The ID is what the next command needs: it is never cut.
			// Creation time and resolver are in --wide, `approvals get` and
			// -o json.
			tw := newTable(c.stdout, "ID!", "STATE", "RISK", "EXPIRES!", "REQUESTER", "TOOL")
			if wide {
				tw = newTable(c.stdout, "ID!", "STATE!", "RISK!", "CREATED!", "EXPIRES!", "REQUESTER!", "TOOL!", "KEY!", "CALL!", "RESOLVER!", "COMMENT!")
			}
			var cut []string
			for _, a := range aps {
				if wide {
					tw.row(a.GetApprovalId(), enumName(a.GetState()), orDash(enumName(a.GetRisk())), short(a.GetCreateTime()), short(a.GetExpireTime()),
						a.GetRequester(), a.GetTool()+"."+a.GetAction(), orDash(a.GetIdempotencyKey()), orDash(a.GetCallId()),
						orDash(a.GetResolver()), orDash(a.GetComment()))
				} else {
					tw.row(a.GetApprovalId(), enumName(a.GetState()), orDash(enumName(a.GetRisk())), shortDay(a.GetExpireTime()),
						a.GetRequester(), a.GetTool()+"."+a.GetAction())
				}
				if a.GetArgumentsTruncated() {
					cut = append(cut, a.GetApprovalId())
				}
			}
			if err := tw.flush(); err != nil {
				return err
			}
			// The table shows no arguments, but -o json does: say which
			// are cut, and how to see them whole.
			if len(cut) > 0 {
				fmt.Fprintln(c.stdout, strings.Join(wrap(fmt.Sprintf("Arguments over 16 KiB are cut in listings (%d here); "+
					"`toolsvc approvals get ID --full` shows them whole.", len(cut)), termWidth), "\n"))
			}
			return nil
		})
	}

	var full bool
	get := &cobra.Command{
		Use:   "get APPROVAL_ID",
		Short: "Show one approval, with the call's arguments",
		Long: `Show one approval, with the call's arguments. Arguments larger than 16 KiB
are shown cut (and say so) unless --full asks for them whole.`,
		Args: exactArgs("APPROVAL_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.GetApprovalResponse, error) {
					return approvals(c).GetApproval(ctx, &toolsvcv1.GetApprovalRequest{ApprovalId: args[0], FullArguments: full})
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(resp)
				}
				return printApproval(c.stdout, resp.GetApproval())
			})
		},
	}

	get.Flags().BoolVar(&full, "full", false, "show the call's arguments whole, however large")

	resolve := func(use, short string, decision toolsvcv1.ApprovalDecision, commentRequired bool) *cobra.Command {
		var comment string
		rc := &cobra.Command{
			Use:   use,
			Short: short,
			Args:  exactArgs("APPROVAL_ID"),
			RunE: func(cmd *cobra.Command, args []string) error {
				if commentRequired {
					if err := requireFlag("comment", comment); err != nil {
						return err
					}
				}
				req := &toolsvcv1.ResolveApprovalRequest{ApprovalId: args[0], Decision: decision, Comment: comment}
				return cf.withClient(cmd, lookupEnv, func(c *client) error {
					resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.ResolveApprovalResponse, error) {
						return approvals(c).ResolveApproval(ctx, req)
					})
					if err != nil {
						return err
					}
					if c.json {
						return c.printJSON(resp)
					}
					a := resp.GetApproval()
					if parent := a.GetParentCallId(); parent != "" {
						// A step of another call: the caller retries that call.
						verdict := "Approved"
						if decision != toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE {
							verdict = "Denied"
						}
						fmt.Fprintln(c.stdout, strings.Join(wrap(fmt.Sprintf("%s %s: %s.%s for %s, a step of call %s. Their retry of that call goes on from here.",
							verdict, a.GetApprovalId(), a.GetTool(), a.GetAction(), a.GetRequester(), parent), termWidth), "\n"))
						return nil
					}
					if decision == toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE {
						fmt.Fprintln(c.stdout, strings.Join(wrap(fmt.Sprintf("Approved %s: %s.%s for %s. Their next call with key %s and the same arguments runs it.",
							a.GetApprovalId(), a.GetTool(), a.GetAction(), a.GetRequester(), a.GetIdempotencyKey()), termWidth), "\n"))
					} else {
						fmt.Fprintln(c.stdout, strings.Join(wrap(fmt.Sprintf("Denied %s: %s.%s for %s. Calls with key %s now answer DENIED.",
							a.GetApprovalId(), a.GetTool(), a.GetAction(), a.GetRequester(), a.GetIdempotencyKey()), termWidth), "\n"))
					}
					return nil
				})
			},
		}
		help := "why; recorded in the audit trail"
		if commentRequired {
			help = "why; shown to the agent and recorded in the audit trail (required)"
		}
		rc.Flags().StringVar(&comment, "comment", "", help)
		return rc
	}
	approve := resolve("approve APPROVAL_ID [--comment TEXT]", "Let a parked call run", toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE, false)
	deny := resolve("deny APPROVAL_ID --comment TEXT", "Refuse a parked call", toolsvcv1.ApprovalDecision_APPROVAL_DECISION_DENY, true)

	var watchTool string
	watch := &cobra.Command{
		Use:   "watch",
		Short: "Print approvals as they are created and resolved, until Ctrl-C",
		Long: `Print every pending approval, then one line per approval created or changed,
on any replica, until interrupted. --timeout does not apply; --output json
prints one JSON object per line.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cmd.SetContext(ctx)
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				stream, err := approvals(c).WatchApprovals(c.ctx, &toolsvcv1.WatchApprovalsRequest{Tool: watchTool})
				return follow(c, stream, err, func(resp *toolsvcv1.WatchApprovalsResponse) string {
					a := resp.GetApproval()
					at := a.GetResolveTime()
					if at == nil {
						at = a.GetCreateTime()
					}
					line := fmt.Sprintf("%s  %-11s %s  %s.%s  requester=%s risk=%s key=%s", when(at), enumName(a.GetState()),
						a.GetApprovalId(), a.GetTool(), a.GetAction(), a.GetRequester(), orDash(enumName(a.GetRisk())), a.GetIdempotencyKey())
					if a.GetState() == toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING {
						line += " expires=" + when(a.GetExpireTime())
					}
					if a.GetResolver() != "" {
						line += fmt.Sprintf(" by=%s", a.GetResolver())
					}
					if a.GetComment() != "" {
						line += fmt.Sprintf(" comment=%q", a.GetComment())
					}
					return line
				})
			})
		},
	}
	watch.Flags().StringVar(&watchTool, "tool", "", "only approvals for this tool")

	cmd.AddCommand(list, get, approve, deny, watch)
	return cmd
}

// watchEnded turns the end of a stream into the command's result: Ctrl-C
// (the command's context ending) is a normal end; anything else is the
// server's error.
// follow prints a watch's messages until it ends: each as one JSON object
// per line with --output json, else as the line text makes of it. stream
// and err are what opened the watch.
func follow[M proto.Message](c *client, stream interface{ Recv() (M, error) }, err error, text func(M) string) error {
	if err != nil {
		return c.watchEnded(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return c.watchEnded(err)
		}
		if c.json {
			b, err := marshalJSON(resp, false)
			if err != nil {
				return err
			}
			c.stdout.Write(b)
			continue
		}
		fmt.Fprintln(c.stdout, text(resp))
	}
}

func (c *client) watchEnded(err error) error {
	if c.ctx.Err() != nil {
		return nil
	}
	return c.rpcError(err)
}

func printApproval(w io.Writer, a *toolsvcv1.Approval) error {
	f := newFields(w)
	f.add("Approval", a.GetApprovalId())
	f.add("State", enumName(a.GetState()))
	f.add("Tool", fmt.Sprintf("%s.%s (version %d)", a.GetTool(), a.GetAction(), a.GetToolVersion()))
	f.add("Requester", a.GetRequester())
	f.add("Risk", enumName(a.GetRisk()))
	f.add("Call", a.GetCallId())
	f.add("Key", a.GetIdempotencyKey())
	f.add("Task", a.GetTaskId())
	f.add("Trace", a.GetTraceId())
	f.add("Arguments", structJSON(a.GetArguments()))
	if a.GetArgumentsTruncated() {
		f.add("Cut", fmt.Sprintf("the arguments above are cut: they are %s in all; --full shows them whole", byteSize(a.GetArgumentsBytes())))
	}
	f.add("Created", when(a.GetCreateTime()))
	if a.GetState() == toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING {
		f.add("Expires", whenRel(a.GetExpireTime()))
	} else {
		f.add("Expires", when(a.GetExpireTime()))
	}
	f.add("Resolver", a.GetResolver())
	f.add("Comment", a.GetComment())
	f.add("Resolved", when(a.GetResolveTime()))
	return f.flush()
}

// byteSize says n bytes for people: 512 bytes, 18.0 KiB, 4.0 MiB.
func byteSize(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
}
