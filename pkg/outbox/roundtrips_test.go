package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// The round trips of one lock-claim batch, pinned: at a database's distance
// each one is a network round trip of the relay's critical path (B7). The
// journal's statement is counted too (its pool copies the relay pool's
// configuration, tracer included). A change that adds one fails here.
func TestBatchRoundTrips(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, outbox.Migrations(""))
	b := &bundle{pool: pool, clock: newClock(), rec: &recorder{}}
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE handed_off (event_id uuid PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	var fail, withCommit bool
	b.rec.fn = func(ev outbox.Event) (outbox.Commit, error) {
		if fail {
			return nil, errors.New("destination said no")
		}
		if !withCommit {
			return nil, nil
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO handed_off VALUES ($1)`, ev.ID)
			return err
		}, nil
	}
	r := b.relay(t, pool, outbox.Config{})
	// one runs a batch of one event (none: an empty claim) and returns its
	// round trips, after a batch of the same shape has warmed the
	// connections' statement caches.
	one := func(name string, events bool) (n int64) {
		t.Helper()
		for range 2 {
			var ev outbox.Event
			if events {
				ev = event("agg-"+name, 0)
				appendCommitted(t, pool, ev)
			}
			rt.Reset()
			processBatch(t, r)
			n = rt.Load()
			if events {
				want := "PUBLISHED"
				if fail {
					want = "PENDING"
				}
				if got := rowOf(t, pool, ev.ID); got.Status != want || got.Attempts != 1 {
					t.Fatalf("%s: row %+v, want %s after one attempt", name, got, want)
				}
				if fail {
					// out of the way of the next case (its backoff)
					if _, err := pool.Exec(ctx, `DELETE FROM outbox WHERE event_id = $1`, ev.ID); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		return n
	}
	cases := []struct {
		name             string
		events           bool
		fail, withCommit bool
		want             int64
	}{
		{"empty claim", false, false, false, 2},
		{"published", true, false, false, 3},
		{"published with a Commit", true, false, true, 4},
		{"transient failure", true, true, false, 3},
	}
	for _, c := range cases {
		fail, withCommit = c.fail, c.withCommit
		if got := one(c.name, c.events); got != c.want {
			t.Errorf("%s: %d round trips, want %d", c.name, got, c.want)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM handed_off`).Scan(&n); err != nil || n != 2 {
		t.Errorf("Commit effects: %d rows (%v), want 2", n, err)
	}
	assertJournalEmpty(t, b)
}

// AppendWith sends the business change and the events in one round trip,
// and they commit or roll back together: a business statement that fails
// leaves no event, and the error is the statement's.
func TestAppendWithSendsTheChangeAndTheEventsInOneRoundTrip(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, outbox.Migrations(""))
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE things (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	appendWith := func(id string) (int64, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // after the commit: a no-op
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO things VALUES ($1)`, id)
		rt.Reset()
		err = outbox.Writer{}.AppendWith(ctx, tx, b, event(id, 0), event(id, 1))
		n := rt.Load()
		if err == nil {
			err = tx.Commit(ctx)
		}
		return n, err
	}
	// In a pgx.Tx (not a pgdb.Tx) the notification goes in the
	// transaction: a second round trip.
	if n, err := appendWith("a"); err != nil || n != 2 {
		t.Fatalf("first: %d round trips, %v; want 2 (one for the batch, one for the notification)", n, err)
	}
	if n := countStatus(t, pool, "PENDING"); n != 2 {
		t.Fatalf("%d events, want 2", n)
	}
	if _, err := appendWith("a"); err == nil || !strings.Contains(err.Error(), "things_pkey") {
		t.Fatalf("a business statement that fails: %v, want its own error", err)
	}
	if n := countStatus(t, pool, "PENDING"); n != 2 {
		t.Fatalf("%d events after the failed change, want still 2", n)
	}
	if err := (outbox.Writer{}).AppendWith(ctx, nil, nil, event("x", 0)); err == nil {
		t.Fatal("AppendWith without a transaction accepted")
	}
}
