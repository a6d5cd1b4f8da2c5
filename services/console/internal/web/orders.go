package web

import (
	"context"
	"net/http"
	"strings"

	"github.com/google/uuid"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
)

const (
	ordersPageSize = 50
	// A customer search scans the newest orders page by page (ListWorkOrders
	// has no customer filter yet): at most this many pages of 500.
	customerScanPages = 10
	customerScanSize  = 500
)

var statusNames = []string{"CREATED", "HANDED_OFF", "COMPLETED", "INVOICED", "CANCELLED"}

// statusName is "INVOICED" for WORK_ORDER_STATUS_INVOICED.
func statusName(s workorderv1.WorkOrderStatus) string {
	return strings.TrimPrefix(s.String(), "WORK_ORDER_STATUS_")
}

func parseStatus(s string) workorderv1.WorkOrderStatus {
	return workorderv1.WorkOrderStatus(workorderv1.WorkOrderStatus_value["WORK_ORDER_STATUS_"+s])
}

// orderRow is one order as the list shows it.
type orderRow struct {
	ID, Customer, Status, Created, Price string
	Positions, Completed                 int32
}

func row(o *workorderv1.WorkOrder) orderRow {
	return orderRow{ID: o.GetId(), Customer: o.GetCustomerId(), Status: statusName(o.GetStatus()),
		Created: o.GetCreateTime().AsTime().UTC().Format("2006-01-02 15:04:05Z"), Positions: o.GetPositions(),
		Completed: o.GetCompletedItems(), Price: money(o.GetUnitPrice().GetMinorUnits(), o.GetUnitPrice().GetCurrencyCode())}
}

type ordersData struct {
	Status, Query, Next, Note string
	Statuses                  []string
	Rows                      []orderRow
}

func (h *Handler) ordersPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := ordersData{Status: q.Get("status"), Query: strings.TrimSpace(q.Get("q")), Statuses: statusNames}
	if d.Status != "" && parseStatus(d.Status) == 0 {
		d.Status = ""
	}
	ctx, cancel := context.WithTimeout(outgoing(r.Context(), sessionOf(r)), h.cfg.RPCTimeout)
	defer cancel()
	var errMsg string
	switch _, idErr := uuid.Parse(d.Query); {
	case d.Query != "" && idErr == nil:
		resp, err := h.src.Orders.GetWorkOrder(ctx, &workorderv1.GetWorkOrderRequest{Id: d.Query})
		if err != nil {
			errMsg = describe("workorder", err)
			break
		}
		d.Rows = append(d.Rows, row(resp.GetWorkOrder()))
	case d.Query != "":
		d.Rows, d.Next, d.Note, errMsg = h.searchCustomer(ctx, d.Query, parseStatus(d.Status), q.Get("page"))
	default:
		resp, err := h.src.Orders.ListWorkOrders(ctx, &workorderv1.ListWorkOrdersRequest{
			Status: parseStatus(d.Status), PageSize: ordersPageSize, PageToken: q.Get("page")})
		if err != nil {
			errMsg = describe("workorder", err)
			break
		}
		for _, o := range resp.GetWorkOrders() {
			d.Rows = append(d.Rows, row(o))
		}
		d.Next = resp.GetNextPageToken()
	}
	h.render(w, r, "orders", page{Title: "Orders", Error: errMsg, Data: d})
}

// searchCustomer scans whole pages so that the continuation token resumes
// exactly after what was shown.
func (h *Handler) searchCustomer(ctx context.Context, customer string, st workorderv1.WorkOrderStatus, token string) (rows []orderRow, next, note, errMsg string) {
	scanned := 0
	for range customerScanPages {
		resp, err := h.src.Orders.ListWorkOrders(ctx, &workorderv1.ListWorkOrdersRequest{Status: st, PageSize: customerScanSize, PageToken: token})
		if err != nil {
			return rows, "", "", describe("workorder", err)
		}
		scanned += len(resp.GetWorkOrders())
		for _, o := range resp.GetWorkOrders() {
			if o.GetCustomerId() == customer {
				rows = append(rows, row(o))
			}
		}
		token = resp.GetNextPageToken()
		if token == "" || len(rows) >= ordersPageSize {
			break
		}
	}
	note = "Customer search looked at " + itoa(scanned) + " orders, newest first"
	if token != "" {
		note += "; older orders are on the next page"
	}
	return rows, token, note + ".", ""
}

