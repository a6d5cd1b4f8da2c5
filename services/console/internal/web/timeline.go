package web

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
)

// The Order page's timeline: everything the three services recorded about
// one order, merged by time. Each source is read through its service's API;
// one that fails or needs a login says so in the source list, and the rest
// still show.

const (
	// An order has a hand-off and a completion event, a few more after
	// repairs: pages of this many, at most timelineOutboxPages of them.
	timelineOutboxPage  = 100
	timelineOutboxPages = 5
)

// entry is one line of the timeline.
type entry struct {
	at      time.Time
	Time    string   `json:"time"`
	ISO     string   `json:"iso"`
	Service string   `json:"service"`
	Kind    string   `json:"kind"`
	What    string   `json:"what"`
	Details []string `json:"details,omitempty"`
}

// sourceNote says how one source of the timeline fared.
type sourceNote struct {
	Name    string `json:"name"`
	Service string `json:"service"`
	// Shown: the entries it contributed.
	Shown int `json:"shown"`
	// LoginNeeded: not read, it needs the operator token.
	LoginNeeded bool   `json:"login_needed,omitempty"`
	Error       string `json:"error,omitempty"`
	Note        string `json:"note,omitempty"`
}

// Source names, in the order ties in time keep.
const (
	srcHistory  = "Status history"
	srcOutbox   = "Outbox events"
	srcProvider = "Provider job and messages"
	srcInbox    = "Inbox entries"
	srcBilling  = "Invoice job"
	srcInvoice  = "Invoice"
)

func stamp(t *timestamppb.Timestamp) (time.Time, string, string) {
	if t == nil {
		return time.Time{}, "", ""
	}
	at := t.AsTime().UTC()
	return at, at.Format("2006-01-02 15:04:05.000Z"), at.Format(time.RFC3339Nano)
}

func newEntry(t *timestamppb.Timestamp, service, kind, what string, details ...string) entry {
	at, s, iso := stamp(t)
	var ds []string
	for _, d := range details {
		if d != "" {
			ds = append(ds, d)
		}
	}
	return entry{at: at, Time: s, ISO: iso, Service: service, Kind: kind, What: what, Details: ds}
}

// when is "label time" or "" without a time.
func when(label string, t *timestamppb.Timestamp) string {
	if _, s, _ := stamp(t); s != "" {
		return label + " " + s
	}
	return ""
}

func unless(cond bool, s string) string {
	if cond {
		return ""
	}
	return s
}

// shortType is "WorkOrderHandOffRequested" for
// "lossless.events.v1.WorkOrderHandOffRequested".
func shortType(t string) string { return t[strings.LastIndex(t, ".")+1:] }

func i64(n int64) string { return itoa(int(n)) }

// collected is one source's share of the timeline.
type collected struct {
	note    sourceNote
	entries []entry
}

// timeline reads every source of order o concurrently, each bounded by ctx,
// and merges them by time.
// The order's own reads (its history, its invoice) come in as read for the
// rest of the page.
func (h *Handler) timeline(ctx context.Context, s session, o *workorderv1.WorkOrder, hist []*workorderv1.StatusTransition,
	histErr error, inv *billingv1.Invoice, invErr error,
) ([]entry, []sourceNote) {
	id := o.GetId()
	parts := make([]collected, 6)
	parts[0] = historyPart(hist, histErr)
	parts[5] = invoicePart(o.GetInvoiceId(), inv, invErr)
	var wg sync.WaitGroup
	run := func(i int, name, service string, operator bool, fn func(*collected)) {
		parts[i].note = sourceNote{Name: name, Service: service}
		if operator && !s.LoggedIn {
			parts[i].note.LoginNeeded = true
			return
		}
		wg.Go(func() { fn(&parts[i]) })
	}
	run(1, srcOutbox, "workorder", true, func(c *collected) { h.outboxPart(ctx, id, c) })
	// The inbox entries are found by the provider's event ids: one reader
	// for both.
	parts[3].note = sourceNote{Name: srcInbox, Service: "workorder"}
	run(2, srcProvider, "provider-sim", true, func(c *collected) { h.providerPart(ctx, id, c, &parts[3]) })
	if !s.LoggedIn {
		parts[3].note.LoginNeeded = true
	}
	run(4, srcBilling, "billing", true, func(c *collected) { h.invoiceJobPart(ctx, id, c) })
	wg.Wait()

	var all []entry
	notes := make([]sourceNote, 0, len(parts))
	for _, p := range parts {
		p.note.Shown = len(p.entries)
		notes = append(notes, p.note)
		all = append(all, p.entries...)
	}
	// Stable: entries of one instant keep the sources' causal order above.
	slices.SortStableFunc(all, func(a, b entry) int { return a.at.Compare(b.at) })
	return all, notes
}

