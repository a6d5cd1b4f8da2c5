package intake

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/billing/internal/issuer"
)

// MaxEventIDLength is processed_events.event_id's CHECK limit, in characters
// (migrations/billing).
const MaxEventIDLength = 200

// verdict is what the decoder decided about one message before any database
// work: consume ev (outcome ""), or park the message with reason under
// outcome (OutcomeParked or OutcomeUnknownType).
type verdict struct {
	ev      *eventsv1.WorkOrderCompletionRecorded // nil when the payload was not parsed
	outcome string
	reason  string
}

// parkedMessage is m as pkg/parked keeps it, parked from subscription with
// v's reason. parked.Store.Park makes every value storable.
func parkedMessage(subscription string, m *pubsub.Received, v verdict) parked.Message {
	return parked.Message{Subscription: subscription, MessageID: m.ID, EventID: v.ev.GetEventId(),
		EventType: m.Attributes[pubsub.AttrEventType], Subject: v.ev.GetWorkOrderId(),
		Attributes: m.Attributes, Data: m.Data, Reason: v.reason}
}

// decoder turns a message into a verdict. It is pure: the same message gets
// the same verdict, and it never touches the database. It rejects whatever
// the database would reject, so that such a message is parked with the rule
// it broke instead of failing a statement.
type decoder struct {
	validator       protovalidate.Validator
	maxPayloadBytes int
}

func (d decoder) decode(m *pubsub.Received) verdict {
	eventType := m.Attributes[pubsub.AttrEventType]
	switch {
	case eventType == "":
		return verdict{outcome: OutcomeParked, reason: "missing attribute " + pubsub.AttrEventType}
	case eventType != EventType:
		return verdict{outcome: OutcomeUnknownType,
			reason: fmt.Sprintf("unknown event type %q (this consumer reads %s)", eventType, EventType)}
	}
	reasons := pgtext.MapProblems(m.Attributes)
	park := func(ev *eventsv1.WorkOrderCompletionRecorded, reason ...string) verdict {
		return verdict{ev: ev, outcome: OutcomeParked, reason: strings.Join(append(reasons, reason...), "; ")}
	}
	if len(m.Data) > d.maxPayloadBytes {
		return park(nil, fmt.Sprintf("payload %d bytes exceeds the cap of %d bytes", len(m.Data), d.maxPayloadBytes))
	}
	if v := m.Attributes[pubsub.AttrSchemaVersion]; v != "" && v != "1" {
		return park(nil, "unsupported schema_version "+pgtext.Storable(v)+" (this consumer reads 1)")
	}
	var ev eventsv1.WorkOrderCompletionRecorded
	if err := proto.Unmarshal(m.Data, &ev); err != nil {
		return park(nil, "unparseable payload: "+err.Error())
	}
	reasons = append(reasons, d.validate(&ev, m.Attributes[pubsub.AttrEventID])...)
	if len(reasons) > 0 {
		return park(&ev)
	}
	return verdict{ev: &ev}
}

// validate returns why ev cannot be invoiced.
func (d decoder) validate(ev *eventsv1.WorkOrderCompletionRecorded, attrEventID string) []string {
	reasons := pgtext.MessageProblems(ev.ProtoReflect())
	switch id := ev.GetEventId(); {
	case id == "":
		reasons = append(reasons, "event_id: missing")
	case utf8.RuneCountInString(id) > MaxEventIDLength:
		reasons = append(reasons, fmt.Sprintf("event_id: %d characters, limit %d", utf8.RuneCountInString(id), MaxEventIDLength))
	case attrEventID != "" && attrEventID != id:
		reasons = append(reasons, fmt.Sprintf("event_id %q differs from attribute event_id %q", id, attrEventID))
	}
	if err := d.validator.Validate(ev); err != nil {
		reasons = append(reasons, err.Error())
	}
	if _, err := issuer.OrderFromEvent(ev); err != nil {
		reasons = append(reasons, err.Error())
	}
	return reasons
}
