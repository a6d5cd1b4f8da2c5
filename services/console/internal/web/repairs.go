package web

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
)

// The Repair page's sections beyond the parked inbox entries: dead letters,
// parked billing events (both services), dead invoice jobs and FAILED
// outbox events (both services). Every repair is two POSTs: a dry run (the
// service reports what would change, and audits the dry run), then the real
// action with exactly what the dry run listed, carried by the dry run's
// confirmation form. Both need login, CSRF and a ticket; the actor is the
// session's principal.

// deadLetterSource is one dead-letter inspection subscription and the RPC
// that replays it.
type deadLetterSource struct {
	Key, Subscription, Service, Runbook string
}

var deadLetterSources = []deadLetterSource{
	{Key: "inbox", Subscription: "workorder.work-order-completed dead letters (completions, inbox)", Service: "workorder", Runbook: "replay-dead-letter-events.md"},
	{Key: "invoicing", Subscription: "workorder.billing-events dead letters (InvoiceIssued)", Service: "workorder", Runbook: "replay-dead-letter-events.md"},
	{Key: "billing", Subscription: "billing.workorder-events dead letters (completions)", Service: "billing", Runbook: "replay-dead-letter-events.md"},
}

// maxDeadLetters bounds the dead letters pulled by one dry run.
const maxDeadLetters = 100

// actionResult is the outcome of a dry run or a repair, with the form that
// confirms a dry run.
type actionResult struct {
	Section string
	DryRun  bool
	Title   string
	Lines   []string
	Confirm *confirmForm
}

// confirmForm repeats a dry run as the real action: the fields are hidden
// inputs (the ticket included), so what runs is what was shown.
type confirmForm struct {
	Action string
	Label  string
	Fields []formField
}

type formField struct{ Name, Value string }

// parkedSection lists one service's parked messages.
type parkedSection struct {
	Service, Title, Help, Error string
	Rows                        []parkedRow
}

// parkedRow is a parked message of either service.
type parkedRow struct {
	ID                             int64
	Reason, EventType, WorkOrderID string
	ParkTime                       *timestamppb.Timestamp
}

// repairSections reads the sections' lists; an error is shown in its
// section only.
func (h *Handler) repairSections(ctx context.Context, d *repairData) {
	d.SectionErrors = map[string]string{}
	inv := parkedSection{Service: "workorder", Title: "Parked billing events (workorder, InvoiceIssued)",
		Help: "InvoiceIssued messages the work-order service could not apply."}
	if r, err := h.src.WorkOrderOps.ListParkedMessages(ctx, &opsv1.ListParkedMessagesRequest{PageSize: repairPageSize}); err != nil {
		inv.Error = describe("workorder", err)
	} else {
		for _, m := range r.GetMessages() {
			inv.Rows = append(inv.Rows, parkedRow{m.GetId(), m.GetReason(), m.GetEventType(), m.GetSubject(), m.GetParkTime()})
		}
	}
	bil := parkedSection{Service: "billing", Title: "Parked intake messages (billing)",
		Help: "Completions billing's intake could not take."}
	if r, err := h.src.BillingOps.ListParkedMessages(ctx, &opsv1.ListParkedMessagesRequest{PageSize: repairPageSize}); err != nil {
		bil.Error = describe("billing", err)
	} else {
		for _, m := range r.GetMessages() {
			bil.Rows = append(bil.Rows, parkedRow{m.GetId(), m.GetReason(), m.GetEventType(), m.GetSubject(), m.GetParkTime()})
		}
	}
	d.Parked = []parkedSection{inv, bil}
	if r, err := h.src.BillingRepairs.ListJobs(ctx, &opsv1.ListJobsRequest{State: "dead", PageSize: repairPageSize}); err != nil {
		d.SectionErrors["jobs"] = describe("billing", err)
	} else {
		d.DeadJobs = r.GetJobs()
	}
	wo := outboxSection{Service: "workorder", Title: "FAILED outbox events (workorder: hand-offs, completions for billing)"}
	if r, err := h.src.WorkOrderOps.ListOutboxEvents(ctx, &opsv1.ListOutboxEventsRequest{States: []string{"FAILED"}, PageSize: repairPageSize}); err != nil {
		wo.Error = describe("workorder", err)
	} else {
		for _, e := range r.GetEvents() {
			wo.Rows = append(wo.Rows, outboxRow{e.GetEventId(), e.GetSequence(), e.GetAggregateId(), e.GetEventType(), e.GetAttempts(), e.GetLastError(), e.GetCreateTime()})
		}
	}
	bo := outboxSection{Service: "billing", Title: "FAILED outbox events (billing: InvoiceIssued)"}
	if r, err := h.src.BillingOps.ListOutboxEvents(ctx, &opsv1.ListOutboxEventsRequest{States: []string{"FAILED"}, PageSize: repairPageSize}); err != nil {
		bo.Error = describe("billing", err)
	} else {
		for _, e := range r.GetEvents() {
			bo.Rows = append(bo.Rows, outboxRow{e.GetEventId(), e.GetSequence(), e.GetAggregateId(), e.GetEventType(), e.GetAttempts(), e.GetLastError(), e.GetCreateTime()})
		}
	}
	d.FailedOutbox = []outboxSection{wo, bo}
}

