package pgdb_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// A use case runs its transaction with one call and queues its wake-up on
// it: BEGIN rides with the first statement, COMMIT with the last, and the
// NOTIFY follows the COMMIT in the same round trip, outside the business
// transaction. A savepoint that fails keeps the outer transaction.
func ExampleInTx() {
	dsn, drop := pgtest.ExampleDatabase(tables())
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	listener, err := pgx.Connect(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer func() { _ = listener.Close(ctx) }()
	if _, err := listener.Exec(ctx, `LISTEN things`); err != nil {
		panic(err)
	}

	err = pgdb.InTx(ctx, pool, nil, func(tx *pgdb.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1)`, 1); err != nil {
			return err
		}
		// A nested transaction is a savepoint: its failure rolls back only
		// its own writes and wake-ups.
		err := pgdb.InTx(ctx, tx, nil, func(sp *pgdb.Tx) error {
			sp.Notify("things", "never sent")
			_, err := sp.Exec(ctx, `INSERT INTO t VALUES ($1)`, 1) // duplicate key
			return err
		})
		fmt.Println("savepoint rolled back:", err != nil)
		tx.Notify("things", "1")
		tx.AfterCommit(func(context.Context) { fmt.Println("committed") })
		tx.Queue(`INSERT INTO t VALUES ($1)`, 2) // rides with the COMMIT
		return nil
	})
	if err != nil {
		panic(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("woken:", n.Channel, n.Payload)
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&rows); err != nil {
		panic(err)
	}
	fmt.Println("rows:", rows)
	// Output:
	// savepoint rolled back: true
	// committed
	// woken: things 1
	// rows: 2
}