func historyPart(hist []*workorderv1.StatusTransition, err error) collected {
	c := collected{note: sourceNote{Name: srcHistory, Service: "workorder"}}
	if err != nil {
		c.note.Error = describe("workorder", err)
	}
	for _, t := range hist {
		c.entries = append(c.entries, newEntry(t.GetTime(), "workorder", "status",
			"Status "+statusName(t.GetToStatus()), "from "+statusName(t.GetFromStatus()), t.GetCause()))
	}
	return c
}

func (h *Handler) outboxPart(ctx context.Context, id string, c *collected) {
	req := &opsv1.ListOutboxEventsRequest{AggregateId: id, States: []string{"PENDING", "FAILED", "PUBLISHED"},
		PageSize: timelineOutboxPage}
	for range timelineOutboxPages {
		resp, err := h.src.Outbox.ListOutboxEvents(ctx, req)
		if err != nil {
			c.note.Error = describe("workorder", err)
			return
		}
		for _, e := range resp.GetEvents() {
			c.entries = append(c.entries, newEntry(e.GetCreateTime(), "workorder", "outbox",
				"Outbox event "+shortType(e.GetEventType())+" "+e.GetState(),
				"state "+e.GetState(), "attempts "+itoa(int(e.GetAttempts())), when("published", e.GetPublishTime()),
				unless(e.GetLeaseOwner() == "", "lease owner "+e.GetLeaseOwner()), when("lease until", e.GetLeaseExpireTime()),
				unless(e.GetLastError() == "", "last error: "+e.GetLastError()),
				unless(e.GetState() == "PUBLISHED", when("next attempt", e.GetNextAttemptTime())),
				"event id "+e.GetEventId()))
		}
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			return
		}
	}
	c.note.Note = "only the first " + itoa(timelineOutboxPage*timelineOutboxPages) + " events are shown"
}

func (h *Handler) providerPart(ctx context.Context, id string, c, inbox *collected) {
	list, err := h.src.ProviderJobs.ListJobs(ctx, &providerv1.ListJobsRequest{WorkOrderId: id})
	if err != nil {
		c.note.Error = describe("provider-sim", err)
		inbox.note.Note = "not read: the provider's event ids are unknown"
		return
	}
	if len(list.GetJobs()) == 0 {
		c.note.Note = "the provider has no job for this order (not handed off yet)"
		inbox.note.Note = "nothing from the provider yet"
		return
	}
	got, err := h.src.ProviderJobs.GetJob(ctx, &providerv1.GetJobRequest{JobId: list.GetJobs()[0].GetJobId()})
	if err != nil {
		c.note.Error = describe("provider-sim", err)
		inbox.note.Note = "not read: the provider's event ids are unknown"
		return
	}
	j, f := got.GetJob(), got.GetJob().GetFaults()
	var faults []string
	if f.GetDuplicate() {
		faults = append(faults, "duplicate")
	}
	if f.GetEarlyCompletion() {
		faults = append(faults, "early completion")
	}
	if f.GetSplitFirstItems() > 0 {
		faults = append(faults, "split after "+itoa(int(f.GetSplitFirstItems()))+" items")
	}
	if f.GetPoison() != "" {
		faults = append(faults, "poison ("+f.GetPoison()+")")
	}
	if f.GetUnknownOrder() {
		faults = append(faults, "unknown order")
	}
	if f.GetPublishThenCrashPending() {
		faults = append(faults, "publish then crash (pending)")
	}
	c.entries = append(c.entries, newEntry(j.GetAcceptTime(), "provider-sim", "provider-job", "Provider job "+j.GetState(),
		"state "+j.GetState(), "epoch "+i64(j.GetLeaseEpoch()), unless(j.GetLeaseOwner() == "", "lease owner "+j.GetLeaseOwner()),
		when("lease until", j.GetLeaseExpireTime()), unless(j.GetAttempts() == 0, "failed attempts "+itoa(int(j.GetAttempts()))),
		unless(j.GetLastError() == "", "last error: "+j.GetLastError()),
		unless(len(faults) == 0, "faults: "+strings.Join(faults, ", ")),
		when("started", j.GetStartTime()), when("completed", j.GetCompleteTime()), "job id "+j.GetJobId()))
	var events []string
	for _, m := range got.GetMessages() {
		what := "Provider message " + m.GetKind()
		if m.GetCopies() > 1 {
			what += ", duplicated"
		}
		published := "not published yet"
		if m.GetPublishTime() != nil {
			published = "published " + itoa(int(m.GetPublishCount())) + "× (" + itoa(int(m.GetCopies())) + " per publish)"
		}
		// Stamped when recorded, before the publish: the inbox receives a
		// message before its publish is recorded.
		c.entries = append(c.entries, newEntry(m.GetOccurTime(), "provider-sim", "provider-message", what,
			published, unless(m.GetOrderingKey() == id, "about work order "+m.GetOrderingKey()),
			shortType(m.GetEventType()), "event id "+m.GetEventId()))
		events = append(events, m.GetEventId())
	}
	if len(events) == 0 {
		inbox.note.Note = "nothing from the provider yet"
		return
	}
	h.inboxPart(ctx, events, inbox)
}

