package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// FuzzGatewayBodies posts arbitrary bodies to create and cancel through the
// real gateway and service on a real database. Whatever arrives, the answer
// is never a 5xx (a client error is the client's to fix, and says so), and
// what is stored matches the answer: a 2xx create stored exactly one order,
// anything else stored nothing; a refused cancel leaves the order as it was.
func FuzzGatewayBodies(f *testing.F) {
	for _, seed := range []struct {
		cancel bool
		body   string
	}{
		{false, validOrder},
		{false, strings.Replace(validOrder, `"paint the fence"`, `"paint\u0000the fence"`, 1)},
		{false, strings.Replace(validOrder, `"paint the fence"`, "\"paint \xff the fence\"", 1)},
		{false, strings.Replace(validOrder, `"positions":3`, `"positions":9223372036854775807`, 1)},
		{false, strings.Replace(validOrder, `"minor_units":1250`, `"minor_units":-1`, 1)},
		{false, strings.Replace(validOrder, `"EUR"`, `"€€€"`, 1)},
		{false, `{"customer_id":"acme-1","customer_id":"acme-2"}`},
		{false, strings.Repeat("[", 10000)},
		{false, `null`},
		{false, `{"unknown_field":1}`},
		{false, ``},
		{true, `{"reason":"changed mind"}`},
		{true, `{"reason":"changed\u0000mind"}`},
		{true, `{"reason":123}`},
		{true, `{"id":"not-a-uuid"}`},
	} {
		f.Add(seed.cancel, seed.body)
	}
	b := setup(f)
	target := b.create(f, validOrder, nil)
	f.Fuzz(func(t *testing.T, cancel bool, body string) {
		if cancel {
			before, err := b.repo.Get(context.Background(), uuid.MustParse(target.GetId()))
			if err != nil {
				t.Fatal(err)
			}
			r := b.do(t, http.MethodPost, "/v1/work-orders/"+target.GetId()+":cancel", body, nil)
			if r.code >= 500 {
				t.Fatalf("cancel %q: HTTP %d: %s", body, r.code, r.body)
			}
			after, err := b.repo.Get(context.Background(), uuid.MustParse(target.GetId()))
			if err != nil {
				t.Fatal(err)
			}
			if r.code >= 300 && after.Version != before.Version {
				t.Fatalf("cancel %q refused with HTTP %d but changed the order: v%d -> v%d", body, r.code, before.Version, after.Version)
			}
			return
		}
		before := b.count(t, "work_orders")
		r := b.do(t, http.MethodPost, "/v1/work-orders", body, nil)
		if r.code >= 500 {
			t.Fatalf("create %q: HTTP %d: %s", body, r.code, r.body)
		}
		want := before
		if r.code < 300 {
			want++
		}
		if got := b.count(t, "work_orders"); got != want {
			t.Fatalf("create %q answered HTTP %d; work orders %d -> %d", body, r.code, before, got)
		}
	})
}
