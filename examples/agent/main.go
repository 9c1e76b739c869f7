// Command agent is a small agent loop over toolsvc: it exports the tools the
// principal may call in a model provider's format, gives them to a model,
// runs each tool call the model makes through ExecuteTool (by exported
// name, with the arguments as JSON text), waits without polling when a call
// needs a person's approval, and hands the model the text toolsvc prepared
// for it (model_text). See docs/agents.md.
//
// The model here is scripted (no network): it plays back replies written in
// the provider's format. Replace Scripted with a client of your provider to
// run a real one.
//
//	go run ./cmd/toolsvc serve &
//	go run ./examples/agent --format anthropic --principal agent-1 &
//	toolsvc approvals approve "$(toolsvc approvals list --state pending -q)" --principal alice
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "toolsvc's address")
	principal := flag.String("principal", "agent-1", "the principal to act as (authentication off)")
	format := flag.String("format", "anthropic", "the provider format: anthropic or openai-chat")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	text, err := run(ctx, *addr, *principal, *format)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
	fmt.Println(text)
}

func run(ctx context.Context, addr, principal, format string) (string, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-toolsvc-principal", principal)
	a, model, err := newAgent(conn, format)
	if err != nil {
		return "", err
	}
	a.Log = os.Stderr
	return a.Run(ctx, model)
}

// newAgent is the agent and the scripted model for a format.
func newAgent(conn *grpc.ClientConn, format string) (*Agent, *Scripted, error) {
	a := &Agent{
		Exec:      toolsvcv1.NewToolExecutionServiceClient(conn),
		Approvals: toolsvcv1.NewApprovalServiceClient(conn),
		Registry:  toolsvcv1.NewRegistryServiceClient(conn),
		Task:      fmt.Sprintf("agent-%d", time.Now().UnixNano()),
	}
	m := &Scripted{Replies: demoScript[format]}
	switch format {
	case "anthropic":
		a.Format, m.Parse = toolsvcv1.ExportFormat_EXPORT_FORMAT_ANTHROPIC, ParseAnthropic
	case "openai-chat":
		a.Format, m.Parse = toolsvcv1.ExportFormat_EXPORT_FORMAT_OPENAI_CHAT, ParseOpenAI
	default:
		return nil, nil, fmt.Errorf("--format must be anthropic or openai-chat, not %q", format)
	}
	return a, m, nil
}
