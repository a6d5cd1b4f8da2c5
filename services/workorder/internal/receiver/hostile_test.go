package receiver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// hostile is one message the database would refuse as received, and the
// rule its park error must name.
type hostile struct {
	name string
	m    *pubsub.Received
	key  string // event id it is stored under
	rule string
}

func hostileMessages(order uuid.UUID) []hostile {
	withAttr := func(id, k, v string) map[string]string {
		a := attrs(id)
		a[k] = v
		return a
	}
	return []hostile{
		{"NUL in event_id", &pubsub.Received{ID: "m-nul-id", Data: mustData("nul\x00id", order), Attributes: attrs("")},
			"pubsub-message:m-nul-id", `event_id "nul\x00id" contains a NUL byte`},
		{"NUL in an attribute", &pubsub.Received{ID: "m-nul-attr", Data: mustData("nul-attr", order), Attributes: withAttr("nul-attr", "note", "a\x00b")},
			"nul-attr", `attribute "note": value contains a NUL byte`},
		{"invalid UTF-8 attribute value", &pubsub.Received{ID: "m-utf8-value", Data: mustData("utf8-value", order), Attributes: withAttr("utf8-value", "note", "\xff")},
			"utf8-value", `attribute "note": value is not valid UTF-8`},
		{"invalid UTF-8 attribute name", &pubsub.Received{ID: "m-utf8-name", Data: mustData("utf8-name", order), Attributes: withAttr("utf8-name", "n\xc3", "v")},
			"utf8-name", `attribute "n\xc3": name is not valid UTF-8`},
		{"invalid UTF-8 event_id attribute", &pubsub.Received{ID: "m-utf8-id", Data: mustData("utf8-id", order), Attributes: withAttr("", "event_id", "id\xfe")},
			"pubsub-message:m-utf8-id", `attribute "event_id": value is not valid UTF-8`},
		{"invalid UTF-8 event_id in the payload", &pubsub.Received{ID: "m-utf8-payload", Data: rawCompleted("id\xfe", order), Attributes: attrs("")},
			"pubsub-message:m-utf8-payload", "invalid UTF-8"},
		{"201-character event_id", &pubsub.Received{ID: "m-long", Data: mustData(strings.Repeat("x", 201), order), Attributes: attrs("")},
			"pubsub-message:m-long", "oversized event_id"},
		{"oversize payload", &pubsub.Received{ID: "m-big", Data: make([]byte, receiver.DefaultMaxPayloadBytes+1), Attributes: attrs("big")},
			"big", fmt.Sprintf("payload %d bytes exceeds the cap of %d bytes", receiver.DefaultMaxPayloadBytes+1, receiver.DefaultMaxPayloadBytes)},
	}
}

// rawCompleted encodes a WorkOrderCompleted by hand: proto.Marshal refuses
// the invalid UTF-8 a hostile producer can still send.
func rawCompleted(eventID string, order uuid.UUID) []byte {
	b := []byte{0x0a, byte(len(eventID))}
	b = append(b, eventID...)
	b = append(b, 0x12, byte(len(order.String())))
	b = append(b, order.String()...)
	return append(b, 0x18, 1)
}