// outboxSection lists one service's FAILED outbox events.
type outboxSection struct {
	Service, Title, Error string
	Rows                  []outboxRow
}

// outboxRow is a FAILED outbox event of either service.
type outboxRow struct {
	EventID     string
	Sequence    int64
	AggregateID string
	EventType   string
	Attempts    int32
	LastError   string
	CreateTime  *timestamppb.Timestamp
}

// repairForm is what every repair POST carries.
type repairForm struct {
	ticket, actor string
	dry           bool
}

// repairAction parses a repair POST and loads the page around its result;
// it renders the page with the error and returns false when the form is
// incomplete.
func (h *Handler) repairAction(w http.ResponseWriter, r *http.Request) (repairData, repairForm, bool) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, "400 bad form", http.StatusBadRequest)
		return repairData{}, repairForm{}, false
	}
	// The actor is the session's principal, never a form field.
	f := repairForm{ticket: strings.TrimSpace(r.PostForm.Get("ticket")), actor: sessionOf(r).Principal,
		dry: r.PostForm.Get("mode") != "real"}
	// The inbox listing's error (the workorder service) does not stop a
	// repair of another section; each section shows its own.
	d, _ := h.repairData(r.Context(), sessionOf(r), "")
	d.Ticket, d.Actor = f.ticket, f.actor
	if f.ticket == "" || f.actor == "" {
		errMsg := "A ticket is required: every repair, dry runs too, is audited with it and your name."
		w.WriteHeader(http.StatusBadRequest)
		h.render(w, r, "repair", page{Title: "Repair", Error: errMsg, Data: d})
		return d, f, false
	}
	return d, f, true
}

// ids parses the form's repeated name as positive ids, at most limit.
func formIDs(r *http.Request, name string, limit int) ([]int64, error) {
	var ids []int64
	for _, v := range r.PostForm[name] {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			return nil, fmt.Errorf("not an id: %q", v)
		}
		ids = append(ids, id)
	}
	if len(ids) > limit {
		return nil, fmt.Errorf("at most %d at once", limit)
	}
	return ids, nil
}

// finish renders the outcome of a repair call: the error, or the result
// over a fresh read of the sections (a real action changed them).
func (h *Handler) finish(w http.ResponseWriter, r *http.Request, d repairData, f repairForm, service string, res *actionResult, err error) {
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		h.render(w, r, "repair", page{Title: "Repair", Error: describe(service, err), Data: d})
		return
	}
	h.logger.InfoContext(r.Context(), "console: repair", "section", res.Section, "dry_run", f.dry, "items", len(res.Lines))
	if !f.dry {
		d, _ = h.repairData(r.Context(), sessionOf(r), "")
		d.Ticket, d.Actor = f.ticket, f.actor
	}
	d.Action = res
	h.render(w, r, "repair", page{Title: "Repair", Data: d})
}

func confirm(action, label string, f repairForm, fields ...formField) *confirmForm {
	return &confirmForm{Action: action, Label: fmt.Sprintf("%s (ticket %s, actor %s)", label, f.ticket, f.actor),
		Fields: append([]formField{{"ticket", f.ticket}, {"mode", "real"}}, fields...)}
}

func (h *Handler) rpcContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(outgoing(r.Context(), sessionOf(r)), h.cfg.RPCTimeout)
}

