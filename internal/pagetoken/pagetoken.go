// Package pagetoken encodes the page tokens of the services' List RPCs
// (AIP-158): the position after a page's last row, and a digest of the
// filter the page was listed with. Clients treat a token as opaque; it is
// base64url-encoded JSON, so its shape can change without a client noticing,
// and a token used with another filter is refused rather than silently
// mixing two listings.
package pagetoken

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"

	"github.com/lossless-dev/lossless/pkg/apierror"
)

// MaxLength bounds a token (the requests' page_token max_len).
const MaxLength = 512

// Errors of Decode; their text completes "page_token ...", the field
// violation's description.
var (
	ErrMalformed = errors.New("is not a token from a previous response")
	ErrForeign   = errors.New("was issued for a different filter")
)

type token struct {
	Position json.RawMessage `json:"p"`
	Filter   string          `json:"f"`
}

// digest names a filter in a few bytes: the token need not repeat it, only
// tell it from another. Fields are separated by NUL, which the RPCs refuse
// in every filter field, so ("ab", "") and ("a", "b") differ.
func digest(filter []string) string {
	sum := sha256.Sum256([]byte(strings.Join(filter, "\x00")))
	return base64.RawURLEncoding.EncodeToString(sum[:9])
}

// Encode returns the token of position (any value encoding/json handles, e.g.
// the last row's id) for the listing with the given filter values.
func Encode(position any, filter ...string) string {
	p, err := json.Marshal(position)
	if err != nil {
		// Callers pass ids and times: a failure is a programming error.
		panic("pagetoken: position cannot be encoded: " + err.Error())
	}
	b, _ := json.Marshal(token{Position: p, Filter: digest(filter)}) // raw JSON and a string: cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

// Decode fills position from tok, issued by Encode for the same filter
// values. An empty tok is the first page: Decode returns false and leaves
// position alone. Callers check that the position is one a row can have.
func Decode(tok string, position any, filter ...string) (bool, error) {
	if tok == "" {
		return false, nil
	}
	if len(tok) > MaxLength {
		return false, ErrMalformed
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return false, ErrMalformed
	}
	var t token
	if err := json.Unmarshal(b, &t); err != nil || len(t.Position) == 0 {
		return false, ErrMalformed
	}
	if t.Filter != digest(filter) {
		return false, ErrForeign
	}
	if err := json.Unmarshal(t.Position, position); err != nil {
		return false, ErrMalformed
	}
	return true, nil
}

// DecodeID decodes a token whose position is a row id (Encode(id, filter...)):
// 0 for the first page. A token that is malformed, issued for another filter
// or holds no positive id is refused as an INVALID_ARGUMENT field violation
// on page_token, ready to return from an RPC.
func DecodeID(tok string, filter ...string) (int64, error) {
	var id int64
	ok, err := Decode(tok, &id, filter...)
	if err == nil && ok && id <= 0 {
		err = ErrMalformed
	}
	if err != nil {
		return 0, apierror.InvalidArgument(apierror.Violation{Field: "page_token", Description: err.Error()})
	}
	return id, nil
}
