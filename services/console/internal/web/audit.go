package web

import (
	"encoding/json"
	"net/http"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
)

// auditPageSize is the rows of one Audit page.
const auditPageSize = 50

// auditRow is one operator_audit row of a service.
type auditRow struct {
	ID       int64
	Action   string
	Actor    string
	Ticket   string
	DryRun   bool
	Affected int32
	Time     *timestamppb.Timestamp
	Params   string
}

type auditData struct {
	Service               string
	Action, Actor, Ticket string
	Rows                  []auditRow
	Next, PageToken       string
	NeedsLog              bool
}

func paramsJSON(p *structpb.Struct) string {
	b, err := json.Marshal(p.AsMap())
	if err != nil {
		return ""
	}
	return string(b)
}

// auditPage lists one service's operator_audit (newest first, paged by the
// service's token, filtered by action, actor and ticket), through its
// OperatorService: workorder's and billing's repairs, provider-sim's
// fault changes. It needs the token for reads, so it needs login even
// when reads are open.
func (h *Handler) auditPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := auditData{Service: q.Get("service"), Action: strings.TrimSpace(q.Get("action")), Actor: strings.TrimSpace(q.Get("actor")),
		Ticket: strings.TrimSpace(q.Get("ticket")), PageToken: q.Get("page")}
	var ops AuditLog
	switch d.Service {
	case "billing":
		ops = h.src.BillingOps
	case "provider-sim":
		ops = h.src.ProviderAudit
	default:
		d.Service, ops = "workorder", h.src.WorkOrderOps
	}
	s := sessionOf(r)
	if !s.LoggedIn {
		d.NeedsLog = true
		h.render(w, r, "audit", page{Title: "Audit", Data: d})
		return
	}
	ctx, cancel := h.rpcContext(r)
	defer cancel()
	resp, err := ops.ListOperatorAudit(ctx, &opsv1.ListOperatorAuditRequest{Action: d.Action, Actor: d.Actor,
		Ticket: d.Ticket, PageSize: auditPageSize, PageToken: d.PageToken})
	for _, a := range resp.GetRecords() {
		d.Rows = append(d.Rows, auditRow{a.GetId(), a.GetAction(), a.GetActor(), a.GetTicket(), a.GetDryRun(), a.GetAffected(),
			a.GetOccurTime(), paramsJSON(a.GetParams())})
	}
	d.Next = resp.GetNextPageToken()
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		h.render(w, r, "audit", page{Title: "Audit", Error: describe(d.Service, err), Data: d})
		return
	}
	h.render(w, r, "audit", page{Title: "Audit", Data: d})
}
