package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolsvc/toolsvc/internal/notify"
)

// newReceiveCommand is a small webhook receiver: it verifies what toolsvc
// sends, as docs/notifications.md tells a receiver to, and prints it. For
// trying notifications out and for checking an endpoint's secret.
func newReceiveCommand() *cobra.Command {
	var listen, secretFile string
	var window time.Duration
	cmd := &cobra.Command{
		Use:   "receive",
		Short: "Receive webhooks, verify their signatures and print them (a local receiver for trying notifications out)",
		Long: `Listen for toolsvc's webhooks, verify each one as a receiver should (Standard
Webhooks signature, a timestamp within the replay window, a webhook-id not
seen before) and print it. Answers 204 to verified messages, 401 to the rest.`,
		Example: `  toolsvc notifications receive --listen 127.0.0.1:9000 --secret-file secrets/notifications/signing`,
		Args:    noArgs,
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:9000", "host:port to listen on")
	cmd.Flags().StringVar(&secretFile, "secret-file", "", "file holding the endpoint's signing secret (whsec_...)")
	cmd.Flags().DurationVar(&window, "window", 5*time.Minute, "replay window: messages whose timestamp is further from now are refused")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if secretFile == "" {
			return usage(errors.New("--secret-file is required"))
		}
		b, err := os.ReadFile(secretFile)
		if err != nil {
			return err
		}
		key, err := notify.SigningKey(string(b))
		if err != nil {
			return fmt.Errorf("%s: %w", secretFile, err)
		}
		lis, err := net.Listen("tcp", listen)
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		fmt.Fprintf(out, "Receiving webhooks at http://%s/ (replay window %s)\n", lis.Addr(), window)
		r := &receiver{key: key, window: window, out: out, seen: map[string]time.Time{}}
		srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
		ctx := cmd.Context()
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
	return cmd
}

// receiver verifies and prints webhooks.
type receiver struct {
	key    []byte
	window time.Duration
	out    io.Writer

	mu   sync.Mutex
	seen map[string]time.Time // webhook-ids handled, kept for the window
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "unreadable body", http.StatusBadRequest)
		return
	}
	id := r.Header.Get(notify.HeaderID)
	now := time.Now()
	if err := notify.Verify(rc.key, id, r.Header.Get(notify.HeaderTimestamp), r.Header.Get(notify.HeaderSignature), body, now, rc.window); err != nil {
		rc.print("refused   %s: %v\n", id, err)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	rc.mu.Lock()
	for k, at := range rc.seen {
		if now.Sub(at) > 2*rc.window {
			delete(rc.seen, k)
		}
	}
	_, dup := rc.seen[id]
	rc.seen[id] = now
	rc.mu.Unlock()
	if dup {
		// Delivered again (a retry whose answer was lost): handled once.
		rc.print("duplicate %s (already handled)\n", id)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	var m notify.Message
	_ = json.Unmarshal(body, &m)
	d := m.Data
	line := fmt.Sprintf("verified  %s  %s.%s for %s  %s", m.Type, d.Tool, d.Action, d.Requester, d.State)
	if d.Resolver != "" {
		line += " by " + d.Resolver
	}
	line += fmt.Sprintf("  approval %s  (webhook-id %s)\n", d.ApprovalID, id)
	if d.URL != "" {
		line += "          " + d.URL + "\n"
	}
	rc.print("%s", line)
	w.WriteHeader(http.StatusNoContent)
}

func (rc *receiver) print(format string, args ...any) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	fmt.Fprintf(rc.out, format, args...)
}
