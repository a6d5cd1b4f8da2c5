package api

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// pageToken is the position after a page's last order plus the filter it was
// issued for. Clients treat it as opaque (AIP-158): it is base64url-encoded
// JSON, so its shape can change without a client noticing, and a token used
// with a different filter is refused rather than silently mixing listings.
type pageToken struct {
	CreatedAt time.Time `json:"t"`
	ID        uuid.UUID `json:"i"`
	Status    string    `json:"s,omitempty"`
}

func encodePageToken(c orders.Cursor, status orders.Status) string {
	b, _ := json.Marshal(pageToken{CreatedAt: c.CreatedAt, ID: c.ID, Status: string(status)}) // plain struct: cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

var (
	errForeignPageToken    = errors.New("was issued for a different status filter")
	errOutOfRangePageToken = errors.New("is out of range: not a token from a previous response")
)

// maxTokenSkew is how far past now a token's time may lie: tokens carry the
// database's creation times, and replicas' clocks differ a little.
const maxTokenSkew = 24 * time.Hour

// decodePageToken returns the cursor in token, or nil for the first page. A
// token whose time no order can have (before 1970, after now) is refused like
// a malformed one: it cannot come from a previous response, and some such
// times are beyond what PostgreSQL's timestamptz holds.
func decodePageToken(token string, status orders.Status, now time.Time) (*orders.Cursor, error) {
	if token == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return nil, errors.New("is not a token from a previous response")
	}
	var t pageToken
	if err := json.Unmarshal(b, &t); err != nil || t.ID == uuid.Nil || t.CreatedAt.IsZero() {
		return nil, errors.New("is not a token from a previous response")
	}
	if t.CreatedAt.Before(time.Unix(0, 0)) || t.CreatedAt.After(now.Add(maxTokenSkew)) {
		return nil, errOutOfRangePageToken
	}
	if orders.Status(t.Status) != status {
		return nil, errForeignPageToken
	}
	return &orders.Cursor{CreatedAt: t.CreatedAt, ID: t.ID}, nil
}
