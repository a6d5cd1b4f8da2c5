package api

import (
	"encoding/base64"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// FuzzDecodePageToken: a page token is client input. Any string either is
// refused (400 on page_token) or yields a cursor the database can use: a
// non-nil id and a time no earlier than 1970 and no later than a day from
// now (PostgreSQL's timestamptz cannot hold every time.Time), and the cursor
// survives its own encoding.
func FuzzDecodePageToken(f *testing.F) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	valid := encodePageToken(orders.Cursor{CreatedAt: now.Add(-time.Hour), ID: [16]byte{1}}, "")
	f.Add(valid, "")
	f.Add(encodePageToken(orders.Cursor{CreatedAt: now.Add(-time.Hour), ID: [16]byte{1}}, orders.Status("CREATED")), "CREATED")
	for _, raw := range []string{
		`{"t":"0000-01-01T00:00:00Z","i":"0b9cd9a4-4c8f-4b8e-9d3b-2f7c7c1d0e11"}`,
		`{"t":"9999-12-31T23:59:59Z","i":"0b9cd9a4-4c8f-4b8e-9d3b-2f7c7c1d0e11"}`,
		`{"t":"2026-01-01T00:00:00Z","i":"00000000-0000-0000-0000-000000000000"}`,
		`{"t":"2026-01-01T00:00:00Z","i":"0b9cd9a4-4c8f-4b8e-9d3b-2f7c7c1d0e11","s":"CANCELLED"}`,
		`null`, `[]`, "\x00",
	} {
		f.Add(base64.RawURLEncoding.EncodeToString([]byte(raw)), "")
	}
	f.Add("not base64!", "")
	f.Fuzz(func(t *testing.T, token, status string) {
		c, err := decodePageToken(token, orders.Status(status), now)
		if err != nil || c == nil {
			if token == "" && (err != nil || c != nil) {
				t.Fatalf("empty token: %v, %v; want the first page", c, err)
			}
			return
		}
		if c.ID == [16]byte{} {
			t.Fatalf("token %q: accepted a nil id", token)
		}
		if c.CreatedAt.Before(time.Unix(0, 0)) || c.CreatedAt.After(now.Add(maxTokenSkew)) {
			t.Fatalf("token %q: accepted time %v", token, c.CreatedAt)
		}
		again, err := decodePageToken(encodePageToken(*c, orders.Status(status)), orders.Status(status), now)
		if err != nil || again == nil || !again.CreatedAt.Equal(c.CreatedAt) || again.ID != c.ID {
			t.Fatalf("token %q: cursor %+v does not survive its encoding: %+v, %v", token, c, again, err)
		}
	})
}
