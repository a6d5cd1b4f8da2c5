package inbox_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// The round trips of the inbox's two paths, pinned (ADR 0023). Ingest of a
// batch costs one: BEGIN, insert, conflicts, COMMIT and the relays'
// wake-up in one pipeline (four before). A relay batch costs the claim with
// the BEGIN, the handler's statements, and the resolve with the COMMIT (a
// BatchHandler of one statement per entry, two entries: four, six before);
// a claim that finds nothing two (three before).
func TestRoundTripsOfIngestAndRelay(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, inbox.Migrations(""))
	ctx := context.Background()
	store, err := inbox.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := bundle{pool: pool, store: store}
	b.effectsTable(t)
	relay, err := inbox.NewRelay(pool, &batchRecorder{}, inbox.Config{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Warm the statement cache: ingest, a duplicate, a batch, an empty claim.
	for _, m := range []inbox.Message{msg("w1", "k0", "p"), msg("w1", "k0", "p")} {
		if _, err := store.Ingest(ctx, []inbox.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	drain(t, relay)

	rt.Reset()
	res, err := store.Ingest(ctx, []inbox.Message{msg("e1", "k1", "p")})
	if err != nil || res.Inserted != 1 || res.WakeErr != nil {
		t.Fatalf("ingest: %+v %v", res, err)
	}
	if n := rt.Load(); n != 1 {
		t.Errorf("ingest: %d round trips, want 1", n)
	}

	rt.Reset()
	res, err = store.Ingest(ctx, []inbox.Message{msg("e1", "k1", "p"), msg("e2", "k2", "p"), msg("e2", "k2", "other")})
	if err != nil || res.Inserted != 1 || res.Duplicates != 1 || res.Conflicts != 1 {
		t.Fatalf("ingest with a duplicate and a conflict: %+v %v", res, err)
	}
	if n := rt.Load(); n != 1 {
		t.Errorf("ingest with a duplicate and a conflict: %d round trips, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM inbox_conflicts WHERE event_id = 'e2'`); n != 1 {
		t.Fatalf("conflicts recorded: %d, want 1", n)
	}

	rt.Reset()
	if n, err := relay.ProcessBatch(ctx); err != nil || n != 2 {
		t.Fatalf("relay batch: %d %v", n, err)
	}
	if n := rt.Load(); n != 4 {
		t.Errorf("relay batch: %d round trips, want 4", n)
	}
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE event_id IN ('e1', 'e2') AND status = 'APPLIED' AND attempts = 1`); n != 2 {
		t.Fatalf("applied entries %d, want 2", n)
	}
	if n := b.count(t, `SELECT count(*) FROM effects WHERE event_id IN ('e1', 'e2')`); n != 2 {
		t.Fatalf("effects %d, want 2", n)
	}

	rt.Reset()
	if n, err := relay.ProcessBatch(ctx); err != nil || n != 0 {
		t.Fatalf("empty claim: %d %v", n, err)
	}
	if n := rt.Load(); n != 2 {
		t.Errorf("empty claim: %d round trips, want 2", n)
	}
}
