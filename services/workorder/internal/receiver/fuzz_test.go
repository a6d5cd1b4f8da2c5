package receiver_test

import (
	"testing"
	"unicode/utf8"

	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// fuzzCap is the payload cap of the fuzzed decoder, small so that the
// fuzzer reaches the oversize rule.
const fuzzCap = 1024

// FuzzDecode: for any payload and attributes, Decode does not panic and
// returns a message the inbox table can store as it is (no NUL byte, valid
// UTF-8 in every text field and attribute, ids within their column limits),
// so the database never rejects a decoded message. The seed corpus
// (testdata/fuzz/FuzzDecode) holds the hostile cases: NUL in event_id and in
// an attribute, invalid UTF-8, a 201-character event_id, an oversize payload.
func FuzzDecode(f *testing.F) {
	dec, err := receiver.NewDecoder(receiver.Config{MaxPayloadBytes: fuzzCap})
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte{}, "", "", "1", "", "", "", "")
	f.Fuzz(func(t *testing.T, data []byte, eventID, eventType, version, key, value, orderingKey, messageID string) {
		attrs := map[string]string{pubsub.AttrEventID: eventID, pubsub.AttrEventType: eventType,
			pubsub.AttrSchemaVersion: version, key: value}
		m := dec.Decode(&pubsub.Received{ID: messageID, Data: data, Attributes: attrs, OrderingKey: orderingKey})
		for field, s := range map[string]string{"source": m.Source, "event_id": m.EventID, "event_type": m.EventType,
			"correlation_key": m.CorrelationKey, "message_id": m.MessageID, "traceparent": m.Traceparent,
			"tracestate": m.Tracestate, "park_reason": m.ParkReason, "park_error": m.ParkError} {
			if p := pgtext.Problem(s); p != "" {
				t.Fatalf("%s %q %s", field, s, p)
			}
		}
		for k, v := range m.Attributes {
			if pgtext.Problem(k) != "" || pgtext.Problem(v) != "" {
				t.Fatalf("attribute %q=%q not storable", k, v)
			}
		}
		if n := utf8.RuneCountInString(m.EventID); n < 1 || n > inbox.MaxEventIDLength {
			t.Fatalf("event_id %q has %d characters", m.EventID, n)
		}
		if m.Source == "" || len(m.Source) > inbox.MaxSourceLength {
			t.Fatalf("source %q", m.Source)
		}
		if string(m.Payload) != string(data) {
			t.Fatal("the raw payload must be kept as received")
		}
		if m.ParkReason == "" && (len(data) > fuzzCap || m.CorrelationKey == "") {
			t.Fatalf("accepted an oversize payload or one without a correlation key: %+v", m)
		}
	})
}
