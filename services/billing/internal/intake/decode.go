package intake

import (
	"buf.build/go/protovalidate"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/billing/internal/issuer"
)

// MaxEventIDLength is the longest event id the marker stores.
const MaxEventIDLength = consumer.MaxEventIDLength

// decoder turns a message into a verdict: the rules of every event message
// (pkg/envelope, within env's limits), then validate's. It is pure and never
// touches the database.
type decoder struct {
	validator protovalidate.Validator
}

func (d decoder) decode(m *pubsub.Received, env envelope.Config) envelope.Verdict[*eventsv1.WorkOrderCompletionRecorded] {
	return envelope.Decode(m, env, d.validate)
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
