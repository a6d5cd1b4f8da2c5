package invoicing

import (
	"testing"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// FuzzDecode: for any payload and attributes, a message decode accepts is
// one apply can apply (both ids parse, as uuid.MustParse requires; an
// invoice number), and the outcome agrees with the reason. The envelope's
// rules are pkg/envelope's FuzzDecode. Seeds: testdata/fuzz/FuzzDecode (NUL
// event id, NUL attribute, invalid UTF-8, 201-character event id, oversize,
// unknown type, and a valid event).
func FuzzDecode(f *testing.F) {
	env := envelope.Config{EventType: EventType, MaxPayloadBytes: 1024, MaxEventIDLength: MaxEventIDLength}
	f.Fuzz(func(t *testing.T, data []byte, messageID, eventType, attrEventID, attrKey, attrValue string) {
		m := &pubsub.Received{ID: messageID, Data: data,
			Attributes: map[string]string{pubsub.AttrEventType: eventType, pubsub.AttrEventID: attrEventID}}
		if attrKey != "" {
			m.Attributes[attrKey] = attrValue
		}
		v := decode(m, env)
		outcome, reason := v.Outcome(OutcomeParked, OutcomeUnknownType), v.Reason()
		if (outcome == "") != (reason == "") {
			t.Fatalf("outcome %q with reason %q", outcome, reason)
		}
		if outcome != "" {
			return
		}
		if _, err := uuid.Parse(v.Event.GetWorkOrderId()); err != nil {
			t.Fatalf("accepted work_order_id %q", v.Event.GetWorkOrderId())
		}
		if _, err := uuid.Parse(v.Event.GetInvoiceId()); err != nil {
			t.Fatalf("accepted invoice_id %q", v.Event.GetInvoiceId())
		}
		if v.Event.GetInvoiceNumber() == "" {
			t.Fatal("accepted without an invoice number")
		}
	})
}
