package intake

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"buf.build/go/protovalidate"

	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// fuzzMaxPayloadBytes keeps the oversize seed small.
const fuzzMaxPayloadBytes = 1024

// FuzzDecode: for any payload and attributes, decoding never panics, a
// message it accepts carries only what the database stores (an event id
// within the column's limit, storable strings and attributes, a payload
// within the cap), and the parked row of a message it rejects is storable
// and keeps the raw bytes. Seeds: testdata/fuzz/FuzzDecode (NUL event id,
// NUL attribute, invalid UTF-8, 201-character event id, oversize, unknown
// type, and a valid event).
func FuzzDecode(f *testing.F) {
	validator, err := protovalidate.New()
	if err != nil {
		f.Fatal(err)
	}
	d := decoder{validator: validator, maxPayloadBytes: fuzzMaxPayloadBytes}
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
			wantStorableParkedRow(t, m, v)
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
}

func wantStorableParkedRow(t *testing.T, m *pubsub.Received, v verdict) {
	t.Helper()
	if v.reason == "" {
		t.Fatal("parked without a reason")
	}
	r, err := parkRow(m, v)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]string{"message_id": r.messageID, "event_id": r.eventID, "event_type": r.eventType, "reason": r.reason} {
		if p := pgtext.Problem(s); p != "" {
			t.Fatalf("parked %s %q: %s", name, s, p)
		}
	}
	// jsonb rejects invalid UTF-8 and strings holding U+0000.
	var attrs map[string]string
	if !utf8.Valid(r.attributes) || json.Unmarshal(r.attributes, &attrs) != nil {
		t.Fatalf("parked attributes not storable as jsonb: %q", r.attributes)
	}
	for k, a := range attrs {
		if pgtext.Problem(k) != "" || pgtext.Problem(a) != "" {
			t.Fatalf("parked attribute %q=%q not storable as jsonb", k, a)
		}
	}
	if !bytes.Equal(r.data, m.Data) {
		t.Fatal("raw bytes not kept")
	}
}
