package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/idempotency"
)

// callInput is what `toolsvc call` was asked to do, kept to print the exact
// command that continues a parked call.
type callInput struct {
	tool, action string
	args         *structpb.Struct
	argsFile     string // --args-file PATH as given (not "-"), reused in the follow-up command
	key          string
	task, trace  string
	step         string
	autonomy     string
	scopes       []string
	previewToken string
	approvalID   string
	// wait: on APPROVAL_REQUIRED, wait for the approval and call again.
	wait        bool
	waitTimeout time.Duration
}

func newCallCommand(lookupEnv env) *cobra.Command {
	var in callInput
	var argsJSON string
	cmd := &cobra.Command{
		Use:   "call TOOL ACTION [-] | call NAME [-]",
		Short: "Execute one tool call, as an agent would",
		Long: `Execute one action of a tool through the whole pipeline (scopes, idempotency,
validation, policies, risk, gate) and print the outcome. The action is named
by the tool and the action (notes write), or by its exported name alone
(notes__write), as a model calls it: see toolsvc tools export.

Arguments are a JSON object: --args '{"message": "hi"}', --args-file PATH, or
"-" (or --args-file -) to read them from standard input. None means {}.

--wait: when the call needs a person's approval, wait for it (without
polling: the server says when it is resolved), then call again with the same
key and arguments and print that outcome: the call's result once approved,
DENIED when denied. Waiting ends when the approval expires or after
--wait-timeout.

Exit status: 0 SUCCEEDED; 1 FAILED or DENIED (or an approval that expired
while --wait waited); 2 bad usage; 3 APPROVAL_REQUIRED or PREVIEW_REQUIRED
(the call waits on a person; the output says what to run next); 4 an error
from the server; 5 UNKNOWN (the tool may have acted: check before calling
again with another key).`,
		Example: `  toolsvc call echo echo --args '{"message": "hello"}'
  toolsvc call notes write --idempotency-key todo-1 --args-file note.json
  toolsvc call notes__write --idempotency-key todo-1 --wait --args '{"path": "/a.md", "content": "hi"}'
  echo '{"path": "/todo.md"}' | toolsvc call notes read --task t1 -`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 3 && args[2] == "-":
				return exactArgs("TOOL", "ACTION")(cmd, args[:2])
			case len(args) == 3:
				return usage(fmt.Errorf("%s: the third argument may only be \"-\" (read arguments from standard input), not %q", cmd.CommandPath(), args[2]))
			case len(args) == 1 || (len(args) == 2 && args[1] == "-"):
				return nil // an exported name
			}
			return exactArgs("TOOL", "ACTION")(cmd, args)
		},
	}
	cf := addClientFlags(cmd)
	fs := cmd.Flags()
	fs.StringVar(&argsJSON, "args", "", "arguments as a JSON object")
	fs.StringVar(&in.argsFile, "args-file", "", `file holding the arguments as a JSON object ("-": standard input)`)
	idempotencyKeyFlag(cmd, &in.key, "idempotency key (default: the server generates one and prints it)")
	fs.StringVar(&in.task, "task", "", "task id (policies judge calls against the task's history)")
	fs.StringVar(&in.trace, "trace", "", "trace id")
	fs.StringVar(&in.step, "step", "", "step id within the task")
	fs.StringVar(&in.autonomy, "autonomy", "", "autonomy to ask for: read-only, assisted, supervised or autonomous (default: the principal's)")
	fs.StringSliceVar(&in.scopes, "scope", nil, "narrow the principal's scopes to these (repeatable)")
	fs.StringVar(&in.previewToken, "preview-token", "", "token from a PREVIEW_REQUIRED answer: execute the previewed call")
	fs.StringVar(&in.approvalID, "approval", "", "the approval the call was parked behind (optional: the server finds it by key)")
	fs.BoolVar(&in.wait, "wait", false, "if the call needs an approval, wait for it and call again")
	fs.DurationVar(&in.waitTimeout, "wait-timeout", 0, "with --wait, give up waiting after this long (default: when the approval expires)")

	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		in.tool = args[0]
		stdinArgs := len(args) == 3 || (len(args) == 2 && args[1] == "-")
		if len(args) >= 2 && args[1] != "-" {
			in.action = args[1]
		}
		if in.waitTimeout < 0 {
			return usage(fmt.Errorf("--wait-timeout must not be negative, not %s", in.waitTimeout))
		}
		req, err := in.request(cmd, argsJSON, stdinArgs)
		if err != nil {
			return err
		}
		return cf.withClient(cmd, lookupEnv, func(c *client) error {
			resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.ExecuteToolResponse, error) {
				return toolsvcv1.NewToolExecutionServiceClient(c.conn).ExecuteTool(ctx, req)
			})
			if err != nil {
				return err
			}
			if in.wait && resp.GetOutcome() == toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED {
				return in.waitAndCall(c, req, resp)
			}
			if c.json {
				if err := c.printJSON(resp); err != nil {
					return err
				}
			} else if err := printCallResponse(c, &in, resp); err != nil {
				return err
			}
			return outcomeExit(resp.GetOutcome())
		})
	}
	return cmd
}

