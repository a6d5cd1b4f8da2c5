package outbox

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgtest"
)

const slowType = "thing.handed_off"

func slowEvent(t *testing.T, pool *pgxpool.Pool, agg string) Event {
	t.Helper()
	ev := Event{ID: uuid.Must(uuid.NewV7()), AggregateType: "thing", AggregateID: agg, Type: slowType,
		SchemaVersion: 1, Payload: []byte(agg), OccurredAt: time.Now()}
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return Append(ctx, tx, ev) }); err != nil {
		t.Fatal(err)
	}
	return ev
}

// eventState reads where the event is: PUBLISHED once moved, else its
// status and lease owner ("" when none).
func eventState(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) (status, owner string, attempts int) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `
SELECT status, coalesce(lease_owner, ''), attempts FROM outbox WHERE event_id = $1
UNION ALL SELECT 'PUBLISHED', '', attempts FROM outbox_published WHERE event_id = $1`, id).Scan(&status, &owner, &attempts)
	if err != nil {
		t.Fatalf("event %s: %v", id, err)
	}
	return status, owner, attempts
}

// The round trips of one event in slow mode, pinned: one lease claim, the
// dispatch, its settlement, through the functions slowLoop runs
// (claimLeases, dispatchLeased). The dispatcher has the hand-off's shape: a
// pre-check read, then a Commit that locks the aggregate's row (a batch of
// two statements), decides and saves it (a batch). At a database's distance
// each round trip is a network round trip of the hop (B7). A change that
// adds one fails here.
func TestLeasedRoundTrips(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, Migrations(""))
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE things (id text PRIMARY KEY, status text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var fail, withCommit, commitFails bool
	d := DispatcherFunc(func(ctx context.Context, ev Event) (Commit, error) {
		var status string
		if err := pool.QueryRow(ctx, `SELECT status FROM things WHERE id = $1`, ev.AggregateID).Scan(&status); err != nil {
			return nil, err
		}
		if fail {
			return nil, errors.New("destination said no")
		}
		if !withCommit {
			return nil, nil
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			lock := &pgx.Batch{}
			lock.Queue(`SELECT status FROM things WHERE id = $1 FOR UPDATE`, ev.AggregateID).QueryRow(func(r pgx.Row) error { return r.Scan(&status) })
			lock.Queue(`SELECT count(*) FROM things WHERE id = $1`, ev.AggregateID).QueryRow(func(r pgx.Row) error { var n int; return r.Scan(&n) })
			if err := tx.SendBatch(ctx, lock).Close(); err != nil {
				return err
			}
			if status != "CREATED" {
				return nil
			}
			save := &pgx.Batch{}
			save.Queue(`UPDATE things SET status = 'HANDED_OFF' WHERE id = $1`, ev.AggregateID)
			if commitFails {
				save.Queue(`INSERT INTO things VALUES ($1, 'duplicate')`, ev.AggregateID)
			}
			return tx.SendBatch(ctx, save).Close()
		}, nil
	})
	r, err := NewRelay(pool, map[string]Dispatcher{slowType: d}, Config{}, slog.New(slog.DiscardHandler), nil, WithSlowDispatch(slowType))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	one := func(name string) (rts int64) {
		t.Helper()
		for range 2 { // the first warms the statement caches
			n++
			agg := name + "-" + string(rune('a'+n))
			if _, err := pool.Exec(ctx, `INSERT INTO things VALUES ($1, 'CREATED')`, agg); err != nil {
				t.Fatal(err)
			}
			ev := slowEvent(t, pool, agg)
			rt.Reset()
			rows, err := r.claimLeases(ctx, 1)
			if err != nil || len(rows) != 1 {
				t.Fatalf("%s: claimed %d (%v), want 1", name, len(rows), err)
			}
			r.dispatchLeased(ctx, rows[0])
			rts = rt.Load()
			status, owner, attempts := eventState(t, pool, ev.ID)
			want, wantThing := "PUBLISHED", "HANDED_OFF"
			if fail || commitFails {
				want = "PENDING"
			}
			if fail || commitFails || !withCommit {
				wantThing = "CREATED"
			}
			if status != want || owner != "" || attempts != 1 {
				t.Fatalf("%s: event %s (lease %q) after %d attempts, want %s after 1, no lease", name, status, owner, attempts, want)
			}
			var thing string
			if err := pool.QueryRow(ctx, `SELECT status FROM things WHERE id = $1`, agg).Scan(&thing); err != nil || thing != wantThing {
				t.Fatalf("%s: thing %s (%v), want %s", name, thing, err, wantThing)
			}
			if want == "PENDING" { // out of the way of the next case (its backoff)
				if _, err := pool.Exec(ctx, `DELETE FROM outbox WHERE event_id = $1`, ev.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
		return rts
	}
	cases := []struct {
		name                          string
		fail, withCommit, commitFails bool
		want                          int64
	}{
		// claim, pre-check, BEGIN with the fence and the lock, save, COMMIT
		{"hand-off", false, true, false, 5},
		// claim, pre-check, BEGIN with the fence and COMMIT
		{"published", false, false, false, 3},
		// claim, pre-check, the record with its BEGIN and COMMIT
		{"transient failure", true, false, false, 3},
		// the hand-off's, ROLLBACK instead of COMMIT, then the record
		{"failing Commit", false, true, true, 6},
	}
	for _, c := range cases {
		fail, withCommit, commitFails = c.fail, c.withCommit, c.commitFails
		if got := one(c.name); got != c.want {
			t.Errorf("%s: %d round trips, want %d", c.name, got, c.want)
		}
	}
}

// The settlement's BEGIN, fence and the Commit's first statements go out in
// one batch, which the server runs before the relay reads any result: a
// lease lost to another claim must fail the fence in the server, so that
// the Commit's statements never commit, and be reported as errLeaseLost.
func TestLeasePublishOnALostLeaseCommitsNothing(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, Migrations(""))
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE marker (n int)`); err != nil {
		t.Fatal(err)
	}
	r, err := NewRelay(pool, map[string]Dispatcher{slowType: DispatcherFunc(func(context.Context, Event) (Commit, error) { return nil, nil })},
		Config{}, slog.New(slog.DiscardHandler), nil, WithSlowDispatch(slowType))
	if err != nil {
		t.Fatal(err)
	}
	commits := map[string]Commit{
		"no Commit": nil,
		"an Exec with arguments (batched with the fence)": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO marker VALUES ($1)`, 1)
			return err
		},
		"a batch (batched with the fence)": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(`INSERT INTO marker VALUES ($1)`, 2)
			return tx.SendBatch(ctx, b).Close()
		},
		"a Query (sent after the fence)": func(ctx context.Context, tx pgx.Tx) error {
			var n int
			return tx.QueryRow(ctx, `INSERT INTO marker VALUES (3) RETURNING n`).Scan(&n)
		},
	}
	for name, commit := range commits {
		ev := slowEvent(t, pool, "lost-"+name)
		rows, err := r.claimLeases(ctx, 1)
		if err != nil || len(rows) != 1 {
			t.Fatalf("%s: claimed %d (%v), want 1", name, len(rows), err)
		}
		// Another claim takes the lease over.
		if _, err := pool.Exec(ctx, `UPDATE outbox SET lease_owner = 'relay-b/1' WHERE event_id = $1`, ev.ID); err != nil {
			t.Fatal(err)
		}
		o := outcome{kind: outcomePublished, commit: commit}
		if err := r.settleLeased(ctx, rows[0], &o); !errors.Is(err, errLeaseLost) {
			t.Fatalf("%s: settlement on a lost lease: %v, want errLeaseLost", name, err)
		}
		if status, owner, attempts := eventState(t, pool, ev.ID); status != "PENDING" || owner != "relay-b/1" || attempts != 0 {
			t.Fatalf("%s: event %s, lease %q, attempts %d: the stale settlement wrote", name, status, owner, attempts)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM marker`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%s: marker rows %d (%v): the Commit committed on a lost lease", name, n, err)
		}
		if _, err := pool.Exec(ctx, `DELETE FROM outbox WHERE event_id = $1`, ev.ID); err != nil {
			t.Fatal(err)
		}
	}
}