type transition struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Cause string `json:"cause"`
	Time  string `json:"time"`
}

type orderData struct {
	Order    orderRow
	Invoice  *billingv1.Invoice
	History  []transition
	Timeline []entry
	Sources  []sourceNote
	Terminal bool
	Updated  string
	Version  int64
	Problems []string
	// Trace is the waterfall; the page's only (the live JSON leaves it
	// out: spans are not polled every second).
	Trace traceView
}

func (h *Handler) order(ctx context.Context, s session, id string) (orderData, int) {
	var d orderData
	if _, err := uuid.Parse(id); err != nil {
		return orderData{Problems: []string{"not a work order id: " + id}}, http.StatusNotFound
	}
	ctx, cancel := context.WithTimeout(outgoing(ctx, s), h.cfg.RPCTimeout)
	defer cancel()
	resp, err := h.src.Orders.GetWorkOrder(ctx, &workorderv1.GetWorkOrderRequest{Id: id})
	if err != nil {
		code := http.StatusBadGateway
		if strings.HasSuffix(describe("", err), "not found") {
			code = http.StatusNotFound
		}
		return orderData{Problems: []string{describe("workorder", err)}}, code
	}
	o := resp.GetWorkOrder()
	d.Order, d.Version = row(o), o.GetVersion()
	d.Updated = o.GetUpdateTime().AsTime().UTC().Format("2006-01-02 15:04:05.000Z")
	d.Terminal = d.Order.Status == "INVOICED" || d.Order.Status == "CANCELLED"
	// A failing source is reported in the timeline's source list, next to
	// the others that still show.
	hist, histErr := h.src.Orders.ListWorkOrderHistory(ctx, &workorderv1.ListWorkOrderHistoryRequest{Id: id})
	for _, t := range hist.GetTransitions() {
		d.History = append(d.History, transition{From: statusName(t.GetFromStatus()), To: statusName(t.GetToStatus()),
			Cause: t.GetCause(), Time: t.GetTime().AsTime().UTC().Format("2006-01-02 15:04:05.000Z")})
	}
	var invErr error
	if inv := o.GetInvoiceId(); inv != "" {
		var ir *billingv1.GetInvoiceResponse
		ir, invErr = h.src.Invoices.GetInvoice(ctx, &billingv1.GetInvoiceRequest{Id: inv})
		d.Invoice = ir.GetInvoice()
	}
	d.Timeline, d.Sources = h.timeline(ctx, s, o, hist.GetTransitions(), histErr, d.Invoice, invErr)
	return d, http.StatusOK
}

func (h *Handler) orderPage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	// The trace store is read alongside the services, not after them.
	trace := make(chan traceView, 1)
	go func() { trace <- h.trace(r.Context(), id) }()
	d, code := h.order(r.Context(), sessionOf(r), id)
	d.Trace = <-trace
	if code != http.StatusOK {
		w.WriteHeader(code)
	}
	h.render(w, r, "order", page{Title: "Order " + r.PathValue("id"), Nav: "orders", Data: d})
}

// orderAPI feeds the Order page's live timeline (static/console.js).
func (h *Handler) orderAPI(w http.ResponseWriter, r *http.Request) {
	d, code := h.order(r.Context(), sessionOf(r), r.PathValue("id"))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	writeJSON(w, struct {
		Status   string       `json:"status"`
		Terminal bool         `json:"terminal"`
		Invoice  string       `json:"invoice_id"`
		History  []transition `json:"history"`
		Timeline []entry      `json:"timeline"`
		Sources  []sourceNote `json:"sources"`
		Problems []string     `json:"problems,omitempty"`
	}{d.Order.Status, d.Terminal, d.Invoice.GetId(), d.History, d.Timeline, d.Sources, d.Problems})
}