// request builds the ExecuteTool request, refusing bad input as usage errors.
func (in *callInput) request(cmd *cobra.Command, argsJSON string, stdinArgs bool) (*toolsvcv1.ExecuteToolRequest, error) {
	given := 0
	for _, b := range []bool{cmd.Flags().Changed("args"), in.argsFile != "", stdinArgs} {
		if b {
			given++
		}
	}
	if given > 1 {
		return nil, usage(errors.New("give the arguments once: --args, --args-file or -"))
	}
	var raw []byte
	var from string
	switch {
	case cmd.Flags().Changed("args"):
		raw, from = []byte(argsJSON), "--args"
	case in.argsFile == "-" || stdinArgs:
		b, err := io.ReadAll(cmd.InOrStdin())
		if err != nil {
			return nil, fmt.Errorf("read arguments from standard input: %w", err)
		}
		raw, from = b, "standard input"
		in.argsFile = ""
	case in.argsFile != "":
		b, err := os.ReadFile(in.argsFile)
		if err != nil {
			return nil, usage(fmt.Errorf("--args-file: %w", err))
		}
		raw, from = b, in.argsFile
	}
	in.args = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	if raw != nil {
		s, err := parseArgs(raw)
		if err != nil {
			return nil, usage(fmt.Errorf("arguments from %s: %w", from, err))
		}
		in.args = s
	}
	var autonomy toolsvcv1.AutonomyLevel
	if in.autonomy != "" {
		n, err := parseEnum("autonomy", in.autonomy, toolsvcv1.AutonomyLevel(0).Descriptor())
		if err != nil {
			return nil, err
		}
		autonomy = toolsvcv1.AutonomyLevel(n)
		in.autonomy = strings.ToLower(strings.ReplaceAll(enumName(autonomy), "_", "-"))
	}
	return &toolsvcv1.ExecuteToolRequest{
		Tool:      in.tool,
		Action:    in.action,
		Arguments: in.args,
		Context: &toolsvcv1.CallContext{
			TraceId:        in.trace,
			TaskId:         in.task,
			StepId:         in.step,
			IdempotencyKey: in.key,
			AutonomyLevel:  autonomy,
			Scopes:         in.scopes,
			ApprovalId:     in.approvalID,
			PreviewToken:   in.previewToken,
		},
	}, nil
}

// parseArgs reads a JSON object by the server's rule (idempotency.Parse):
// invalid UTF-8, lone surrogates and duplicate keys are refused here, not
// quietly replaced or dropped on the way to a server that would refuse them.
func parseArgs(raw []byte) (*structpb.Struct, error) {
	if _, _, err := idempotency.Parse(raw); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("must be a JSON object like {\"name\": \"value\"}, not %s", jsonKind(v))
	}
	return structpb.NewStruct(m)
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "an array"
	case string:
		return "a string"
	case float64, json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}

