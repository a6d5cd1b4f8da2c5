package envelope_test

import (
	"bytes"
	"maps"
	"testing"
	"unicode/utf8"

	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// fuzzConfig keeps the oversize seed small.
var fuzzConfig = envelope.Config{MaxPayloadBytes: 1024}

// FuzzDecode: for any payload and attributes, Decode never panics; a
// message it accepts carries only what a consumer stores (an event id within
// the limit and equal to its attribute, storable fields and attributes, a
// payload within the cap, the schema version read); a message of another
// type is refused as UnknownType without its payload read; and a refused
// message parks with a reason and all it arrived with. Seeds:
// testdata/fuzz/FuzzDecode (NUL event id, NUL and invalid UTF-8 attributes,
// invalid UTF-8 payload, 201-character event ids, oversize, unknown and
// missing type, a NUL schema version, and a valid event).
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, messageID, eventType, attrEventID, attrKey, attrValue string) {
		attrs := map[string]string{pubsub.AttrEventType: eventType, pubsub.AttrEventID: attrEventID}
		if attrKey != "" {
			attrs[attrKey] = attrValue
		}
		m := &pubsub.Received{ID: messageID, Data: data, Attributes: attrs}
		sent := maps.Clone(attrs)
		v := envelope.Decode[*testpb.OrderCompleted](m, fuzzConfig, nil)
		typ := m.Attributes[pubsub.AttrEventType]
		if v.UnknownType != (typ != "" && typ != "lossless.pkgtest.v1.OrderCompleted") {
			t.Fatalf("UnknownType %v for event type %q", v.UnknownType, typ)
		}
		if typ == "" || v.UnknownType {
			if v.Event != nil {
				t.Fatalf("payload of type %q read", typ)
			}
		}
		if v.Accepted() {
			wantStorable(t, m, v)
			return
		}
		if v.Reason() == "" {
			t.Fatal("refused without a reason")
		}
		p := envelope.Parked("orders.events", m, v.Event, v.Event.GetOrderId(), v.Reason())
		if p.MessageID != messageID || p.EventType != typ || p.EventID != v.Event.GetEventId() || p.Reason != v.Reason() ||
			!maps.Equal(p.Attributes, sent) || !bytes.Equal(p.Data, data) {
			t.Fatalf("parked message %+v does not keep what arrived", p)
		}
	})
}

func wantStorable(t *testing.T, m *pubsub.Received, v envelope.Verdict[*testpb.OrderCompleted]) {
	t.Helper()
	id := v.Event.GetEventId()
	switch attr := m.Attributes[pubsub.AttrEventID]; {
	case v.Event == nil:
		t.Fatal("accepted without an event")
	case id == "" || pgtext.Problem(id) != "" || utf8.RuneCountInString(id) > 200:
		t.Fatalf("accepted event id %q", id)
	case attr != "" && attr != id:
		t.Fatalf("accepted event id %q with attribute %q", id, attr)
	case len(pgtext.MessageProblems(v.Event.ProtoReflect())) > 0:
		t.Fatalf("accepted unstorable fields: %v", pgtext.MessageProblems(v.Event.ProtoReflect()))
	case len(pgtext.MapProblems(m.Attributes)) > 0:
		t.Fatalf("accepted unstorable attributes: %v", pgtext.MapProblems(m.Attributes))
	case len(m.Data) > fuzzConfig.MaxPayloadBytes:
		t.Fatalf("accepted %d bytes", len(m.Data))
	case m.Attributes[pubsub.AttrSchemaVersion] != "" && m.Attributes[pubsub.AttrSchemaVersion] != "1":
		t.Fatalf("accepted schema_version %q", m.Attributes[pubsub.AttrSchemaVersion])
	}
}
