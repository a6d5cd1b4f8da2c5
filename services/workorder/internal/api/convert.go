package api

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// Converters between the API's protobuf messages and the orders domain. They
// are the only place that knows both shapes.

var statusToProto = map[orders.Status]workorderv1.WorkOrderStatus{
	orders.StatusCreated:   workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_CREATED,
	orders.StatusHandedOff: workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_HANDED_OFF,
	orders.StatusCompleted: workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_COMPLETED,
	orders.StatusInvoiced:  workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_INVOICED,
	orders.StatusCancelled: workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_CANCELLED,
}

// toProtoStatus maps a stored status; "" (before the first transition) and
// anything unknown are UNSPECIFIED.
func toProtoStatus(s orders.Status) workorderv1.WorkOrderStatus {
	return statusToProto[s]
}

// fromProtoStatus maps a filter; UNSPECIFIED is "" (no filter).
func fromProtoStatus(s workorderv1.WorkOrderStatus) orders.Status {
	for k, v := range statusToProto {
		if v == s {
			return k
		}
	}
	return ""
}

func toProto(o orders.Order) *workorderv1.WorkOrder {
	return &workorderv1.WorkOrder{
		Id:             o.ID.String(),
		CustomerId:     o.CustomerID,
		Description:    o.Description,
		Positions:      o.Positions,
		UnitPrice:      &moneyv1.Money{CurrencyCode: o.UnitPrice.CurrencyCode, MinorUnits: o.UnitPrice.MinorUnits},
		Status:         toProtoStatus(o.Status),
		CompletedItems: o.CompletedItems,
		InvoiceId:      o.InvoiceID,
		CreateTime:     timestamppb.New(o.CreatedAt),
		UpdateTime:     timestamppb.New(o.UpdatedAt),
		Version:        o.Version,
		Creator:        o.CreatedBy,
	}
}

func toProtoTransition(t orders.Transition) *workorderv1.StatusTransition {
	return &workorderv1.StatusTransition{
		FromStatus: toProtoStatus(t.From),
		ToStatus:   toProtoStatus(t.To),
		Cause:      t.Cause,
		Time:       timestamppb.New(t.At),
	}
}

// withoutOutputOnly returns a copy of req whose OUTPUT_ONLY fields are
// cleared. Following AIP-203, output-only fields a client sends (typically a
// resource it read and posts back) are ignored, not rejected. Clearing them
// before hashing also means that a retry differing only in them is the same
// request for its idempotency key.
func withoutOutputOnly(req *workorderv1.CreateWorkOrderRequest) *workorderv1.CreateWorkOrderRequest {
	c := proto.CloneOf(req)
	wo := c.GetWorkOrder()
	wo.Id = ""
	wo.Status = workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_UNSPECIFIED
	wo.CompletedItems = 0
	wo.InvoiceId = ""
	wo.CreateTime = nil
	wo.UpdateTime = nil
	wo.Version = 0
	wo.Creator = ""
	return c
}

// fromCreateRequest builds a new order from a validated request.
func fromCreateRequest(req *workorderv1.CreateWorkOrderRequest) (orders.Order, error) {
	wo := req.GetWorkOrder()
	return orders.New(wo.GetCustomerId(), wo.GetDescription(), wo.GetPositions(), orders.Money{
		CurrencyCode: wo.GetUnitPrice().GetCurrencyCode(),
		MinorUnits:   wo.GetUnitPrice().GetMinorUnits(),
	})
}