// outcomeExit maps an outcome to the command's exit status.
func outcomeExit(o toolsvcv1.Outcome) error {
	switch o {
	case toolsvcv1.Outcome_OUTCOME_SUCCEEDED:
		return nil
	case toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED, toolsvcv1.Outcome_OUTCOME_PREVIEW_REQUIRED:
		return &exitError{code: exitWaiting}
	case toolsvcv1.Outcome_OUTCOME_UNKNOWN:
		return &exitError{code: exitUnknown}
	}
	return &exitError{code: exitFailure}
}

// printCallResponse prints an ExecuteTool answer for a person, with the
// commands that continue a parked call.
func printCallResponse(c *client, in *callInput, resp *toolsvcv1.ExecuteToolResponse) error {
	w := c.stdout
	f := newFields(w)
	outcome := enumName(resp.GetOutcome())
	if resp.GetDeduped() {
		outcome += " (replayed: an earlier call with this key)"
	}
	f.add("Outcome", orDash(outcome))
	f.add("Call", resp.GetCallId())
	f.add("Key", resp.GetIdempotencyKey())
	f.add("Risk", enumName(resp.GetRisk()))
	f.add("Gate", enumName(resp.GetGateDecision()))
	if resp.GetAttempt() > 1 {
		f.add("Attempt", fmt.Sprint(resp.GetAttempt()))
	}
	// A preview's result repeats the preview for the model; people read the
	// preview itself.
	if r := resp.GetResult(); r != nil && resp.GetPreview() == nil {
		msg := r.GetMessage()
		if msg == "" {
			msg = r.GetModelText()
		}
		f.add("Message", msg)
		if v := valueJSON(r.GetValue()); v != "" {
			label := "Value"
			if r.GetExcludeValueFromContext() {
				label = "Value (kept out of the model's context)"
			}
			f.add(label, v)
		}
	}
	if p := resp.GetPreview(); p != nil {
		f.add("Preview", p.GetMessage())
		f.add("Preview value", valueJSON(p.GetValue()))
		f.add("Preview token", p.GetToken())
		f.add("Token expires", whenRel(p.GetExpireTime()))
	}
	if a := resp.GetApproval(); a != nil {
		f.add("Approval", fmt.Sprintf("%s (%s)", a.GetApprovalId(), enumName(a.GetState())))
		f.add("Expires", whenRel(a.GetExpireTime()))
	}
	if err := f.flush(); err != nil {
		return err
	}

	switch resp.GetOutcome() {
	case toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED:
		id := resp.GetApproval().GetApprovalId()
		requester := c.principal
		if requester == "" {
			requester = "dev"
		}
		approve := append([]string{"toolsvc", "approvals", "approve", shellQuote(id)}, addrFlag(c)...)
		if c.access.authenticates() {
			// Whoever approves brings their own credentials.
			approve = append(append(approve, c.access.tlsFlags()...), "--"+flagTokenFile, "APPROVER_TOKEN_FILE")
			fmt.Fprintf(w, "\nThe call waits for an approver other than you:\n%s\n", shellLines(approve))
		} else {
			fmt.Fprintf(w, "\nThe call waits for an approver other than %q:\n%s\n",
				requester, shellLines(append(approve, "--principal", "APPROVER")))
		}
		fmt.Fprintf(w, "Once approved, run it again with the same key and arguments:\n%s\n",
			shellLines(in.followUp(c, resp.GetIdempotencyKey(), "--approval", id)))
	case toolsvcv1.Outcome_OUTCOME_PREVIEW_REQUIRED:
		fmt.Fprintf(w, "\nThe call has not run. To run it as previewed:\n%s\n",
			shellLines(in.followUp(c, resp.GetIdempotencyKey(), "--preview-token", resp.GetPreview().GetToken())))
	}
	return nil
}

