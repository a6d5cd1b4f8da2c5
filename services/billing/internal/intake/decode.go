package intake

import (
	"buf.build/go/protovalidate"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/pkg/dedup"
	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/billing/internal/issuer"
)

// MaxEventIDLength is the longest event id the dedup marker stores.
const MaxEventIDLength = dedup.MaxEventIDLength

// verdict is what the decoder decided about one message before any database
// work: consume ev (outcome ""), or park the message with reason under
// outcome (OutcomeParked or OutcomeUnknownType).
type verdict struct {
	ev      *eventsv1.WorkOrderCompletionRecorded // nil when the payload was not parsed
	outcome string
	reason  string
}

// parkedMessage is m as pkg/parked keeps it, parked from subscription with
// v's reason.
func parkedMessage(subscription string, m *pubsub.Received, v verdict) parked.Message {
	return envelope.Parked(subscription, m, v.ev, v.ev.GetWorkOrderId(), v.reason)
}

// decoder turns a message into a verdict: the rules of every event message
// (pkg/envelope), then validate's. It is pure and never touches the
// database.
type decoder struct {
	validator       protovalidate.Validator
	maxPayloadBytes int
}

func (d decoder) decode(m *pubsub.Received) verdict {
	v := envelope.Decode(m, envelope.Config{EventType: EventType, MaxPayloadBytes: d.maxPayloadBytes,
		MaxEventIDLength: MaxEventIDLength}, d.validate)
	return verdict{ev: v.Event, outcome: v.Outcome(OutcomeParked, OutcomeUnknownType), reason: v.Reason()}
}

// validate returns why ev cannot be invoiced: the rules of its proto
// (protovalidate), and what the worker needs to build the invoice.
func (d decoder) validate(ev *eventsv1.WorkOrderCompletionRecorded) []string {
	var reasons []string
	if err := d.validator.Validate(ev); err != nil {
		reasons = append(reasons, err.Error())
	}
	if _, err := issuer.OrderFromEvent(ev); err != nil {
		reasons = append(reasons, err.Error())
	}
	return reasons
}
