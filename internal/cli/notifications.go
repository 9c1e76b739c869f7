package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

func newNotificationsCommand(lookupEnv env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "notifications",
		Short: "See the webhooks and Slack messages sent about approvals (approvers, operators)",
		Long: `See the notifications sent about approvals: delivered, waiting for a retry, or
dead letters whose every attempt failed (docs/notifications.md).`,
		Args: noArgs,
		RunE: showHelp,
	}
	var state, endpoint, approval string
	var quiet bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List deliveries, newest first",
		Example: `  toolsvc notifications list --state dead
  toolsvc notifications list --approval 01a20810-d85d-7188-844a-0e88d44288c2 -o json`,
		Args: noArgs,
	}
	cf := addClientFlags(list)
	limit := addLimitFlag(list)
	list.Flags().StringVar(&state, "state", "", "only deliveries in this state: pending, delivered or dead")
	list.Flags().StringVar(&endpoint, "endpoint", "", "only deliveries to this endpoint (its id)")
	list.Flags().StringVar(&approval, "approval", "", "only deliveries about this approval")
	list.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the deliveries' ids, one per line (for scripts)")
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkLimit(*limit); err != nil {
			return err
		}
		var st toolsvcv1.DeliveryState
		if state != "" {
			n, err := parseEnum("state", state, toolsvcv1.DeliveryState(0).Descriptor())
			if err != nil {
				return err
			}
			st = toolsvcv1.DeliveryState(n)
		}
		return cf.withClient(cmd, lookupEnv, func(c *client) error {
			svc := toolsvcv1.NewNotificationServiceClient(c.conn)
			ds, err := collect(c, *limit, maxPage, func(ctx context.Context, size int32, token string) ([]*toolsvcv1.Delivery, string, error) {
				resp, err := svc.ListDeliveries(ctx, &toolsvcv1.ListDeliveriesRequest{
					PageSize: size, PageToken: token, State: st, Endpoint: endpoint, ApprovalId: approval,
				})
				return resp.GetDeliveries(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(&toolsvcv1.ListDeliveriesResponse{Deliveries: ds})
			}
			if quiet {
				for _, d := range ds {
					fmt.Fprintln(c.stdout, d.GetDeliveryId())
				}
				return nil
			}
			tw := newTable(c.stdout, "ID!", "STATE!", "TYPE!", "ATTEMPTS", "CREATED", "ENDPOINT", "LAST ERROR")
			for _, d := range ds {
				tw.row(d.GetDeliveryId(), enumName(d.GetState()), d.GetType(), fmt.Sprint(d.GetAttempts()),
					shortDay(d.GetCreateTime()), d.GetEndpoint(), orDash(d.GetLastError()))
			}
			return tw.flush()
		})
	}
	cmd.AddCommand(list, newReceiveCommand())
	return cmd
}
