package admin_test

import (
	"context"
	"testing"

	"github.com/lossless-dev/lossless/pkg/inbox"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
)

// An order's inbox entries are found by its provider messages' event ids,
// in every status, and only the provider's: the console's order timeline.
func TestListInboxEntries_ByProviderEventIDsInEveryStatus(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.parked(t) // provider e1, PARKED
	store, err := inbox.NewStore(b.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Ingest(context.Background(), []inbox.Message{
		{Source: "provider", EventID: "e2", CorrelationKey: "order-1", Payload: []byte("y")},
		{Source: "elsewhere", EventID: "e3", CorrelationKey: "order-1", Payload: []byte("z")},
	}); err != nil {
		t.Fatal(err)
	}
	cl := servedOps(t, b, nil)
	ctx := asOperator()
	resp, err := cl.ListInboxEntries(ctx, &opsv1.ListInboxEntriesRequest{EventIds: []string{"e1", "e2", "e3"}})
	if err != nil {
		t.Fatal(err)
	}
	es := resp.GetEntries()
	if len(es) != 2 || es[0].GetEventId() != "e1" || es[0].GetStatus() != "PARKED" || es[1].GetEventId() != "e2" || es[1].GetStatus() != "OPEN" {
		t.Fatalf("entries by event id: %v, want e1 PARKED and e2 OPEN (not another source's e3)", es)
	}
	open, err := cl.ListInboxEntries(ctx, &opsv1.ListInboxEntriesRequest{EventIds: []string{"e1", "e2"}, Status: "OPEN"})
	if err != nil || len(open.GetEntries()) != 1 || open.GetEntries()[0].GetEventId() != "e2" {
		t.Fatalf("OPEN entries by event id: %v %v", open, err)
	}
}
