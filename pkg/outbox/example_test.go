package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver of sql.Open
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// Migrations, applied with pgmigrate.Apply, creates the outbox tables in a
// schema of the caller's choice (here next to a first outbox, already in
// "public"). Applying it again does nothing.
func ExampleMigrations() {
	dsn, drop := pgtest.ExampleDatabase(outbox.Migrations(""))
	defer drop()
	ctx := context.Background()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		panic(err)
	}
	defer db.Close()

	if _, err := pgmigrate.Apply(ctx, db, outbox.Migrations("billing_outbox")); err != nil {
		panic(err)
	}
	rows, err := db.QueryContext(ctx, `
SELECT table_name, table_type FROM information_schema.tables
WHERE table_schema = 'billing_outbox' ORDER BY table_name`)
	if err != nil {
		panic(err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			panic(err)
		}
		fmt.Println(name, typ)
	}
	if err := rows.Err(); err != nil {
		panic(err)
	}
	// Output:
	// outbox BASE TABLE
	// outbox_dispatching BASE TABLE
	// outbox_events VIEW
	// outbox_published BASE TABLE
	// outbox_schema_version BASE TABLE
}

// A business transaction writes an order and its event together; the relay
// dispatches the event once the transaction has committed, and records it
// as published.
func ExampleRelay() {
	dsn, drop := pgtest.ExampleDatabase(outbox.Migrations(""))
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL)`); err != nil {
		panic(err)
	}

	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	// The business transaction: the order and its event commit together.
	// The relays' wake-up goes after the commit, in its round trip (a
	// pgdb.Tx): sent inside, it would hold PostgreSQL's notification lock
	// across the commit's flush, and every notifying commit of the server
	// would wait.
	ev, err := outbox.NewEvent(ctx, "order", "o-1", wrapperspb.String("order o-1 placed"))
	if err != nil {
		panic(err)
	}
	err = pgdb.InTx(ctx, pool, logger, func(tx *pgdb.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('o-1', 'PLACED')`); err != nil {
			return err
		}
		return outbox.Append(ctx, tx, ev)
	})
	if err != nil {
		panic(err)
	}

	// The relay, with a dispatcher that stands in for a publish.
	dispatched := make(chan outbox.Event, 1)
	send := outbox.DispatcherFunc(func(ctx context.Context, ev outbox.Event) (outbox.Commit, error) {
		dispatched <- ev
		return nil, nil
	})
	relay, err := outbox.NewRelay(pool, map[string]outbox.Dispatcher{ev.Type: send}, outbox.Config{}, logger, nil)
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()

	got := <-dispatched
	// Stopping the relay still records the batch in flight.
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	var msg wrapperspb.StringValue
	if err := proto.Unmarshal(got.Payload, &msg); err != nil {
		panic(err)
	}
	fmt.Println("dispatched:", got.Type, got.AggregateType, got.AggregateID, msg.GetValue(), "attempt", got.Attempts)

	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM outbox_events WHERE event_id = $1`, got.ID).Scan(&status); err != nil {
		panic(err)
	}
	fmt.Println("status:", status)
	// Output:
	// dispatched: google.protobuf.StringValue order o-1 order o-1 placed attempt 1
	// status: PUBLISHED
}

// An outbox outside "public": the schema given to Migrations is passed,
// through WithSchema, to the writer and the relay; one option list serves
// both.
func ExampleWithSchema() {
	const schema = "billing_outbox"
	dsn, drop := pgtest.ExampleDatabase(outbox.Migrations(schema))
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	opts := []outbox.Option{outbox.WithSchema(schema)}

	w, err := outbox.NewWriter(opts...)
	if err != nil {
		panic(err)
	}
	ev, err := outbox.NewEvent(ctx, "invoice", "i-1", wrapperspb.String("invoice i-1 issued"))
	if err != nil {
		panic(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Append(ctx, tx, ev) }); err != nil {
		panic(err)
	}

	dispatched := make(chan outbox.Event, 1)
	send := outbox.DispatcherFunc(func(ctx context.Context, ev outbox.Event) (outbox.Commit, error) {
		dispatched <- ev
		return nil, nil
	})
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	relay, err := outbox.NewRelay(pool, map[string]outbox.Dispatcher{ev.Type: send}, outbox.Config{}, logger, nil, opts...)
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	got := <-dispatched
	stop()
	if err := <-done; err != nil {
		panic(err)
	}

	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM billing_outbox.outbox_events WHERE event_id = $1`, got.ID).Scan(&status); err != nil {
		panic(err)
	}
	fmt.Println(got.AggregateID, status)
	// Output:
	// i-1 PUBLISHED
}

// An operator requeues an event the relay gave up on (a permanent dispatch
// error; here marked FAILED directly), after a dry run. The note goes in
// front of the event's last error, so the row keeps who did it and why.
func ExampleRequeuer() {
	dsn, drop := pgtest.ExampleDatabase(outbox.Migrations(""))
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	ev, err := outbox.NewEvent(ctx, "order", "o-1", wrapperspb.String("order o-1 placed"))
	if err != nil {
		panic(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Append(ctx, tx, ev) }); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox SET status = 'FAILED', attempts = 1, last_error = 'no route to the provider' WHERE event_id = $1`, ev.ID); err != nil {
		panic(err)
	}

	rq, err := outbox.NewRequeuer()
	if err != nil {
		panic(err)
	}
	req := outbox.RequeueRequest{EventIDs: []uuid.UUID{ev.ID}, Note: "requeued by jdoe, ticket OPS-123", DryRun: true}
	res, err := rq.Requeue(ctx, pool, req)
	if err != nil {
		panic(err)
	}
	fmt.Println("dry run would requeue:", len(res.Requeued))
	req.DryRun = false
	if _, err := rq.Requeue(ctx, pool, req); err != nil {
		panic(err)
	}
	var status, lastError string
	if err := pool.QueryRow(ctx, `SELECT status, last_error FROM outbox WHERE event_id = $1`, ev.ID).Scan(&status, &lastError); err != nil {
		panic(err)
	}
	fmt.Println(status, "|", lastError)
	// Output:
	// dry run would requeue: 1
	// PENDING | requeued by jdoe, ticket OPS-123; was: no route to the provider
}