// replayDeadLetters replays one subscription's dead letters: the dry run
// pulls up to maxDeadLetters and releases them; the real replay takes only
// the message ids the dry run listed.
func (h *Handler) replayDeadLetters(w http.ResponseWriter, r *http.Request) {
	d, f, ok := h.repairAction(w, r)
	if !ok {
		return
	}
	var src *deadLetterSource
	for i := range deadLetterSources {
		if deadLetterSources[i].Key == r.PostForm.Get("source") {
			src = &deadLetterSources[i]
		}
	}
	ids := r.PostForm["message_id"]
	errMsg := ""
	switch {
	case src == nil:
		errMsg = "Unknown dead-letter source."
	case !f.dry && len(ids) == 0:
		errMsg = "A replay takes the dead letters a dry run listed: run the dry run first."
	case len(ids) > maxDeadLetters:
		errMsg = fmt.Sprintf("At most %d dead letters at once.", maxDeadLetters)
	}
	if errMsg != "" {
		w.WriteHeader(http.StatusBadRequest)
		h.render(w, r, "repair", page{Title: "Repair", Error: errMsg, Data: d})
		return
	}
	ctx, cancel := h.rpcContext(r)
	defer cancel()
	max := int32(maxDeadLetters)
	if !f.dry {
		max = int32(len(ids))
	}
	var taken, failed []string
	var detail string
	var err error
	switch src.Key {
	case "inbox":
		var resp *opsv1.ReplayDeadLettersResponse
		resp, err = h.src.WorkOrderOps.ReplayDeadLetters(ctx, &opsv1.ReplayDeadLettersRequest{Consumer: "inbox",
			Authorization: &opsv1.OperatorAuthorization{Ticket: f.ticket, Actor: f.actor}, MessageIds: ids, MaxMessages: max, DryRun: f.dry})
		taken, failed, detail = resp.GetMessageIds(), resp.GetFailedMessageIds(), outcomes(resp.GetOutcomes())
	case "invoicing":
		var resp *opsv1.ReplayDeadLettersResponse
		resp, err = h.src.WorkOrderOps.ReplayDeadLetters(ctx, &opsv1.ReplayDeadLettersRequest{Consumer: "invoicing",
			Authorization: &opsv1.OperatorAuthorization{Ticket: f.ticket, Actor: f.actor}, MessageIds: ids, MaxMessages: max, DryRun: f.dry})
		taken, failed, detail = resp.GetMessageIds(), resp.GetFailedMessageIds(), outcomes(resp.GetOutcomes())
	default:
		var resp *opsv1.ReplayDeadLettersResponse
		resp, err = h.src.BillingOps.ReplayDeadLetters(ctx, &opsv1.ReplayDeadLettersRequest{Consumer: "intake",
			Authorization: &opsv1.OperatorAuthorization{Ticket: f.ticket, Actor: f.actor}, MessageIds: ids, MaxMessages: max, DryRun: f.dry})
		taken, failed, detail = resp.GetMessageIds(), resp.GetFailedMessageIds(), outcomes(resp.GetOutcomes())
	}
	res := &actionResult{Section: "dead-letters", DryRun: f.dry, Lines: taken}
	if f.dry {
		res.Title = fmt.Sprintf("Dry run: %d dead letters of %s would be replayed", len(taken), src.Subscription)
		if len(taken) > 0 {
			fields := []formField{{"source", src.Key}}
			for _, id := range taken {
				fields = append(fields, formField{"message_id", id})
			}
			res.Confirm = confirm("/repair/dead-letters", fmt.Sprintf("Replay these %d dead letters", len(taken)), f, fields...)
		}
	} else {
		res.Title = fmt.Sprintf("Replayed %d of %d dead letters of %s (%s)", len(taken)-len(failed), len(ids), src.Subscription, detail)
		if len(failed) > 0 {
			res.Title += fmt.Sprintf("; %d failed and stay dead letters", len(failed))
		}
	}
	h.finish(w, r, d, f, src.Service, res, err)
}

