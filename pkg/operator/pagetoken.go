// Page tokens of the operator APIs' List RPCs (OperatorService's and the
// services' own admin lists), AIP-158: the position after a page's last row, and a digest of the
// filter the page was listed with. Clients treat a token as opaque; it is
// base64url-encoded JSON, so its shape can change without a client noticing,
// and a token used with another filter is refused rather than silently
// mixing two listings.
package operator

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"

	"github.com/lossless-dev/lossless/pkg/apierror"
)

// MaxPageTokenLength bounds a token (the requests' page_token max_len).
const MaxPageTokenLength = 512

// Errors of DecodePageToken; their text completes "page_token ...", the field
// violation's description.
var (
	ErrPageTokenMalformed = errors.New("is not a token from a previous response")
	ErrPageTokenForeign   = errors.New("was issued for a different filter")
)

type pageToken struct {
	Position json.RawMessage `json:"p"`
	Filter   string          `json:"f"`
}

// pageFilterDigest names a filter in a few bytes: the token need not repeat it, only
// tell it from another. Fields are separated by NUL, which the RPCs refuse
// in every filter field, so ("ab", "") and ("a", "b") differ.
func pageFilterDigest(filter []string) string {
	sum := sha256.Sum256([]byte(strings.Join(filter, "\x00")))
	return base64.RawURLEncoding.EncodeToString(sum[:9])
}

// EncodePageToken returns the token of position (any value encoding/json handles, e.g.
// the last row's id) for the listing with the given filter values.
func EncodePageToken(position any, filter ...string) string {
	p, err := json.Marshal(position)
	if err != nil {
		// Callers pass ids and times: a failure is a programming error.
		panic("operator: page token position cannot be encoded: " + err.Error())
	}
	b, _ := json.Marshal(pageToken{Position: p, Filter: pageFilterDigest(filter)}) // raw JSON and a string: cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodePageToken fills position from tok, issued by Encode for the same filter
// values. An empty tok is the first page: Decode returns false and leaves
// position alone. Callers check that the position is one a row can have.
func DecodePageToken(tok string, position any, filter ...string) (bool, error) {
	if tok == "" {
		return false, nil
	}
	if len(tok) > MaxPageTokenLength {
		return false, ErrPageTokenMalformed
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return false, ErrPageTokenMalformed
	}
	var t pageToken
	if err := json.Unmarshal(b, &t); err != nil || len(t.Position) == 0 {
		return false, ErrPageTokenMalformed
	}
	if t.Filter != pageFilterDigest(filter) {
		return false, ErrPageTokenForeign
	}
	if err := json.Unmarshal(t.Position, position); err != nil {
		return false, ErrPageTokenMalformed
	}
	return true, nil
}

// DecodePageTokenID decodes a token whose position is a row id (EncodePageToken(id, filter...)):
// 0 for the first page. A token that is malformed, issued for another filter
// or holds no positive id is refused as an INVALID_ARGUMENT field violation
// on page_token, ready to return from an RPC.
func DecodePageTokenID(tok string, filter ...string) (int64, error) {
	var id int64
	ok, err := DecodePageToken(tok, &id, filter...)
	if err == nil && ok && id <= 0 {
		err = ErrPageTokenMalformed
	}
	if err != nil {
		return 0, apierror.InvalidArgument(apierror.Violation{Field: "page_token", Description: err.Error()})
	}
	return id, nil
}
