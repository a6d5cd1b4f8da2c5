package parked

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/lossless-dev/lossless/pkg/pgtext"
)

// FuzzStorable: for any message, the row Park stores holds only text and
// jsonb PostgreSQL accepts, keeps the payload byte for byte, and starts its
// reason with the message's own (made storable).
func FuzzStorable(f *testing.F) {
	f.Add("sub", "m1", "evt-1", "t.v1.Done", "order-1", "correlation_id", "req-1", []byte{0x01}, "unparseable payload")
	f.Add("sub", "m\x00", "evt\x00", "t\xff", "order\x00", "k\x00", "v\xff", []byte(nil), "reason \x00")
	f.Add("s\xfe", `m\x00`, "", "", "", "", "", []byte{0x00, 0xff}, `a\b`)
	f.Fuzz(func(t *testing.T, sub, messageID, eventID, eventType, subject, attrKey, attrValue string, data []byte, reason string) {
		m := Message{Subscription: sub, MessageID: messageID, EventID: eventID, EventType: eventType, Subject: subject,
			Attributes: map[string]string{attrKey: attrValue}, Data: data, Reason: reason}
		r, err := storable(m)
		if err != nil {
			t.Fatal(err)
		}
		for name, s := range map[string]string{"subscription": r.subscription, "message_id": r.messageID, "event_id": r.eventID,
			"event_type": r.eventType, "subject": r.subject, "reason": r.reason} {
			if p := pgtext.Problem(s); p != "" {
				t.Fatalf("%s %q: %s", name, s, p)
			}
		}
		// jsonb rejects invalid UTF-8 and strings holding U+0000.
		var attrs map[string]string
		if !utf8.Valid(r.attributes) || json.Unmarshal(r.attributes, &attrs) != nil || len(attrs) != 1 {
			t.Fatalf("attributes not storable as jsonb: %q", r.attributes)
		}
		for k, a := range attrs {
			if pgtext.Problem(k) != "" || pgtext.Problem(a) != "" {
				t.Fatalf("attribute %q=%q not storable as jsonb", k, a)
			}
		}
		if !bytes.Equal(r.data, data) || r.data == nil {
			t.Fatal("raw bytes not kept")
		}
		if !strings.HasPrefix(r.reason, pgtext.Storable(reason)) {
			t.Fatalf("reason %q does not start with %q", r.reason, pgtext.Storable(reason))
		}
	})
}
