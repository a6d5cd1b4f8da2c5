package intake

import (
	"testing"

	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/billing/internal/issuer"
)

// FuzzDecode: for any payload and attributes, billing's own rules
// (protovalidate, issuer.OrderFromEvent) never panic on what the envelope
// parses; a message decode accepts is a job the worker can invoice (its
// payload, as the job carries it, converts to an order); and the outcome
// agrees with the reason. The envelope's rules are pkg/envelope's
// FuzzDecode. Seeds: testdata/fuzz/FuzzDecode (NUL event id, NUL attribute,
// invalid UTF-8, 201-character event id, oversize, unknown type, and a
// valid event).
func FuzzDecode(f *testing.F) {
	validator, err := protovalidate.New()
	if err != nil {
		f.Fatal(err)
	}
	d := decoder{validator: validator}
	env := envelope.Config{EventType: EventType, MaxPayloadBytes: 1024, MaxEventIDLength: MaxEventIDLength}
	f.Fuzz(func(t *testing.T, data []byte, messageID, eventType, attrEventID, attrKey, attrValue string) {
		attrs := map[string]string{pubsub.AttrEventType: eventType, pubsub.AttrEventID: attrEventID}
		if attrKey != "" {
			attrs[attrKey] = attrValue
		}
		v := d.decode(&pubsub.Received{ID: messageID, Data: data, Attributes: attrs}, env)
		outcome, reason := v.Outcome(OutcomeParked, OutcomeUnknownType), v.Reason()
		switch outcome {
		case "":
			var job eventsv1.WorkOrderCompletionRecorded
			if err := proto.Unmarshal(data, &job); err != nil {
				t.Fatalf("accepted a payload the worker cannot decode: %v", err)
			}
			if _, err := issuer.OrderFromEvent(&job); err != nil || reason != "" {
				t.Fatalf("accepted an event the worker cannot invoice: %v (reason %q)", err, reason)
			}
		case OutcomeParked, OutcomeUnknownType:
			if reason == "" || (outcome == OutcomeUnknownType && v.Event != nil) {
				t.Fatalf("outcome %s, reason %q, event %v", outcome, reason, v.Event)
			}
		default:
			t.Fatalf("unknown outcome %q", outcome)
		}
	})
}