// addrFlag is --addr when the server is not at the default address.
func addrFlag(c *client) []string {
	if c.addr != defaultAddr {
		return []string{"--addr", shellQuote(c.addr)}
	}
	return nil
}

// followUp is the command line that repeats the call with key and one more
// flag (the approval or the preview token): the same tool, action,
// arguments and context, so that the server finds the parked call and the
// fingerprint matches.
func (in *callInput) followUp(c *client, key, flag, value string) []string {
	parts := []string{"toolsvc", "call", shellQuote(in.tool)}
	if in.action != "" {
		parts = append(parts, shellQuote(in.action))
	}
	switch {
	case in.argsFile != "":
		parts = append(parts, "--args-file", shellQuote(in.argsFile))
	case len(in.args.GetFields()) > 0:
		parts = append(parts, "--args", shellQuote(compactJSON(in.args)))
	}
	parts = append(parts, "--idempotency-key", shellQuote(key))
	for _, kv := range [][2]string{{"--task", in.task}, {"--trace", in.trace}, {"--step", in.step}, {"--autonomy", in.autonomy}} {
		if kv[1] != "" {
			parts = append(parts, kv[0], shellQuote(kv[1]))
		}
	}
	for _, s := range in.scopes {
		parts = append(parts, "--scope", shellQuote(s))
	}
	parts = append(parts, c.connectionFlags()...)
	return append(parts, flag, shellQuote(value))
}

func newCallsCommand(lookupEnv env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "calls",
		Short: "Look up calls and settle those whose outcome is UNKNOWN",
		Args:  noArgs,
		RunE:  showHelp,
	}
	cf := addClientFlags(cmd)

	var id, key string
	get := &cobra.Command{
		Use:   "get (--id ID | --idempotency-key KEY)",
		Short: "Show a call by id, or by the calling principal's idempotency key",
		Example: `  toolsvc calls get --id 01K2...
  toolsvc calls get --idempotency-key todo-1 --principal agent-1`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (id == "") == (key == "") {
				return usage(errors.New("give exactly one of --id and --idempotency-key"))
			}
			req := &toolsvcv1.GetCallRequest{}
			if id != "" {
				req.Selector = &toolsvcv1.GetCallRequest_CallId{CallId: id}
			} else {
				req.Selector = &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: key}
			}
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.GetCallResponse, error) {
					return toolsvcv1.NewToolExecutionServiceClient(c.conn).GetCall(ctx, req)
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(resp)
				}
				return printCall(c.stdout, resp.GetCall())
			})
		},
	}
	get.Flags().StringVar(&id, "id", "", "the call's id")
	idempotencyKeyFlag(get, &key, "the idempotency key (of the principal given by --principal)")

	var outcome, comment string
	resolve := &cobra.Command{
		Use:   "resolve CALL_ID --outcome succeeded|failed --comment TEXT",
		Short: "Settle a call whose outcome is UNKNOWN with what really happened (operators)",
		Long: `Settle a call whose outcome is UNKNOWN (the tool may or may not have acted)
with what an operator established: succeeded or failed. The comment is
recorded on the call and in the audit trail. Retries of the call's key replay
the settled outcome.`,
		Example: `  toolsvc calls resolve 01K2... --outcome failed --comment "no charge in the payment provider's log"`,
		Args:    exactArgs("CALL_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireFlag("outcome", outcome); err != nil {
				return err
			}
			if err := requireFlag("comment", comment); err != nil {
				return err
			}
			n, err := parseEnum("outcome", outcome, toolsvcv1.Outcome(0).Descriptor(),
				toolsvcv1.Outcome_OUTCOME_SUCCEEDED.Number(), toolsvcv1.Outcome_OUTCOME_FAILED.Number())
			if err != nil {
				return err
			}
			req := &toolsvcv1.ResolveCallRequest{CallId: args[0], Outcome: toolsvcv1.Outcome(n), Comment: comment}
			return cf.withClient(cmd, lookupEnv, func(c *client) error {
				resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.ResolveCallResponse, error) {
					return toolsvcv1.NewToolExecutionServiceClient(c.conn).ResolveCall(ctx, req)
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(resp)
				}
				fmt.Fprintf(c.stdout, "Resolved call %s as %s.\n\n", resp.GetCall().GetCallId(), enumName(resp.GetCall().GetState()))
				return printCall(c.stdout, resp.GetCall())
			})
		},
	}
	resolve.Flags().StringVar(&outcome, "outcome", "", "what really happened: succeeded or failed (required)")
	resolve.Flags().StringVar(&comment, "comment", "", "how it was established; recorded in the audit trail (required)")

	cmd.AddCommand(get, resolve, newCallTreeCommand(cf, lookupEnv))
	return cmd
}