func outcomes(m map[string]int32) string {
	var parts []string
	for _, k := range []string{"enqueued", "invoiced", "duplicate", "order_already_queued", "parked", "unknown_type"} {
		if n, ok := m[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	return strings.Join(parts, ", ")
}

// replayParked replays one parked message of either service: the dry run
// applies and rolls back, reporting the outcome; the real replay takes the
// same id.
func (h *Handler) replayParked(w http.ResponseWriter, r *http.Request) {
	d, f, ok := h.repairAction(w, r)
	if !ok {
		return
	}
	ids, err := formIDs(r, "id", 1)
	service := r.PostForm.Get("service")
	if err != nil || len(ids) != 1 || (service != "workorder" && service != "billing") {
		w.WriteHeader(http.StatusBadRequest)
		h.render(w, r, "repair", page{Title: "Repair", Error: "Select one parked message.", Data: d})
		return
	}
	ctx, cancel := h.rpcContext(r)
	defer cancel()
	ops, consumer := h.src.WorkOrderOps, "invoicing"
	if service == "billing" {
		ops, consumer = h.src.BillingOps, "intake"
	}
	resp, err := ops.ReplayParkedMessage(ctx, &opsv1.ReplayParkedMessageRequest{Consumer: consumer,
		Authorization: &opsv1.OperatorAuthorization{Ticket: f.ticket, Actor: f.actor}, Id: ids[0], DryRun: f.dry})
	outcome := resp.GetOutcome()
	id := strconv.FormatInt(ids[0], 10)
	res := &actionResult{Section: "parked", DryRun: f.dry, Lines: []string{id}}
	if f.dry {
		res.Title = fmt.Sprintf("Dry run: %s parked message %s would be replayed: %s", service, id, outcome)
		res.Confirm = confirm("/repair/parked", "Replay parked message "+id, f, formField{"service", service}, formField{"id", id})
	} else {
		res.Title = fmt.Sprintf("Replayed %s parked message %s: %s", service, id, outcome)
	}
	h.finish(w, r, d, f, service, res, err)
}

// retryJobs requeues dead invoice jobs: the dry run names the selected jobs
// that are dead now; the real retry takes exactly those.
func (h *Handler) retryJobs(w http.ResponseWriter, r *http.Request) {
	d, f, ok := h.repairAction(w, r)
	if !ok {
		return
	}
	ids, err := formIDs(r, "id", repairPageSize)
	if err == nil && len(ids) == 0 {
		err = fmt.Errorf("select the dead jobs to retry")
	}
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		h.render(w, r, "repair", page{Title: "Repair", Error: "Jobs: " + err.Error() + ".", Data: d})
		return
	}
	ctx, cancel := h.rpcContext(r)
	defer cancel()
	resp, err := h.src.BillingRepairs.RetryJobs(ctx, &opsv1.RetryJobsRequest{
		Authorization: &opsv1.OperatorAuthorization{Ticket: f.ticket, Actor: f.actor}, Ids: ids, DryRun: f.dry})
	res := &actionResult{Section: "jobs", DryRun: f.dry}
	var fields []formField
	for _, id := range resp.GetIds() {
		s := strconv.FormatInt(id, 10)
		res.Lines = append(res.Lines, s)
		fields = append(fields, formField{"id", s})
	}
	if f.dry {
		res.Title = fmt.Sprintf("Dry run: %d dead jobs would be retried", len(res.Lines))
		if len(fields) > 0 {
			res.Confirm = confirm("/repair/jobs", fmt.Sprintf("Retry these %d jobs", len(fields)), f, fields...)
		}
	} else {
		res.Title = fmt.Sprintf("Retried %d jobs", len(res.Lines))
	}
	h.finish(w, r, d, f, "billing", res, err)
}

// requeueOutbox requeues FAILED outbox events of one service: the dry run
// names the selected events that are FAILED now; the real requeue takes
// exactly those. A requeued event goes back to PENDING with a fresh attempt
// budget, ahead of the events of its order that waited behind it.
func (h *Handler) requeueOutbox(w http.ResponseWriter, r *http.Request) {
	d, f, ok := h.repairAction(w, r)
	if !ok {
		return
	}
	service := r.PostForm.Get("service")
	ids := r.PostForm["event_id"]
	errMsg := ""
	switch {
	case service != "workorder" && service != "billing":
		errMsg = "Unknown outbox: the service is workorder or billing."
	case len(ids) == 0:
		errMsg = "Select the FAILED events to requeue."
	case len(ids) > repairPageSize:
		errMsg = fmt.Sprintf("At most %d events at once.", repairPageSize)
	}
	for _, id := range ids {
		if errMsg == "" && uuid.Validate(id) != nil {
			errMsg = fmt.Sprintf("Not an event id: %q.", id)
		}
	}
	if errMsg != "" {
		w.WriteHeader(http.StatusBadRequest)
		h.render(w, r, "repair", page{Title: "Repair", Error: "Outbox: " + errMsg, Data: d})
		return
	}
	ctx, cancel := h.rpcContext(r)
	defer cancel()
	ops := h.src.WorkOrderOps
	if service == "billing" {
		ops = h.src.BillingOps
	}
	resp, err := ops.RequeueOutboxEvents(ctx, &opsv1.RequeueOutboxEventsRequest{
		Authorization: &opsv1.OperatorAuthorization{Ticket: f.ticket, Actor: f.actor}, EventIds: ids, DryRun: f.dry})
	requeued, skipped := resp.GetEventIds(), len(resp.GetSkipped())
	res := &actionResult{Section: "outbox", DryRun: f.dry, Lines: requeued}
	if f.dry {
		res.Title = fmt.Sprintf("Dry run: %d FAILED %s outbox events would be requeued", len(requeued), service)
		if len(requeued) > 0 {
			fields := []formField{{"service", service}}
			for _, id := range requeued {
				fields = append(fields, formField{"event_id", id})
			}
			res.Confirm = confirm("/repair/outbox", fmt.Sprintf("Requeue these %d events", len(requeued)), f, fields...)
		}
	} else {
		res.Title = fmt.Sprintf("Requeued %d %s outbox events", len(requeued), service)
	}
	if skipped > 0 {
		res.Title += fmt.Sprintf("; %d selected are not FAILED and are left alone", skipped)
	}
	h.finish(w, r, d, f, service, res, err)
}
