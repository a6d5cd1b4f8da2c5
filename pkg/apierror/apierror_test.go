package apierror_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"buf.build/go/protovalidate"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/internal/testpb"
)

// One violation per bad field, even when a field breaks several rules.
func TestFromValidationReportsEachBadFieldOnce(t *testing.T) {
	t.Parallel()
	req := &testpb.PutOrderRequest{Order: &testpb.Order{
		CustomerId: "", // breaks min_len and pattern
		Quantity:   0,
		Discount:   0.5,
		UnitPrice:  &testpb.Amount{CurrencyCode: "eur", MinorUnits: 1},
	}}
	err := apierror.FromValidation(protovalidate.Validate(req))
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("code %v", st.Code())
	}
	counts := map[string]int{}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				counts[v.GetField()]++
			}
		}
	}
	want := []string{"order.customer_id", "order.quantity", "order.unit_price.currency_code"}
	for _, f := range want {
		if counts[f] != 1 {
			t.Errorf("field %s reported %d times, want once (all: %v)", f, counts[f], counts)
		}
	}
	if len(counts) != len(want) {
		t.Errorf("violations %v, want exactly %v", counts, want)
	}
}

// Public keeps handler statuses, turns a client's cancellation into
// CANCELLED, an outage into UNAVAILABLE with a retry hint, and anything else
// into a bare INTERNAL naming only the reference.
func TestPublicHidesDriverTextAndClassifiesOutages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	outage := fmt.Errorf("insert into orders (host=10.1.2.3): %w", &pgconn.PgError{Code: "53300", Message: "sorry, too many clients already"})
	for _, tc := range []struct {
		name       string
		ctx        context.Context
		err        error
		want       codes.Code
		wantHidden bool
		wantMsg    string
	}{
		{"status passes", ctx, apierror.NotFound("work order", "x"), codes.NotFound, false, `work order "x" not found`},
		{"client cancelled", cancelled, errors.New("read tcp: use of closed network connection"), codes.Canceled, false, "request cancelled"},
		{"outage", ctx, outage, codes.Unavailable, true, "database unavailable; retry"},
		{"deadline", ctx, fmt.Errorf("acquire: %w", context.DeadlineExceeded), codes.Unavailable, true, "database unavailable; retry"},
		{"bug", ctx, errors.New(`ERROR: column "secret" does not exist`), codes.Internal, true, "internal error (ref r-1)"},
	} {
		got, hidden := apierror.Public(tc.ctx, tc.err, "r-1")
		st := status.Convert(got)
		if st.Code() != tc.want || hidden != tc.wantHidden || st.Message() != tc.wantMsg {
			t.Errorf("%s: %v hidden=%v, want %v %q hidden=%v", tc.name, got, hidden, tc.want, tc.wantMsg, tc.wantHidden)
		}
		if tc.want == codes.Unavailable && apierror.RetryAfter(got) != apierror.RetryDelay {
			t.Errorf("%s: retry after %v, want %v", tc.name, apierror.RetryAfter(got), apierror.RetryDelay)
		}
	}
}
