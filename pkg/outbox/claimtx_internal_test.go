package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// qMarkPublished goes out in one batch with the COMMIT, which runs before
// the relay reads any result: a shortfall (a row given that does not move)
// must fail the statement in the server, so that the batch is not
// committed.
func TestMarkPublishedShortfallIsNotCommitted(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, Migrations(""))
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE marker (n int)`); err != nil {
		t.Fatal(err)
	}
	tx, err := pgdb.Begin(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO marker VALUES ($1)`, 1); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	queueExec(b, "mark published", newQueries(DefaultSchema).markPublished,
		[]pgtype.TID{{BlockNumber: 4242, OffsetNumber: 1, Valid: true}}, time.Now())
	err = tx.CommitWith(ctx, b)
	if err == nil || !strings.Contains(err.Error(), "moved 0 of 1 locked rows") {
		t.Fatalf("commit after a shortfall: %v, want the shortfall", err)
	}
	if tx.Closed() {
		t.Fatal("transaction reported closed: the COMMIT ran")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM marker`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("marker rows %d (%v): the batch committed", n, err)
	}
}
