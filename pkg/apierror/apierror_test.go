package apierror_test

import (
	"testing"

	"buf.build/go/protovalidate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/pkg/apierror"
)

// One violation per bad field, even when a field breaks several rules.
func TestFromValidationReportsEachBadFieldOnce(t *testing.T) {
	t.Parallel()
	req := &workorderv1.CreateWorkOrderRequest{WorkOrder: &workorderv1.WorkOrder{
		CustomerId:  "", // breaks min_len and pattern
		Description: "d",
		Positions:   0,
		UnitPrice:   &moneyv1.Money{CurrencyCode: "eur", MinorUnits: 1},
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
	want := []string{"work_order.customer_id", "work_order.positions", "work_order.unit_price.currency_code"}
	for _, f := range want {
		if counts[f] != 1 {
			t.Errorf("field %s reported %d times, want once (all: %v)", f, counts[f], counts)
		}
	}
	if len(counts) != len(want) {
		t.Errorf("violations %v, want exactly %v", counts, want)
	}
}