// inboxPart lists the inbox entries of the provider's messages. Poison
// without a readable event id is keyed by its Pub/Sub message id instead:
// the Repair page lists it.
func (h *Handler) inboxPart(ctx context.Context, events []string, c *collected) {
	resp, err := h.src.Inbox.ListInboxEntries(ctx, &opsv1.ListInboxEntriesRequest{EventIds: events, PageSize: int32(len(events))})
	if err != nil {
		c.note.Error = describe("workorder", err)
		return
	}
	for _, e := range resp.GetEntries() {
		c.entries = append(c.entries, newEntry(e.GetReceivedTime(), "workorder", "inbox", "Inbox entry "+e.GetStatus(),
			"status "+e.GetStatus(), "attempts "+itoa(int(e.GetAttempts())), when("processed", e.GetProcessedTime()),
			unless(e.GetParkReason() == "", "park reason "+e.GetParkReason()),
			unless(e.GetLastError() == "", "last error: "+e.GetLastError()),
			shortType(e.GetEventType()), "event id "+e.GetEventId()))
	}
}

func (h *Handler) invoiceJobPart(ctx context.Context, id string, c *collected) {
	resp, err := h.src.InvoiceJobs.ListJobs(ctx, &opsv1.ListJobsRequest{UniqueKey: id})
	if err != nil {
		c.note.Error = describe("billing", err)
		return
	}
	if len(resp.GetJobs()) == 0 {
		c.note.Note = "billing has no invoice job for this order (not completed yet)"
	}
	for _, j := range resp.GetJobs() {
		c.entries = append(c.entries, newEntry(j.GetCreateTime(), "billing", "billing-job", "Invoice job "+j.GetState(),
			"state "+j.GetState(), "epoch "+i64(j.GetEpoch()),
			"attempts "+itoa(int(j.GetAttempts()))+" of "+itoa(int(j.GetMaxAttempts())),
			unless(j.GetLeaseOwner() == "", "lease owner "+j.GetLeaseOwner()),
			unless(j.GetState() != "running" && j.GetState() != "available", when("due", j.GetDueTime())),
			unless(j.GetLastError() == "", "last error: "+j.GetLastError()), when("finished", j.GetFinishTime())))
	}
}

func invoicePart(id string, inv *billingv1.Invoice, err error) collected {
	c := collected{note: sourceNote{Name: srcInvoice, Service: "billing"}}
	switch {
	case err != nil:
		c.note.Error = describe("billing", err)
	case id == "":
		c.note.Note = "no invoice yet"
	default:
		c.entries = append(c.entries, newEntry(inv.GetIssueTime(), "billing", "invoice", "Invoice "+inv.GetNumber()+" issued",
			"total "+money(inv.GetTotal().GetMinorUnits(), inv.GetTotal().GetCurrencyCode()),
			itoa(len(inv.GetLines()))+" lines", "invoice id "+inv.GetId()))
	}
	return c
}
