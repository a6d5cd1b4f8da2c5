package invoicing

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgtext"
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
// v's reason. parked.Store.Park makes every value storable.
func parkedMessage(subscription string, m *pubsub.Received, v verdict) parked.Message {
	return parked.Message{Subscription: subscription, MessageID: m.ID, EventID: v.ev.GetEventId(),
		EventType: m.Attributes[pubsub.AttrEventType], Subject: v.ev.GetWorkOrderId(),
		Attributes: m.Attributes, Data: m.Data, Reason: v.reason}
}

// decoder turns a message into a verdict. It is pure and rejects whatever
// the database would reject, so that such a message is parked with the rule
// it broke instead of failing a statement.
type decoder struct {
	maxPayloadBytes int
}

func (d decoder) decode(m *pubsub.Received) verdict {
	switch t := m.Attributes[pubsub.AttrEventType]; {
	case t == "":
		return verdict{outcome: OutcomeParked, reason: "missing attribute " + pubsub.AttrEventType}
	case t != EventType:
		return verdict{outcome: OutcomeUnknownType,
			reason: fmt.Sprintf("unknown event type %q (this consumer reads %s)", t, EventType)}
	}
	reasons := pgtext.MapProblems(m.Attributes)
	park := func(ev *eventsv1.InvoiceIssued, reason ...string) verdict {
		return verdict{ev: ev, outcome: OutcomeParked, reason: strings.Join(append(reasons, reason...), "; ")}
	}
	if len(m.Data) > d.maxPayloadBytes {
		return park(nil, fmt.Sprintf("payload %d bytes exceeds the cap of %d bytes", len(m.Data), d.maxPayloadBytes))
	}
	if v := m.Attributes[pubsub.AttrSchemaVersion]; v != "" && v != "1" {
		return park(nil, "unsupported schema_version "+pgtext.Storable(v)+" (this consumer reads 1)")
	}
	var ev eventsv1.InvoiceIssued
	if err := proto.Unmarshal(m.Data, &ev); err != nil {
		return park(nil, "unparseable payload: "+err.Error())
	}
	reasons = append(reasons, pgtext.MessageProblems(ev.ProtoReflect())...)
	switch id := ev.GetEventId(); {
	case id == "":
		reasons = append(reasons, "event_id: missing")
	case utf8.RuneCountInString(id) > MaxEventIDLength:
		reasons = append(reasons, fmt.Sprintf("event_id: %d characters, limit %d", utf8.RuneCountInString(id), MaxEventIDLength))
	case m.Attributes[pubsub.AttrEventID] != "" && m.Attributes[pubsub.AttrEventID] != id:
		reasons = append(reasons, fmt.Sprintf("event_id %q differs from attribute event_id %q", id, m.Attributes[pubsub.AttrEventID]))
	}
	if _, err := uuid.Parse(ev.GetWorkOrderId()); err != nil {
		reasons = append(reasons, "work_order_id: not a uuid")
	}
	if _, err := uuid.Parse(ev.GetInvoiceId()); err != nil {
		reasons = append(reasons, "invoice_id: not a uuid")
	}
	if ev.GetInvoiceNumber() == "" {
		reasons = append(reasons, "invoice_number: missing")
	}
	if len(reasons) > 0 {
		return park(&ev)
	}
	return verdict{ev: &ev}
}