// A batch of good messages with one of each hostile kind: every message is
// acked; good ones are OPEN, each hostile one is PARKED as POISON with its
// raw payload and a park error naming the rule, caught by the decoder before
// the database saw it.
func TestHostileInput_ParkedAloneBatchMatesStored(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	order := uuid.New()
	bad := hostileMessages(order)
	var batch []*pubsub.Received
	for i := range 10 {
		id := fmt.Sprintf("good-%d", i)
		batch = append(batch, &pubsub.Received{ID: "m-" + id, Data: mustData(id, order), Attributes: attrs(id), OrderingKey: order.String()})
		if i < len(bad) {
			batch = append(batch, bad[i].m)
		}
	}
	for i, err := range receiver.Handle(b.store, decoder(t), quiet)(ctx, batch) {
		if err != nil {
			t.Fatalf("message %d nacked: %v", i, err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE event_id LIKE 'good-%' AND status = 'OPEN' AND correlation_key = $1`, order.String()); n != 10 {
		t.Fatalf("good messages stored OPEN = %d, want 10", n)
	}
	for _, c := range bad {
		var status, reason, lastErr string
		var payloadLen int
		err := b.pool.QueryRow(ctx, `SELECT status, park_reason, last_error, length(payload) FROM inbox WHERE event_id = $1`, c.key).
			Scan(&status, &reason, &lastErr, &payloadLen)
		if err != nil {
			t.Errorf("%s: not stored under %q: %v", c.name, c.key, err)
			continue
		}
		if status != "PARKED" || reason != inbox.ReasonPoison || payloadLen != len(c.m.Data) {
			t.Errorf("%s: %s %s payload %d bytes, want PARKED POISON with %d bytes", c.name, status, reason, payloadLen, len(c.m.Data))
		}
		if !strings.Contains(lastErr, pgtext.Storable(c.rule)) {
			t.Errorf("%s: park error %q does not name %q", c.name, lastErr, c.rule)
		}
		if strings.Contains(lastErr, "not storable as received") {
			t.Errorf("%s: reached the database unchecked: %q", c.name, lastErr)
		}
	}
	// A redelivery of the whole batch stores nothing new and is acked.
	msgs := make([]inbox.Message, len(batch))
	for i, m := range batch {
		msgs[i] = decoder(t).Decode(m)
	}
	res, err := b.store.Ingest(ctx, msgs)
	if err != nil || res.Duplicates != len(batch) {
		t.Fatalf("redelivery: %+v %v", res, err)
	}
}

// The same through Pub/Sub: hostile messages the transport carries (NUL
// bytes are valid UTF-8 for protobuf) are parked and acked, and the good
// messages published with them are stored and acked.
func TestHostileInput_ThroughPubSub_EverythingAcked(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	order := uuid.New()
	nulAttr := attrs("nul-attr")
	nulAttr["note"] = "a\x00b"
	for _, m := range []struct {
		data  []byte
		attrs map[string]string
	}{
		{mustData("good-1", order), attrs("good-1")},
		{mustData("nul\x00id", order), attrs("")},
		{mustData("nul-attr", order), nulAttr},
		{mustData("good-2", order), attrs("good-2")},
	} {
		if _, err := b.pub.PublishRaw(ctx, m.data, m.attrs, order.String()); err != nil {
			t.Fatal(err)
		}
	}
	b.receive(t, nil)
	waitfor.Condition(t, 10*time.Second, "every message acked", b.allAcked)
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE status = 'OPEN'`); n != 2 {
		t.Fatalf("OPEN = %d, want the 2 good messages", n)
	}
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE status = 'PARKED' AND park_reason = 'POISON' AND last_error LIKE '%NUL byte%'`); n != 2 {
		t.Fatalf("parked = %d, want the 2 hostile messages", n)
	}
}

func TestConfig_DefaultsValidationAndEnvironment(t *testing.T) {
	t.Parallel()
	if err := (receiver.Config{}).Validate(); err != nil {
		t.Fatalf("zero config must be valid (defaults): %v", err)
	}
	for _, bad := range []int{-1, 10<<20 + 1} {
		if err := (receiver.Config{MaxPayloadBytes: bad}).Validate(); err == nil {
			t.Errorf("MaxPayloadBytes %d: want an error", bad)
		}
		if _, err := receiver.NewDecoder(receiver.Config{MaxPayloadBytes: bad}); err == nil {
			t.Errorf("NewDecoder with MaxPayloadBytes %d: want an error", bad)
		}
	}
	r := envconfig.FromMap(map[string]string{"WORKORDER_RECEIVER_MAX_PAYLOAD_BYTES": "2048"})
	if c := receiver.ConfigFromEnv(r, "WORKORDER_RECEIVER_"); c.MaxPayloadBytes != 2048 || r.Err() != nil {
		t.Fatalf("from env: %+v %v", c, r.Err())
	}
	r = envconfig.FromMap(map[string]string{"WORKORDER_RECEIVER_MAX_PAYLOAD_BYTES": "lots"})
	if _ = receiver.ConfigFromEnv(r, "WORKORDER_RECEIVER_"); r.Err() == nil || !strings.Contains(r.Err().Error(), "WORKORDER_RECEIVER_MAX_PAYLOAD_BYTES") {
		t.Fatalf("a bad value must name the variable: %v", r.Err())
	}
	r = envconfig.FromMap(nil)
	if c := receiver.ConfigFromEnv(r, "WORKORDER_RECEIVER_"); c.MaxPayloadBytes != receiver.DefaultMaxPayloadBytes {
		t.Fatalf("default = %d", c.MaxPayloadBytes)
	}
	// The cap applies: one byte over is poison, at the cap it is parsed.
	dec, err := receiver.NewDecoder(receiver.Config{MaxPayloadBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	order := uuid.New()
	data, _ := proto.Marshal(&eventsv1.WorkOrderCompleted{EventId: "e", WorkOrderId: order.String(), CompletedItems: 1})
	if m := dec.Decode(&pubsub.Received{ID: "1", Data: data, Attributes: attrs("e")}); m.ParkReason != "" || len(data) > 64 {
		t.Fatalf("within the cap: %+v", m)
	}
	over := append(data, make([]byte, 65-len(data))...)
	if m := dec.Decode(&pubsub.Received{ID: "2", Data: over, Attributes: attrs("e")}); m.ParkReason != inbox.ReasonPoison ||
		!strings.Contains(m.ParkError, "payload 65 bytes exceeds the cap of 64 bytes") {
		t.Fatalf("over the cap: %+v", m)
	}
}
