package server

import (
	"context"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

// deliveryListFilters identifies ListDeliveries' page tokens.
type deliveryListFilters struct {
	List       string `json:"list"`
	State      string `json:"state"`
	Endpoint   string `json:"endpoint"`
	ApprovalID string `json:"approval_id"`
}

var deliveryStatesFromProto = map[toolsvcv1.DeliveryState]store.DeliveryState{
	toolsvcv1.DeliveryState_DELIVERY_STATE_PENDING:   store.DeliveryPending,
	toolsvcv1.DeliveryState_DELIVERY_STATE_DELIVERED: store.DeliveryDelivered,
	toolsvcv1.DeliveryState_DELIVERY_STATE_DEAD:      store.DeliveryDead,
}

var deliveryStatesToProto = map[store.DeliveryState]toolsvcv1.DeliveryState{
	store.DeliveryPending:   toolsvcv1.DeliveryState_DELIVERY_STATE_PENDING,
	store.DeliveryDelivered: toolsvcv1.DeliveryState_DELIVERY_STATE_DELIVERED,
	store.DeliveryDead:      toolsvcv1.DeliveryState_DELIVERY_STATE_DEAD,
}

// notificationServer serves NotificationService.
type notificationServer struct {
	toolsvcv1.UnimplementedNotificationServiceServer
	st store.Store
}

// ListDeliveries returns notification deliveries newest first. They carry
// no payload (the message body); approvers and operators read them.
func (s *notificationServer) ListDeliveries(ctx context.Context, req *toolsvcv1.ListDeliveriesRequest) (*toolsvcv1.ListDeliveriesResponse, error) {
	if err := checkText(req, "invalid request"); err != nil {
		return nil, err
	}
	var v fault.Violations
	state, ok := deliveryStatesFromProto[req.GetState()]
	if req.GetState() != toolsvcv1.DeliveryState_DELIVERY_STATE_UNSPECIFIED && !ok {
		v.Add("state", "unknown delivery state")
	}
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	if err := v.Err("invalid request"); err != nil {
		return nil, err
	}
	filters := deliveryListFilters{List: "deliveries", State: string(state), Endpoint: req.GetEndpoint(), ApprovalID: req.GetApprovalId()}
	before, err := decodePageToken(req.GetPageToken(), filters)
	if err != nil {
		return nil, err
	}
	list, err := s.st.ListDeliveries(ctx, store.ListDeliveriesParams{
		Before: before, Limit: size + 1, State: state, Endpoint: filters.Endpoint, ApprovalID: filters.ApprovalID,
	})
	if err != nil {
		return nil, err
	}
	resp := &toolsvcv1.ListDeliveriesResponse{}
	if len(list) > size {
		list = list[:size]
		resp.NextPageToken = encodePageToken(list[size-1].ID, filters)
	}
	for _, d := range list {
		resp.Deliveries = append(resp.Deliveries, &toolsvcv1.Delivery{
			DeliveryId: d.ID, Type: d.EventType, ApprovalId: d.ApprovalID, Endpoint: d.Endpoint,
			State: deliveryStatesToProto[d.State], Attempts: int32(d.Attempts),
			NextAttemptTime: timeToProto(d.NextAttemptAt), LastError: d.LastError, LastStatus: int32(d.LastStatus),
			CreateTime: timeToProto(d.CreatedAt), UpdateTime: timeToProto(d.UpdatedAt), DeliverTime: timeToProto(d.DeliveredAt),
		})
	}
	return resp, nil
}
