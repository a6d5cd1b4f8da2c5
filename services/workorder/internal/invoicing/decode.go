package invoicing

import (
	"github.com/google/uuid"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// verdict is what the decoder decided about one message before any database
// work: apply ev (outcome ""), or park the message with reason under outcome
// (OutcomeParked or OutcomeUnknownType).
type verdict struct {
	ev      *eventsv1.InvoiceIssued // nil when the payload was not parsed
	outcome string
	reason  string
}

// parkedMessage is m as pkg/parked keeps it, parked from subscription with
// v's reason.
func parkedMessage(subscription string, m *pubsub.Received, v verdict) parked.Message {
	return envelope.Parked(subscription, m, v.ev, v.ev.GetWorkOrderId(), v.reason)
}

// decoder turns a message into a verdict: the rules of every event message
// (pkg/envelope), then those apply relies on. It is pure and never touches
// the database.
type decoder struct {
	maxPayloadBytes int
}

func (d decoder) decode(m *pubsub.Received) verdict {
	v := envelope.Decode(m, envelope.Config{EventType: EventType, MaxPayloadBytes: d.maxPayloadBytes,
		MaxEventIDLength: MaxEventIDLength}, applicable)
	return verdict{ev: v.Event, outcome: v.Outcome(OutcomeParked, OutcomeUnknownType), reason: v.Reason()}
}

// applicable returns why apply cannot apply ev: it parses both ids
// (uuid.MustParse) and records the invoice number.
func applicable(ev *eventsv1.InvoiceIssued) []string {
	var reasons []string
	if _, err := uuid.Parse(ev.GetWorkOrderId()); err != nil {
		reasons = append(reasons, "work_order_id: not a uuid")
	}
	if _, err := uuid.Parse(ev.GetInvoiceId()); err != nil {
		reasons = append(reasons, "invoice_id: not a uuid")
	}
	if ev.GetInvoiceNumber() == "" {
		reasons = append(reasons, "invoice_number: missing")
	}
	return reasons
}
