package envelope_test

import (
	"bytes"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

const (
	eventType = "lossless.pkgtest.v1.OrderCompleted"
	eventID   = "7d1e0f4c-6a9b-4c2d-8e3f-1a2b3c4d5e6f"
)

func event() *testpb.OrderCompleted {
	return &testpb.OrderCompleted{EventId: eventID, OrderId: "order-1", CustomerId: "cust-7",
		Description: "install 3 panels", Quantity: 3}
}

func encode(t testing.TB, ev *testpb.OrderCompleted) []byte {
	t.Helper()
	b, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// received is a message as publishers send ev, with extra attributes
// (an empty value deletes the attribute).
func received(t testing.TB, ev *testpb.OrderCompleted, extra map[string]string) *pubsub.Received {
	t.Helper()
	attrs := map[string]string{pubsub.AttrEventType: eventType, pubsub.AttrEventID: ev.GetEventId(), pubsub.AttrSchemaVersion: "1"}
	for k, v := range extra {
		if v == "" {
			delete(attrs, k)
		} else {
			attrs[k] = v
		}
	}
	return &pubsub.Received{ID: "m-1", Data: encode(t, ev), Attributes: attrs}
}

func with(f func(*testpb.OrderCompleted)) *testpb.OrderCompleted {
	ev := event()
	f(ev)
	return ev
}

// TestDecode: each rule of the envelope refuses with its own reason, in
// order, accumulating until a rule that stops reading the payload.
func TestDecode(t *testing.T) {
	garbage := []byte{0xff, 0x01, 0x02}
	garbageErr := proto.Unmarshal(garbage, &testpb.OrderCompleted{})
	if garbageErr == nil {
		t.Fatal("garbage parsed")
	}
	longID := strings.Repeat("é", 201)
	noRules := func(*testpb.OrderCompleted) []string { return nil }
	tooFew := func(ev *testpb.OrderCompleted) []string {
		if ev.GetQuantity() < 5 {
			return []string{"quantity: fewer than 5"}
		}
		return nil
	}
	for _, c := range []struct {
		name        string
		m           *pubsub.Received
		cfg         envelope.Config
		rules       func(*testpb.OrderCompleted) []string
		wantReasons []string
		wantUnknown bool
		wantParsed  bool
	}{
		{name: "accepted", m: received(t, event(), nil), wantParsed: true},
		{name: "accepted without schema_version and event_id attributes",
			m: received(t, event(), map[string]string{pubsub.AttrSchemaVersion: "", pubsub.AttrEventID: ""}), wantParsed: true},
		{name: "missing event type", m: received(t, event(), map[string]string{pubsub.AttrEventType: ""}),
			wantReasons: []string{"missing attribute event_type"}},
		{name: "unknown type, nothing else checked",
			m:           received(t, event(), map[string]string{pubsub.AttrEventType: "orders.v1.OrderArchived", "x": "\x00"}),
			rules:       tooFew,
			wantReasons: []string{`unknown event type "orders.v1.OrderArchived" (this consumer reads lossless.pkgtest.v1.OrderCompleted)`},
			wantUnknown: true},
		{name: "type named in cfg", m: received(t, event(), nil), cfg: envelope.Config{EventType: "orders.v1.OrderCompleted"},
			wantReasons: []string{`unknown event type "lossless.pkgtest.v1.OrderCompleted" (this consumer reads orders.v1.OrderCompleted)`},
			wantUnknown: true},
		{name: "NUL attribute value", m: received(t, event(), map[string]string{pubsub.AttrCorrelationID: "req\x00-1"}),
			wantReasons: []string{`attribute "correlation_id": value contains a NUL byte`}, wantParsed: true},
		{name: "invalid UTF-8 attribute name", m: received(t, event(), map[string]string{"x-\xff": "v"}),
			wantReasons: []string{`attribute "x-\xff": name is not valid UTF-8`}, wantParsed: true},
		{name: "payload over the cap", m: received(t, event(), nil), cfg: envelope.Config{MaxPayloadBytes: 16},
			rules:       tooFew,
			wantReasons: []string{"payload " + strconv.Itoa(len(encode(t, event()))) + " bytes exceeds the cap of 16 bytes"}},
		{name: "schema version", m: received(t, event(), map[string]string{pubsub.AttrSchemaVersion: "2"}),
			wantReasons: []string{"unsupported schema_version 2 (this consumer reads 1)"}},
		{name: "schema version escaped", m: received(t, event(), map[string]string{pubsub.AttrSchemaVersion: "2\x00"}),
			wantReasons: []string{`attribute "schema_version": value contains a NUL byte`,
				`unsupported schema_version 2\x00 (this consumer reads 1)`}},
		{name: "schema version named in cfg", m: received(t, event(), nil), cfg: envelope.Config{SchemaVersion: "2"},
			wantReasons: []string{"unsupported schema_version 1 (this consumer reads 2)"}},
		{name: "unparseable", m: &pubsub.Received{ID: "m-1", Data: garbage, Attributes: map[string]string{pubsub.AttrEventType: eventType}},
			rules: tooFew, wantReasons: []string{"unparseable payload: " + garbageErr.Error()}},
		{name: "NUL text field", m: received(t, with(func(ev *testpb.OrderCompleted) { ev.Description = "paint\x00" }), nil),
			wantReasons: []string{"description: contains a NUL byte"}, wantParsed: true},
		{name: "NUL nested text field",
			m:           received(t, with(func(ev *testpb.OrderCompleted) { ev.UnitPrice = &testpb.Amount{CurrencyCode: "E\x00R"} }), nil),
			wantReasons: []string{"unit_price.currency_code: contains a NUL byte"}, wantParsed: true},
		{name: "event id missing", m: received(t, with(func(ev *testpb.OrderCompleted) { ev.EventId = "" }), nil),
			wantReasons: []string{"event_id: missing"}, wantParsed: true},
		{name: "event id over the limit, in characters",
			m:           received(t, with(func(ev *testpb.OrderCompleted) { ev.EventId = longID }), nil),
			wantReasons: []string{"event_id: 201 characters, limit 200"}, wantParsed: true},
		{name: "event id at the limit", m: received(t, with(func(ev *testpb.OrderCompleted) { ev.EventId = longID[2:] }), nil),
			wantParsed: true},
		{name: "event id limit in cfg", m: received(t, event(), nil), cfg: envelope.Config{MaxEventIDLength: 5},
			wantReasons: []string{"event_id: 36 characters, limit 5"}, wantParsed: true},
		{name: "event id differs from its attribute", m: received(t, event(), map[string]string{pubsub.AttrEventID: "other"}),
			wantReasons: []string{`event_id "` + eventID + `" differs from attribute event_id "other"`}, wantParsed: true},
		{name: "NUL event id", m: received(t, with(func(ev *testpb.OrderCompleted) { ev.EventId = "evt\x00" }), nil),
			wantReasons: []string{`attribute "event_id": value contains a NUL byte`, "event_id: contains a NUL byte"}, wantParsed: true},
		{name: "consumer rule", m: received(t, event(), nil), rules: tooFew,
			wantReasons: []string{"quantity: fewer than 5"}, wantParsed: true},
		{name: "consumer rule passing", m: received(t, with(func(ev *testpb.OrderCompleted) { ev.Quantity = 5 }), nil),
			rules: tooFew, wantParsed: true},
		{name: "reasons accumulate in order",
			m: received(t, with(func(ev *testpb.OrderCompleted) { ev.Description = "paint\x00" }),
				map[string]string{pubsub.AttrCorrelationID: "req\x00-1", pubsub.AttrEventID: "other"}),
			rules: tooFew,
			wantReasons: []string{`attribute "correlation_id": value contains a NUL byte`, "description: contains a NUL byte",
				`event_id "` + eventID + `" differs from attribute event_id "other"`, "quantity: fewer than 5"},
			wantParsed: true},
		{name: "attribute reasons kept when the payload is not read",
			m: received(t, event(), map[string]string{pubsub.AttrCorrelationID: "req\x00-1"}), cfg: envelope.Config{MaxPayloadBytes: 16},
			wantReasons: []string{`attribute "correlation_id": value contains a NUL byte`,
				"payload " + strconv.Itoa(len(encode(t, event()))) + " bytes exceeds the cap of 16 bytes"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rules := c.rules
			if rules == nil {
				rules = noRules
			}
			v := envelope.Decode(c.m, c.cfg, rules)
			if !slices.Equal(v.Reasons, c.wantReasons) {
				t.Errorf("reasons %q, want %q", v.Reasons, c.wantReasons)
			}
			if v.Accepted() != (len(c.wantReasons) == 0) || v.Reason() != strings.Join(c.wantReasons, "; ") {
				t.Errorf("Accepted %v, Reason %q", v.Accepted(), v.Reason())
			}
			if v.UnknownType != c.wantUnknown {
				t.Errorf("UnknownType %v, want %v", v.UnknownType, c.wantUnknown)
			}
			wantOutcome := ""
			switch {
			case c.wantUnknown:
				wantOutcome = "unknown_type"
			case len(c.wantReasons) > 0:
				wantOutcome = "parked"
			}
			if o := v.Outcome("parked", "unknown_type"); o != wantOutcome {
				t.Errorf("Outcome %q, want %q", o, wantOutcome)
			}
			if (v.Event != nil) != c.wantParsed {
				t.Fatalf("event %v, want parsed %v", v.Event, c.wantParsed)
			}
			if c.wantParsed {
				want := &testpb.OrderCompleted{}
				if err := proto.Unmarshal(c.m.Data, want); err != nil || !proto.Equal(v.Event, want) {
					t.Errorf("event %v, want %v (%v)", v.Event, want, err)
				}
			}
		})
	}
}

// TestDecodeWithoutRules: nil rules means the envelope's alone, and a
// rules function sees only events that parsed.
func TestDecodeWithoutRules(t *testing.T) {
	v := envelope.Decode[*testpb.OrderCompleted](received(t, event(), nil), envelope.Config{}, nil)
	if !v.Accepted() || v.Event.GetEventId() != eventID {
		t.Fatalf("verdict %+v", v)
	}
	called := 0
	count := func(*testpb.OrderCompleted) []string { called++; return nil }
	for _, m := range []*pubsub.Received{
		received(t, event(), map[string]string{pubsub.AttrEventType: ""}),
		received(t, event(), map[string]string{pubsub.AttrEventType: "other"}),
		received(t, event(), map[string]string{pubsub.AttrSchemaVersion: "2"}),
		{ID: "m", Data: []byte{0xff}, Attributes: map[string]string{pubsub.AttrEventType: eventType}},
	} {
		envelope.Decode(m, envelope.Config{}, count)
	}
	if called != 0 {
		t.Fatalf("rules called %d times for messages refused before parsing", called)
	}
}

// TestParked: a refused message is parked with all it arrived with.
func TestParked(t *testing.T) {
	m := received(t, event(), map[string]string{pubsub.AttrCorrelationID: "req\x00-1"})
	attrs := maps.Clone(m.Attributes)
	v := envelope.Decode(m, envelope.Config{}, func(*testpb.OrderCompleted) []string { return nil })
	p := envelope.Parked("orders.events", m, v.Event, v.Event.GetOrderId(), v.Reason())
	want := `attribute "correlation_id": value contains a NUL byte`
	if p.Subscription != "orders.events" || p.MessageID != "m-1" || p.EventID != eventID || p.EventType != eventType ||
		p.Subject != "order-1" || !maps.Equal(p.Attributes, attrs) || !bytes.Equal(p.Data, m.Data) || p.Reason != want {
		t.Fatalf("parked %+v", p)
	}
	unparsed := envelope.Parked[*testpb.OrderCompleted]("orders.events", m, nil, "", "unparseable payload")
	if unparsed.EventID != "" || unparsed.Subject != "" || !bytes.Equal(unparsed.Data, m.Data) {
		t.Fatalf("parked unparsed %+v", unparsed)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (envelope.Config{}).Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	err := envelope.Config{MaxPayloadBytes: -1, MaxEventIDLength: -1, EventType: "a\x00", SchemaVersion: "\xff"}.Validate()
	for _, field := range []string{"MaxPayloadBytes -1", "MaxEventIDLength -1", "EventType contains a NUL byte", "SchemaVersion is not valid UTF-8"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("Validate: %v, want it to name %s", err, field)
		}
	}
}
