package invoicing

import (
	"bytes"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// fuzzMaxPayloadBytes keeps the oversize seed small.
const fuzzMaxPayloadBytes = 1024

// FuzzDecode: for any payload and attributes, decoding never panics, a
// message it accepts carries only what the database stores (an event id
// within the column's limit, storable strings and attributes, a payload
// within the cap), and a message it rejects is parked with a reason and its
// raw bytes. Seeds: testdata/fuzz/FuzzDecode (NUL event id,
// NUL attribute, invalid UTF-8, 201-character event id, oversize, unknown
// type, and a valid event).
func FuzzDecode(f *testing.F) {
	d := decoder{maxPayloadBytes: fuzzMaxPayloadBytes}
	f.Fuzz(func(t *testing.T, data []byte, messageID, eventType, attrEventID, attrKey, attrValue string) {
		attrs := map[string]string{pubsub.AttrEventType: eventType, pubsub.AttrEventID: attrEventID}
		if attrKey != "" {
			attrs[attrKey] = attrValue
		}
		m := &pubsub.Received{ID: messageID, Data: data, Attributes: attrs}
		v := d.decode(m)
		switch v.outcome {
		case "":
			wantConsumable(t, m, v)
		case OutcomeParked, OutcomeUnknownType:
			if (v.outcome == OutcomeUnknownType) != (m.Attributes[pubsub.AttrEventType] != EventType && m.Attributes[pubsub.AttrEventType] != "") {
				t.Fatalf("outcome %s for event type %q", v.outcome, m.Attributes[pubsub.AttrEventType])
			}
			wantParkedMessage(t, m, v)
		default:
			t.Fatalf("unknown outcome %q", v.outcome)
		}
	})
}

func wantConsumable(t *testing.T, m *pubsub.Received, v verdict) {
	t.Helper()
	id := v.ev.GetEventId()
	switch {
	case v.ev == nil:
		t.Fatal("accepted without an event")
	case id == "" || pgtext.Problem(id) != "" || utf8.RuneCountInString(id) > MaxEventIDLength:
		t.Fatalf("accepted event id %q", id)
	case len(pgtext.MessageProblems(v.ev.ProtoReflect())) > 0:
		t.Fatalf("accepted unstorable fields: %v", pgtext.MessageProblems(v.ev.ProtoReflect()))
	case len(pgtext.MapProblems(m.Attributes)) > 0:
		t.Fatalf("accepted unstorable attributes: %v", pgtext.MapProblems(m.Attributes))
	case len(m.Data) > fuzzMaxPayloadBytes:
		t.Fatalf("accepted %d bytes", len(m.Data))
	}
	// apply relies on these (uuid.MustParse).
	if _, err := uuid.Parse(v.ev.GetWorkOrderId()); err != nil {
		t.Fatalf("accepted work_order_id %q", v.ev.GetWorkOrderId())
	}
	if _, err := uuid.Parse(v.ev.GetInvoiceId()); err != nil {
		t.Fatalf("accepted invoice_id %q", v.ev.GetInvoiceId())
	}
}

// wantParkedMessage: a rejected message is parked with a reason and
// everything it arrived with; pkg/parked's FuzzStorable proves that whatever
// the message holds is stored.
func wantParkedMessage(t *testing.T, m *pubsub.Received, v verdict) {
	t.Helper()
	if v.reason == "" {
		t.Fatal("parked without a reason")
	}
	p := parkedMessage("workorder.billing-events", m, v)
	if p.MessageID != m.ID || p.EventType != m.Attributes[pubsub.AttrEventType] || p.Reason != v.reason ||
		len(p.Attributes) != len(m.Attributes) || !bytes.Equal(p.Data, m.Data) {
		t.Fatalf("parked message %+v does not keep what arrived", p)
	}
}
