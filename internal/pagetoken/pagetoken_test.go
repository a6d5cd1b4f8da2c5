package pagetoken_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/internal/pagetoken"
)

func TestRoundTripAndRefusals(t *testing.T) {
	t.Parallel()
	type pos struct {
		ID int64 `json:"i"`
	}
	tok := pagetoken.Encode(pos{ID: 42}, "FAILED", "wo-1")
	var got pos
	if ok, err := pagetoken.Decode(tok, &got, "FAILED", "wo-1"); !ok || err != nil || got.ID != 42 {
		t.Fatalf("round trip: %v %v %+v", ok, err, got)
	}
	if ok, err := pagetoken.Decode("", &got, "FAILED", "wo-1"); ok || err != nil {
		t.Fatalf("empty token: %v %v, want the first page", ok, err)
	}
	for name, c := range map[string]struct {
		tok    string
		filter []string
		want   error
	}{
		"other filter":           {tok, []string{"PENDING", "wo-1"}, pagetoken.ErrForeign},
		"fields shifted":         {tok, []string{"FAILEDwo-1", ""}, pagetoken.ErrForeign},
		"not base64":             {"!!", nil, pagetoken.ErrMalformed},
		"not json":               {"bm90IGpzb24", nil, pagetoken.ErrMalformed},
		"position of other type": {pagetoken.Encode("x"), nil, pagetoken.ErrMalformed},
	} {
		if _, err := pagetoken.Decode(c.tok, &got, c.filter...); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

func TestDecodeID(t *testing.T) {
	t.Parallel()
	if id, err := pagetoken.DecodeID("", "PENDING"); id != 0 || err != nil {
		t.Fatalf("first page: %d %v", id, err)
	}
	if id, err := pagetoken.DecodeID(pagetoken.Encode(int64(7), "PENDING"), "PENDING"); id != 7 || err != nil {
		t.Fatalf("round trip: %d %v", id, err)
	}
	for name, tok := range map[string]string{
		"foreign filter": pagetoken.Encode(int64(7), "FAILED"),
		"not an id":      pagetoken.Encode(int64(0), "PENDING"),
		"garbage":        "%%%",
	} {
		_, err := pagetoken.DecodeID(tok, "PENDING")
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "page_token") {
			t.Errorf("%s: %v, want INVALID_ARGUMENT on page_token", name, err)
		}
	}
}
