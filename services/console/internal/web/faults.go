package web

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
)

// knob describes one provider-sim fault knob (services/provider-sim/internal/faults,
// docs/failure-modes.md).
type knob struct {
	Field, Label, Kind, Explain, Mode string
	get                               func(*providerv1.Faults) string
	set                               func(*providerv1.Faults, string) error
}

func rateKnob(field, label, explain, mode string, get func(*providerv1.Faults) float64, set func(*providerv1.Faults, float64)) knob {
	return knob{Field: field, Label: label, Kind: "rate", Explain: explain, Mode: mode,
		get: func(f *providerv1.Faults) string { return strconv.FormatFloat(get(f), 'g', -1, 64) },
		set: func(f *providerv1.Faults, s string) error {
			v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil || v < 0 || v > 1 {
				return fmt.Errorf("%s: want a probability from 0 to 1, got %q", label, s)
			}
			set(f, v)
			return nil
		}}
}

func durationKnob(field, label, explain, mode string, get func(*providerv1.Faults) *durationpb.Duration, set func(*providerv1.Faults, *durationpb.Duration)) knob {
	return knob{Field: field, Label: label, Kind: "duration", Explain: explain, Mode: mode,
		get: func(f *providerv1.Faults) string { return get(f).AsDuration().String() },
		set: func(f *providerv1.Faults, s string) error {
			s = strings.TrimSpace(s)
			if s == "" {
				s = "0s"
			}
			d, err := time.ParseDuration(s)
			if err != nil || d < 0 {
				return fmt.Errorf("%s: want a duration such as 250ms or 2s, got %q", label, s)
			}
			set(f, durationpb.New(d))
			return nil
		}}
}

var knobs = []knob{
	rateKnob("duplicate", "Duplicate", "Each completion is published twice with the same event_id.", "F4, F6",
		(*providerv1.Faults).GetDuplicate, func(f *providerv1.Faults, v float64) { f.Duplicate = v }),
	rateKnob("early_completion", "Early completion", "The completion is on the topic before SubmitWorkOrder returns.", "F5",
		(*providerv1.Faults).GetEarlyCompletion, func(f *providerv1.Faults, v float64) { f.EarlyCompletion = v }),
	rateKnob("split_completion", "Split completion", "Two completions with distinct event_ids whose items sum to the positions.", "F14",
		(*providerv1.Faults).GetSplitCompletion, func(f *providerv1.Faults, v float64) { f.SplitCompletion = v }),
	rateKnob("poison", "Poison", "An unparseable or schema-invalid message precedes the completion.", "F9",
		(*providerv1.Faults).GetPoison, func(f *providerv1.Faults, v float64) { f.Poison = v }),
	rateKnob("unknown_order", "Unknown order", "A completion for a work order that does not exist precedes the real one.", "F8",
		(*providerv1.Faults).GetUnknownOrder, func(f *providerv1.Faults, v float64) { f.UnknownOrder = v }),
	rateKnob("publish_then_crash", "Publish then crash", "The provider exits after publishing, before recording it; the restart republishes the same event_id.", "F2",
		(*providerv1.Faults).GetPublishThenCrash, func(f *providerv1.Faults, v float64) { f.PublishThenCrash = v }),
	rateKnob("accept_timeout", "Accept timeout", "SubmitWorkOrder records the job and never answers; the caller's outbox retries and finds the job.", "lost answer after acceptance",
		(*providerv1.Faults).GetAcceptTimeout, func(f *providerv1.Faults, v float64) { f.AcceptTimeout = v }),
	durationKnob("extra_delay", "Extra delay", "Added to every execution, widening the window for crashes and early completions.", "helper",
		(*providerv1.Faults).GetExtraDelay, func(f *providerv1.Faults, d *durationpb.Duration) { f.ExtraDelay = d }),
	durationKnob("accept_latency_p50", "Accept latency p50", "Median delay of every SubmitWorkOrder answer (lognormal with the p99).", "slow provider",
		(*providerv1.Faults).GetAcceptLatencyP50, func(f *providerv1.Faults, d *durationpb.Duration) { f.AcceptLatencyP50 = d }),
	durationKnob("accept_latency_p99", "Accept latency p99", "99th percentile of that delay; not below the p50.", "slow provider",
		(*providerv1.Faults).GetAcceptLatencyP99, func(f *providerv1.Faults, d *durationpb.Duration) { f.AcceptLatencyP99 = d }),
	{Field: "seed", Label: "Seed", Kind: "int", Explain: "Seed of the fault generator; 0 seeds from the clock. A change reseeds.", Mode: "reproducible runs",
		get: func(f *providerv1.Faults) string { return strconv.FormatInt(f.GetSeed(), 10) },
		set: func(f *providerv1.Faults, s string) error {
			v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil {
				return fmt.Errorf("seed: want an integer, got %q", s)
			}
			f.Seed = v
			return nil
		}},
}

// knobView is a knob with its current value, for the template.
type knobView struct {
	knob
	Value string
}