// printCall prints a call record.
func printCall(w io.Writer, call *toolsvcv1.Call) error {
	f := newFields(w)
	f.add("Call", call.GetCallId())
	f.add("State", enumName(call.GetState()))
	f.add("Tool", fmt.Sprintf("%s.%s (version %d)", call.GetTool(), call.GetAction(), call.GetToolVersion()))
	f.add("Principal", call.GetPrincipal())
	f.add("Key", call.GetIdempotencyKey())
	f.add("Risk", enumName(call.GetRisk()))
	f.add("Gate", enumName(call.GetGateDecision()))
	f.add("Approval", call.GetApprovalId())
	f.add("Task", call.GetTaskId())
	f.add("Trace", call.GetTraceId())
	f.add("Step", call.GetStepId())
	f.add("Parent", call.GetParentCallId())
	if n := len(call.GetChildCallIds()); n > 0 {
		f.add("Steps", fmt.Sprintf("%d (toolsvc calls tree --id %s)", n, call.GetCallId()))
	}
	if p := call.GetProgress(); p != nil {
		f.add("Progress", fmt.Sprintf("%s (%s)", p.GetMessage(), when(p.GetTime())))
	}
	f.add("Attempts", fmt.Sprint(call.GetAttemptCount()))
	f.add("Arguments hash", call.GetArgumentsFingerprint())
	if r := call.GetResult(); r != nil {
		msg := r.GetMessage()
		if msg == "" {
			msg = r.GetModelText()
		}
		f.add("Message", msg)
		f.add("Value", valueJSON(r.GetValue()))
	}
	f.add("Lease expires", whenRel(call.GetLeaseExpireTime()))
	f.add("Resolved by", call.GetResolvedBy())
	f.add("Resolution", call.GetResolutionComment())
	f.add("Created", when(call.GetCreateTime()))
	f.add("Updated", when(call.GetUpdateTime()))
	f.add("Expires", whenRel(call.GetExpireTime()))
	return f.flush()
}

// idempotencyKeyFlag defines --idempotency-key on cmd, and --key as its
// deprecated alias: the name it had, which read too close to --key-file
// (TLS). Scripts that pass --key keep working, and are told the new name on
// stderr.
func idempotencyKeyFlag(cmd *cobra.Command, key *string, help string) {
	fs := cmd.Flags()
	fs.StringVar(key, "idempotency-key", "", help)
	fs.StringVar(key, "key", "", help)
	_ = fs.MarkDeprecated("key", "use --idempotency-key")
	// pflag says so on the flag set's output, which cobra otherwise
	// discards.
	fs.SetOutput(commandStderr{cmd})
}

// commandStderr writes to the command's stderr as it is when written to
// (set on the root command after this one is made).
type commandStderr struct{ cmd *cobra.Command }

func (w commandStderr) Write(p []byte) (int, error) { return w.cmd.ErrOrStderr().Write(p) }
