package consumer_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// markers claims in the default schema.
var markers = func() *consumer.Markers {
	m, err := consumer.NewMarkers()
	if err != nil {
		panic(err)
	}
	return m
}()

func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.NewPool(t, consumer.Migrations(""), parked.Migrations(""))
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (event_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// apply is a consumer: marker and effect in one transaction.
func apply(ctx context.Context, pool *pgxpool.Pool, ev consumer.Marker) (consumer.Outcome, error) {
	var out consumer.Outcome
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if out, err = markers.Claim(ctx, tx, ev); err != nil || out != consumer.Claimed {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, ev.ID)
		return err
	})
	return out, err
}

func count(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// F4: the same event delivered twice, and concurrently, has one effect.
func TestF4_SameEventTwiceAndConcurrentlyOneEffect(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	for i := range 20 {
		ev := consumer.Marker{Consumer: "c", ID: "ev-" + string(rune('a'+i)), Type: "T", Payload: []byte("p")}
		var wg sync.WaitGroup
		outs := make([]consumer.Outcome, 4)
		for j := range outs {
			wg.Go(func() {
				var err error
				if outs[j], err = apply(ctx, pool, ev); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		news := 0
		for _, o := range outs {
			if o == consumer.Claimed {
				news++
			} else if o != consumer.Duplicate {
				t.Fatalf("outcome %v", o)
			}
		}
		if news != 1 {
			t.Fatalf("round %d: %d deliveries applied, want 1", i, news)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM effects`); n != 20 {
		t.Fatalf("effects: %d, want 20", n)
	}
}

// A rolled-back effect leaves no marker: the redelivery applies.
func TestRollbackLeavesNoMarker(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	ev := consumer.Marker{Consumer: "c", ID: "e1", Type: "T", Payload: []byte("p")}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := markers.Claim(ctx, tx, ev); err != nil || out != consumer.Claimed {
		t.Fatalf("%v %v", out, err)
	}
	_ = tx.Rollback(ctx)
	if out, err := apply(ctx, pool, ev); err != nil || out != consumer.Claimed {
		t.Fatalf("redelivery after rollback: %v %v", out, err)
	}
}

// The same id with other content is reported as a conflict (producer bug);
// another consumer may process the same event.
func TestConflictAndConsumerScope(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	ev := consumer.Marker{Consumer: "c", ID: "e1", Type: "T", Payload: []byte("p")}
	if out, _ := apply(ctx, pool, ev); out != consumer.Claimed {
		t.Fatal(out)
	}
	ev.Payload = []byte("other")
	if out, err := apply(ctx, pool, ev); err != nil || out != consumer.Conflict {
		t.Fatalf("%v %v", out, err)
	}
	ev.Consumer = "reports"
	if out, err := apply(ctx, pool, ev); err != nil || out != consumer.Claimed {
		t.Fatalf("%v %v", out, err)
	}
}

func TestCleanerDeletesOnlyExpiredInBatches(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO processed_events (consumer, event_id, event_type, fingerprint, processed_at)
		SELECT 'c', 'old-' || i, 'T', '\x00'::bytea, now() - interval '15 days' FROM generate_series(1, 25) i
		UNION ALL
		SELECT 'c', 'new-' || i, 'T', '\x00'::bytea, now() - interval '13 days' FROM generate_series(1, 5) i`); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.NewCleaner(pool, consumer.CleanerConfig{BatchSize: 10}, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.CleanOnce(ctx, time.Now())
	if err != nil || n != 25 {
		t.Fatalf("deleted %d, %v; want 25", n, err)
	}
	if left := count(t, pool, `SELECT count(*) FROM processed_events`); left != 5 {
		t.Fatalf("left %d, want 5", left)
	}
	if _, err := consumer.NewCleaner(pool, consumer.CleanerConfig{Retention: time.Hour}, slog.New(slog.NewJSONHandler(io.Discard, nil))); err == nil {
		t.Fatal("a retention shorter than the redelivery window was accepted")
	}
}

// Claim and the Cleaner in a schema other than public, with public empty:
// an unqualified name fails with "relation does not exist".
func TestNonDefaultSchema_EveryQueryIsQualified(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, consumer.Migrations("billing"))
	ctx := context.Background()
	if n := count(t, pool, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`); n != 0 {
		t.Fatalf("public holds %d relations, want none", n)
	}
	opt := consumer.WithSchema("billing")
	billing, err := consumer.NewMarkers(opt)
	if err != nil {
		t.Fatal(err)
	}
	claim := func(ev consumer.Marker) consumer.Outcome {
		t.Helper()
		var out consumer.Outcome
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			out, err = billing.Claim(ctx, tx, ev)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	ev := consumer.Marker{Consumer: "c", ID: "e1", Type: "T", Payload: []byte("p")}
	if out := claim(ev); out != consumer.Claimed {
		t.Fatalf("first delivery: %v", out)
	}
	if out := claim(ev); out != consumer.Duplicate {
		t.Fatalf("redelivery: %v", out)
	}
	ev.Payload = []byte("other")
	if out := claim(ev); out != consumer.Conflict {
		t.Fatalf("same id, other payload: %v", out)
	}
	if _, err := pool.Exec(ctx, `UPDATE billing.processed_events SET processed_at = now() - interval '15 days'`); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.NewCleaner(pool, consumer.CleanerConfig{}, slog.New(slog.DiscardHandler), opt)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.CleanOnce(ctx, time.Now()); err != nil || n != 1 {
		t.Fatalf("cleaned %d, %v; want 1", n, err)
	}
	if _, err := consumer.NewCleaner(pool, consumer.CleanerConfig{}, slog.New(slog.DiscardHandler), consumer.WithSchema("Billing")); err == nil {
		t.Fatal("an invalid schema name was accepted")
	}
	if n := count(t, pool, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`); n != 0 {
		t.Fatalf("public holds %d relations after the run, want none", n)
	}
}

// MaxEventIDLength is the schema's limit: an id that long is stored, a
// character more is refused by the table (consumers park such a message
// before claiming it).
func TestMaxEventIDLengthIsTheSchemasLimit(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	id := strings.Repeat("é", consumer.MaxEventIDLength) // characters, not bytes
	if out, err := apply(ctx, pool, consumer.Marker{Consumer: "c", ID: id, Type: "T"}); err != nil || out != consumer.Claimed {
		t.Fatalf("id of MaxEventIDLength characters: %v %v", out, err)
	}
	if _, err := apply(ctx, pool, consumer.Marker{Consumer: "c", ID: id + "x", Type: "T"}); err == nil {
		t.Fatal("id of MaxEventIDLength+1 characters stored")
	}
}
