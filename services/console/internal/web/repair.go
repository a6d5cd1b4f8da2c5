package web

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
)

// repairPageSize bounds the parked entries listed (and replayable) at once.
const repairPageSize = 200

type repairData struct {
	Reason   string
	Reasons  []reasonCount
	Entries  []*opsv1.InboxEntry
	Ticket   string
	Actor    string
	Result   *replayResult
	NeedsLog bool

	// The other sections (repairs.go); a section whose service is
	// unreachable shows its error, the others still render.
	Parked        []parkedSection
	DeadJobs      []*opsv1.Job
	FailedOutbox  []outboxSection
	DeadLetters   []deadLetterSource
	SectionErrors map[string]string
	Action        *actionResult
	RunbookBase   string
}

type reasonCount struct {
	Reason string
	Count  float64
}

type replayResult struct {
	DryRun bool
	IDs    []int64
}

func (h *Handler) repairData(ctx context.Context, s session, reason string) (repairData, string) {
	d := repairData{Reason: reason, Actor: s.Principal, DeadLetters: deadLetterSources, RunbookBase: h.cfg.RunbookBaseURL}
	if f, err := h.src.Figures.Read(ctx); err == nil {
		for r, n := range f.ParkedInbox {
			d.Reasons = append(d.Reasons, reasonCount{r, n})
		}
		slices.SortFunc(d.Reasons, func(a, b reasonCount) int { return strings.Compare(a.Reason, b.Reason) })
	}
	if !s.LoggedIn {
		d.NeedsLog = true
		return d, ""
	}
	ctx, cancel := context.WithTimeout(outgoing(ctx, s), h.cfg.RPCTimeout)
	defer cancel()
	h.repairSections(ctx, &d)
	resp, err := h.src.Inbox.ListInboxEntries(ctx, &opsv1.ListInboxEntriesRequest{Status: "PARKED", Reason: reason, PageSize: repairPageSize})
	if err != nil {
		return d, describe("workorder", err)
	}
	d.Entries = resp.GetEntries()
	return d, ""
}

// repairPage lists parked entries; the admin API needs the token for reads
// too, so without login it shows only the counts from /metrics.
func (h *Handler) repairPage(w http.ResponseWriter, r *http.Request) {
	d, errMsg := h.repairData(r.Context(), sessionOf(r), r.URL.Query().Get("reason"))
	h.render(w, r, "repair", page{Title: "Repair", Error: errMsg, Data: d})
}

// replay runs ReplayInboxEntries. A dry run takes the selected ids or, when
// none is selected, every entry of the reason; a real replay only takes
// explicit ids, which the dry run's confirmation form carries: what is
// replayed is exactly what the dry run showed.
func (h *Handler) replay(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, "400 bad form", http.StatusBadRequest)
		return
	}
	s := sessionOf(r)
	reason := r.PostForm.Get("reason")
	d, errMsg := h.repairData(r.Context(), s, reason)
	// The actor is the session's principal, never a form field.
	d.Ticket, d.Actor = strings.TrimSpace(r.PostForm.Get("ticket")), s.Principal
	dry := r.PostForm.Get("mode") != "replay"
	var ids []int64
	for _, v := range r.PostForm["id"] {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			errMsg = fmt.Sprintf("not an inbox entry id: %q", v)
			break
		}
		ids = append(ids, id)
	}
	switch {
	case errMsg != "":
	case d.Ticket == "" || d.Actor == "":
		errMsg = "A ticket is required: every replay, dry runs too, is audited with it and your name."
	case !dry && len(ids) == 0:
		errMsg = "A replay takes the entries a dry run listed: run the dry run first."
	case len(ids) > repairPageSize:
		errMsg = fmt.Sprintf("At most %d entries at once.", repairPageSize)
	}
	if errMsg != "" {
		w.WriteHeader(http.StatusBadRequest)
		h.render(w, r, "repair", page{Title: "Repair", Error: errMsg, Data: d})
		return
	}
	req := &opsv1.ReplayInboxEntriesRequest{
		Authorization: &opsv1.OperatorAuthorization{Ticket: d.Ticket, Actor: d.Actor},
		Ids:           ids, Reason: reason, DryRun: dry,
	}
	if len(ids) == 0 {
		// Every entry of the reason (or every parked one): the API takes a
		// time range when no id is given.
		req.Ids = nil
		for _, e := range d.Entries {
			req.Ids = append(req.Ids, e.GetId())
		}
	}
	ctx, cancel := context.WithTimeout(outgoing(r.Context(), s), h.cfg.RPCTimeout)
	defer cancel()
	resp, err := h.src.Inbox.ReplayInboxEntries(ctx, req)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		h.render(w, r, "repair", page{Title: "Repair", Error: describe("workorder", err), Data: d})
		return
	}
	h.logger.InfoContext(r.Context(), "console: inbox replay", "dry_run", dry, "entries", len(resp.GetIds()))
	d.Result = &replayResult{DryRun: resp.GetDryRun(), IDs: resp.GetIds()}
	if !dry {
		d, _ = h.repairData(r.Context(), s, reason)
		d.Result = &replayResult{DryRun: false, IDs: resp.GetIds()}
	}
	h.render(w, r, "repair", page{Title: "Repair", Data: d})
}
