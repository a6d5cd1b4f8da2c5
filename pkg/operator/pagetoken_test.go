package operator_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/operator"
)

func TestRoundTripAndRefusals(t *testing.T) {
	t.Parallel()
	type pos struct {
		ID int64 `json:"i"`
	}
	tok := operator.EncodePageToken(pos{ID: 42}, "FAILED", "wo-1")
	var got pos
	if ok, err := operator.DecodePageToken(tok, &got, "FAILED", "wo-1"); !ok || err != nil || got.ID != 42 {
		t.Fatalf("round trip: %v %v %+v", ok, err, got)
	}
	if ok, err := operator.DecodePageToken("", &got, "FAILED", "wo-1"); ok || err != nil {
		t.Fatalf("empty token: %v %v, want the first page", ok, err)
	}
	for name, c := range map[string]struct {
		tok    string
		filter []string
		want   error
	}{
		"other filter":           {tok, []string{"PENDING", "wo-1"}, operator.ErrPageTokenForeign},
		"fields shifted":         {tok, []string{"FAILEDwo-1", ""}, operator.ErrPageTokenForeign},
		"not base64":             {"!!", nil, operator.ErrPageTokenMalformed},
		"not json":               {"bm90IGpzb24", nil, operator.ErrPageTokenMalformed},
		"position of other type": {operator.EncodePageToken("x"), nil, operator.ErrPageTokenMalformed},
	} {
		if _, err := operator.DecodePageToken(c.tok, &got, c.filter...); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

func TestDecodeID(t *testing.T) {
	t.Parallel()
	if id, err := operator.DecodePageTokenID("", "PENDING"); id != 0 || err != nil {
		t.Fatalf("first page: %d %v", id, err)
	}
	if id, err := operator.DecodePageTokenID(operator.EncodePageToken(int64(7), "PENDING"), "PENDING"); id != 7 || err != nil {
		t.Fatalf("round trip: %d %v", id, err)
	}
	for name, tok := range map[string]string{
		"foreign filter": operator.EncodePageToken(int64(7), "FAILED"),
		"not an id":      operator.EncodePageToken(int64(0), "PENDING"),
		"garbage":        "%%%",
	} {
		_, err := operator.DecodePageTokenID(tok, "PENDING")
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "page_token") {
			t.Errorf("%s: %v, want INVALID_ARGUMENT on page_token", name, err)
		}
	}
}
