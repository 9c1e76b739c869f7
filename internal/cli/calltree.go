package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

// Bounds of the tree `calls tree` reads: the server's nesting limit is
// configurable, but a tree is read for a person, one GetCall per call.
const (
	maxTreeDepth = 16
	maxTreeCalls = 500
)

// callNode is a call and the calls its tool made as steps.
type callNode struct {
	call  *toolsvcv1.Call
	steps []*callNode
}

func newCallTreeCommand(cf *clientFlags, lookupEnv env) *cobra.Command {
	var id, key string
	cmd := &cobra.Command{
		Use:   "tree (--id ID | --idempotency-key KEY)",
		Short: "Show a call and the calls its tool made as steps, and theirs, as a tree",
		Long: `Show a call and its steps: the calls a native tool made through the pipeline
while it ran (docs/native-tools.md), with their steps in turn. Each line is
one call: its step id, tool and action, state and id. -o json prints each
call as GetCall returns it, with its steps under "steps".`,
		Example: `  toolsvc calls tree --idempotency-key rel-1 --principal agent-1
  toolsvc calls tree --id 01K2... -o json`,
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
				get := func(r *toolsvcv1.GetCallRequest) (*toolsvcv1.Call, error) {
					resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.GetCallResponse, error) {
						return toolsvcv1.NewToolExecutionServiceClient(c.conn).GetCall(ctx, r)
					})
					return resp.GetCall(), err
				}
				root, err := get(req)
				if err != nil {
					return err
				}
				n, read := &callNode{call: root}, 1
				if err := readSteps(n, get, 1, &read); err != nil {
					return err
				}
				if c.json {
					b, err := treeJSON(n)
					if err != nil {
						return err
					}
					_, err = c.stdout.Write(append(b, '\n'))
					return err
				}
				t := newTable(c.stdout, "STEP", "TOOL", "STATE", "CALL!")
				printTree(t, n, "", "")
				if err := t.flush(); err != nil {
					return err
				}
				if read >= maxTreeCalls {
					fmt.Fprintf(c.stdout, "(the first %d calls)\n", maxTreeCalls)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "the call's id")
	idempotencyKeyFlag(cmd, &key, "the idempotency key (of the principal given by --principal)")
	return cmd
}

// readSteps reads the steps of n, depth levels down from the root, at most
// maxTreeCalls calls in all (read counts them).
func readSteps(n *callNode, get func(*toolsvcv1.GetCallRequest) (*toolsvcv1.Call, error), depth int, read *int) error {
	if depth > maxTreeDepth {
		return nil
	}
	for _, id := range n.call.GetChildCallIds() {
		if *read >= maxTreeCalls {
			return nil
		}
		sc, err := get(&toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_CallId{CallId: id}})
		if err != nil {
			return err
		}
		*read++
		child := &callNode{call: sc}
		n.steps = append(n.steps, child)
		if err := readSteps(child, get, depth+1, read); err != nil {
			return err
		}
	}
	return nil
}

// printTree adds n and its steps to t, the steps indented under it.
func printTree(t *table, n *callNode, lead, prefix string) {
	c := n.call
	step := c.GetStepId()
	if lead == "" {
		step = "(" + c.GetIdempotencyKey() + ")"
	}
	state := enumName(c.GetState())
	if p := c.GetProgress(); p != nil {
		state += ": " + p.GetMessage()
	}
	t.row(lead+step, c.GetTool()+"."+c.GetAction(), state, c.GetCallId())
	for i, s := range n.steps {
		branch, more := "├─ ", "│  "
		if i == len(n.steps)-1 {
			branch, more = "└─ ", "   "
		}
		printTree(t, s, prefix+branch, prefix+more)
	}
}

// treeJSON renders n as {"call": ..., "steps": [...]}, each call as GetCall
// returns it.
func treeJSON(n *callNode) ([]byte, error) {
	type node struct {
		Call  json.RawMessage `json:"call"`
		Steps []*node         `json:"steps,omitempty"`
	}
	var build func(*callNode) (*node, error)
	build = func(cn *callNode) (*node, error) {
		b, err := marshalJSON(cn.call, false)
		if err != nil {
			return nil, err
		}
		out := &node{Call: b}
		for _, s := range cn.steps {
			sn, err := build(s)
			if err != nil {
				return nil, err
			}
			out.Steps = append(out.Steps, sn)
		}
		return out, nil
	}
	root, err := build(n)
	if err != nil {
		return nil, err
	}
	return json.MarshalIndent(root, "", "  ")
}
