package invoicing

import (
	"github.com/google/uuid"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// decode turns a message into a verdict: the rules of every event message
// (pkg/envelope, within env's limits), then those apply relies on. It is
// pure and never touches the database.
func decode(m *pubsub.Received, env envelope.Config) envelope.Verdict[*eventsv1.InvoiceIssued] {
	return envelope.Decode(m, env, applicable)
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