type faultsData struct {
	Knobs   []knobView
	DemoMax int
	Ticket  string
}

// demoMax bounds "run the demo": each order is one CreateWorkOrder call
// made while the operator's request waits.
const demoMax = 200

func (h *Handler) faultsPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.RPCTimeout)
	defer cancel()
	var p page
	resp, err := h.src.Faults.GetFaults(ctx, &providerv1.GetFaultsRequest{})
	if err != nil {
		p.Error = describe("provider-sim", err)
	}
	p.Title, p.Data = "Faults", h.faultsView(resp.GetFaults(), nil)
	switch r.URL.Query().Get("done") {
	case "updated":
		p.Flash = "Fault knobs updated."
	case "demo":
		p.Flash = "Demo orders created: " + r.URL.Query().Get("n") + "."
	}
	h.render(w, r, "faults", p)
}

func (h *Handler) faultsView(f *providerv1.Faults, form map[string]string) faultsData {
	d := faultsData{DemoMax: demoMax}
	for _, k := range knobs {
		v := k.get(f)
		if s, ok := form[k.Field]; ok {
			v = s
		}
		d.Knobs = append(d.Knobs, knobView{knob: k, Value: v})
	}
	return d
}

// updateFaults replaces every knob, as UpdateFaults does. Like a repair it
// needs a ticket: provider-sim records the change in its operator_audit
// (action faults.update, the knobs before and after) with the ticket and
// the session's principal as actor, before the change is in force, and
// refuses the change when it cannot record it. The Audit page lists those
// rows (service provider-sim). The log line adds what the row does not
// have: the operator's address.
func (h *Handler) updateFaults(w http.ResponseWriter, r *http.Request) {
	f := &providerv1.Faults{}
	form := map[string]string{}
	var problems []string
	ticket, actor := strings.TrimSpace(r.PostFormValue("ticket")), sessionOf(r).Principal
	if err := operator.ValidateAuthorization(ticket, actor); err != nil {
		problems = append(problems, "Ticket: "+err.Error()+"; every change of the knobs is audited with it and your name.")
	}
	for _, k := range knobs {
		form[k.Field] = r.PostFormValue(k.Field)
		if err := k.set(f, form[k.Field]); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) == 0 {
		ctx, cancel := context.WithTimeout(outgoing(r.Context(), sessionOf(r)), h.cfg.RPCTimeout)
		defer cancel()
		if _, err := h.src.Faults.UpdateFaults(ctx, &providerv1.UpdateFaultsRequest{Faults: f,
			Authorization: &opsv1.OperatorAuthorization{Ticket: ticket, Actor: actor}}); err != nil {
			problems = append(problems, describe("provider-sim", err))
		}
	}
	if len(problems) > 0 {
		w.WriteHeader(http.StatusBadRequest)
		h.render(w, r, "faults", page{Title: "Faults", Error: strings.Join(problems, " "), Data: h.faultsViewTicket(f, form, ticket)})
		return
	}
	h.logger.InfoContext(r.Context(), "console: fault knobs changed", "action", "faults.update", "actor", actor,
		"ticket", ticket, "peer", peerAddr(r))
	http.Redirect(w, r, "/faults?done=updated", http.StatusSeeOther)
}

func (h *Handler) faultsViewTicket(f *providerv1.Faults, form map[string]string, ticket string) faultsData {
	d := h.faultsView(f, form)
	d.Ticket = ticket
	return d
}

// DemoCustomer is the customer of the orders "run the demo" creates.
const DemoCustomer = "console-demo"

// runDemo creates N orders through the workorder API.
func (h *Handler) runDemo(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.Atoi(r.PostFormValue("orders"))
	if err != nil || n < 1 || n > demoMax {
		w.WriteHeader(http.StatusBadRequest)
		h.render(w, r, "faults", page{Title: "Faults", Error: fmt.Sprintf("Orders: want a number from 1 to %d.", demoMax),
			Data: h.faultsView(nil, nil)})
		return
	}
	created := 0
	for i := range n {
		ctx, cancel := context.WithTimeout(outgoing(r.Context(), sessionOf(r)), h.cfg.RPCTimeout)
		_, err := h.src.Orders.CreateWorkOrder(ctx, &workorderv1.CreateWorkOrderRequest{WorkOrder: &workorderv1.WorkOrder{
			CustomerId: DemoCustomer, Description: "order created by the console's demo", Positions: int32(i%5 + 1),
			UnitPrice: &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 1250}}})
		cancel()
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			h.render(w, r, "faults", page{Title: "Faults", Error: fmt.Sprintf("Created %d of %d orders, then %s", created, n, describe("workorder", err)),
				Data: h.faultsView(nil, nil)})
			return
		}
		created++
	}
	h.logger.InfoContext(r.Context(), "console: demo orders created", "orders", created)
	http.Redirect(w, r, "/faults?done=demo&n="+strconv.Itoa(created), http.StatusSeeOther)
}
