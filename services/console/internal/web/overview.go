package web

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/services/console/internal/overview"
)

// latencySample is how many of the newest invoiced orders the create→invoiced
// percentiles are computed over: one ListWorkOrders page, no extra RPC.
const latencySample = 200

// stall is one Overview gauge with its runbook.
type stall struct {
	Key, Label, Unit, Runbook, Help string
}

var stalls = []stall{
	{"oldest_pending_outbox_seconds", "Oldest pending outbox event", "s", "outbox-relay-stalled.md",
		"A relay that stopped, or a destination that stays unreachable, shows here first."},
	{"oldest_open_inbox_seconds", "Oldest open inbox entry", "s", "inbox-oldest-open-entry.md",
		"Completions stored but not applied: the inbox relay is not running or not committing."},
	{"dead_letter_depth", "Dead-letter depth", "", "replay-dead-letter-events.md",
		"Messages a consumer gave up on after its delivery attempts."},
	{"dead_jobs", "Dead billing jobs", "", "billing-jobs-dead-or-stuck.md",
		"Invoice jobs parked for a person after their attempts."},
	{"parked_inbox", "Parked inbox entries", "", "repair-parked-inbox-entries.md",
		"Completions parked by reason; replay them from the Repair page."},
}

// Latency is create→invoiced over the newest invoiced orders.
type Latency struct {
	Count int     `json:"count"`
	P50s  float64 `json:"p50_seconds"`
	P90s  float64 `json:"p90_seconds"`
	P99s  float64 `json:"p99_seconds"`
	Error string  `json:"error,omitempty"`
}

type overviewData struct {
	overview.Figures
	Latency Latency `json:"latency"`
	Error   string  `json:"error,omitempty"`
}

func (h *Handler) overviewData(ctx context.Context, s session) overviewData {
	var d overviewData
	f, err := h.src.Figures.Read(ctx)
	if err != nil {
		d.Error = err.Error()
	}
	d.Figures = f
	d.Latency = h.latency(ctx, s)
	return d
}

// latency: an INVOICED order does not change again, so its update_time is
// when it became INVOICED.
func (h *Handler) latency(ctx context.Context, s session) Latency {
	ctx, cancel := context.WithTimeout(outgoing(ctx, s), h.cfg.RPCTimeout)
	defer cancel()
	resp, err := h.src.Orders.ListWorkOrders(ctx, &workorderv1.ListWorkOrdersRequest{
		Status: workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_INVOICED, PageSize: latencySample})
	if err != nil {
		return Latency{Error: describe("workorder", err)}
	}
	var ds []float64
	for _, o := range resp.GetWorkOrders() {
		ds = append(ds, o.GetUpdateTime().AsTime().Sub(o.GetCreateTime().AsTime()).Seconds())
	}
	slices.Sort(ds)
	l := Latency{Count: len(ds)}
	if len(ds) > 0 {
		l.P50s, l.P90s, l.P99s = rank(ds, 0.50), rank(ds, 0.90), rank(ds, 0.99)
	}
	return l
}

// rank is the nearest-rank percentile of sorted values.
func rank(sorted []float64, p float64) float64 {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func (h *Handler) overviewPage(w http.ResponseWriter, r *http.Request) {
	d := h.overviewData(r.Context(), sessionOf(r))
	h.render(w, r, "overview", page{Title: "Overview", Data: struct {
		overviewData
		Stalls      []stall
		Now         map[string]string
		RunbookBase string
		Statuses    []string
		Generated   time.Time
	}{d, stalls, stallValues(d.Figures), h.cfg.RunbookBaseURL, []string{"CREATED", "HANDED_OFF", "COMPLETED"}, time.Now()}})
}

// stallValues renders the stall gauges as the page's script does.
func stallValues(f overview.Figures) map[string]string {
	parked := 0.0
	for _, n := range f.ParkedInbox {
		parked += n
	}
	return map[string]string{
		"oldest_pending_outbox_seconds": fmt.Sprintf("%.2f s", f.OldestPendingOutboxSeconds),
		"oldest_open_inbox_seconds":     fmt.Sprintf("%.2f s", f.OldestOpenInboxSeconds),
		"dead_letter_depth":             fmt.Sprintf("%.0f", f.DeadLetterDepth),
		"dead_jobs":                     fmt.Sprintf("%.0f", f.DeadJobs),
		"parked_inbox":                  fmt.Sprintf("%.0f", parked),
	}
}

func (h *Handler) overviewAPI(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, h.overviewData(r.Context(), sessionOf(r)))
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
