package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/retry"
)

// The Inspector reports every state the relay leaves behind (published,
// failed with its error, leased in slow mode, waiting behind a lease), with
// its filters and paging, in a non-default schema.
func TestInspector_ListsWhatTheRelayLeftBehind(t *testing.T) {
	t.Parallel()
	const (
		schema     = "ops_outbox"
		poisonType = "test.v1.Poison"
		slowType   = "test.v1.Slow"
	)
	ctx := context.Background()
	pool := pgtest.NewPool(t, outbox.Migrations(schema))
	opts := []outbox.Option{outbox.WithSchema(schema)}
	w, err := outbox.NewWriter(opts...)
	if err != nil {
		t.Fatal(err)
	}
	write := func(evs ...outbox.Event) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Append(ctx, tx, evs...) }); err != nil {
			t.Fatal(err)
		}
	}
	published, poison := event("a", 1), event("b", 1)
	poison.Type = poisonType
	write(published, poison)

	started := make(chan struct{}, 2)
	g := newGate()
	ok := outbox.DispatcherFunc(func(context.Context, outbox.Event) (outbox.Commit, error) { return nil, nil })
	dispatchers := map[string]outbox.Dispatcher{
		testType: ok,
		poisonType: outbox.DispatcherFunc(func(context.Context, outbox.Event) (outbox.Commit, error) {
			return nil, retry.Permanent(errors.New("cannot be sent"))
		}),
		slowType: outbox.DispatcherFunc(func(context.Context, outbox.Event) (outbox.Commit, error) {
			started <- struct{}{}
			g.wait()
			return nil, nil
		}),
	}
	relayOpts := append([]outbox.Option{outbox.WithSlowDispatch(slowType)}, opts...)
	relay, err := outbox.NewRelay(pool, dispatchers, outbox.Config{}, discard(), nil, relayOpts...)
	if err != nil {
		t.Fatal(err)
	}
	processBatch(t, relay)

	// Two events of one aggregate in slow mode: the first is leased and
	// blocks, the second waits behind it.
	leased, behind := event("s", 1), event("s", 2)
	leased.Type, behind.Type = slowType, slowType
	write(leased, behind)
	runRelay(t, relay)
	t.Cleanup(g.open) // before the relay stops: cleanups run last-in first-out
	receive(t, started, "the slow dispatch")

	in, err := outbox.NewInspector(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	list := func(f outbox.ListFilter) ([]outbox.Record, bool) {
		t.Helper()
		rs, more, err := in.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		return rs, more
	}

	// Default: the undelivered, in claim order.
	got, more := list(outbox.ListFilter{})
	if len(got) != 3 || more {
		t.Fatalf("undelivered: %d records (more %v), want 3: %+v", len(got), more, got)
	}
	if r := got[0]; r.EventID != poison.ID || r.State != outbox.StateFailed || r.Attempts != 1 ||
		r.LastError != "permanent: cannot be sent" || r.AggregateID != "b" || r.Type != poisonType || r.PublishedAt != nil {
		t.Errorf("failed event: %+v", r)
	}
	if r := got[1]; r.EventID != leased.ID || r.State != outbox.StatePending || r.LeaseOwner == "" || r.LeaseUntil == nil {
		t.Errorf("leased event: %+v, want PENDING with a lease", r)
	}
	if r := got[2]; r.EventID != behind.ID || r.State != outbox.StatePending || r.LeaseOwner != "" || r.LeaseUntil != nil {
		t.Errorf("waiting event: %+v, want PENDING without a lease", r)
	}
	if got[0].Seq >= got[1].Seq || got[1].Seq >= got[2].Seq {
		t.Errorf("not in claim order: %d %d %d", got[0].Seq, got[1].Seq, got[2].Seq)
	}

	got, _ = list(outbox.ListFilter{States: []outbox.State{outbox.StatePublished}})
	if len(got) != 1 || got[0].EventID != published.ID || got[0].Attempts != 1 || got[0].PublishedAt == nil ||
		got[0].AggregateType != "thing" || got[0].CreatedAt.IsZero() || got[0].OccurredAt.IsZero() {
		t.Fatalf("published: %+v", got)
	}

	// Filters, and paging across pages.
	all := []outbox.State{outbox.StatePending, outbox.StateFailed, outbox.StatePublished}
	if got, _ := list(outbox.ListFilter{States: all, Type: poisonType}); len(got) != 1 || got[0].EventID != poison.ID {
		t.Errorf("by type: %+v", got)
	}
	page1, more := list(outbox.ListFilter{States: all, AggregateID: "s", Limit: 1})
	if len(page1) != 1 || page1[0].EventID != leased.ID || !more {
		t.Fatalf("page 1: %+v more %v", page1, more)
	}
	page2, more := list(outbox.ListFilter{States: all, AggregateID: "s", Limit: 1, AfterSeq: page1[0].Seq})
	if len(page2) != 1 || page2[0].EventID != behind.ID || more {
		t.Fatalf("page 2: %+v more %v", page2, more)
	}
	if got, _ := list(outbox.ListFilter{States: all}); len(got) != 4 || got[0].EventID != published.ID {
		t.Errorf("every state: %+v", got)
	}

	for _, f := range []outbox.ListFilter{{States: []outbox.State{"PUBLISHING"}}, {Limit: outbox.MaxListLimit + 1}, {Limit: -1}} {
		if _, _, err := in.List(ctx, f); !errors.Is(err, outbox.ErrInvalidFilter) {
			t.Errorf("%+v: %v, want ErrInvalidFilter", f, err)
		}
	}
}
