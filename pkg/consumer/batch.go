package consumer

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/retry"
)

// A batch's messages share one savepoint name: each message's savepoint is
// released in the round trip that sets the next one's (before it), so at
// most one is open at any time, and the last one is released by the
// COMMIT.
const (
	qSavepoint  = `SAVEPOINT consumer_message`
	qRelease    = `RELEASE SAVEPOINT consumer_message`
	qRollbackTo = `ROLLBACK TO SAVEPOINT consumer_message`
)

// commit handles ms in one transaction, pipelined (a pgdb.Tx, ADR 0023):
// the BEGIN travels with the first message's savepoint and marker claim,
// each later message's savepoint and claim with the release of the
// previous one, and the COMMIT with the wake-ups Apply announced
// (pgnotify.Notify), which go out after the commit.
func (c *Consumer[T]) commit(ctx context.Context, ms []*pubsub.Received, vs []envelope.Verdict[T]) ([]string, error) {
	outcomes := make([]string, len(ms))
	b := &batchTx[T]{c: c}
	for i, m := range ms {
		var err error
		if outcomes[i], err = b.handle(ctx, m, vs[i]); err != nil {
			b.rollback(ctx)
			return nil, err
		}
	}
	if err := b.tx.Commit(ctx); err != nil {
		b.rollback(ctx)
		return nil, err
	}
	return outcomes, nil
}

// batchTx is the transaction of one batch, begun with its first
// statements.
type batchTx[T envelope.Event] struct {
	c     *Consumer[T]
	tx    *pgdb.Tx
	saved bool // a message's savepoint is open: the next message releases it
}

// send sends b in the transaction, beginning it with b when it has not
// begun yet: a failure of that first batch leaves nothing open.
func (b *batchTx[T]) send(ctx context.Context, batch *pgx.Batch) error {
	if b.tx != nil {
		return b.tx.SendBatch(ctx, batch).Close()
	}
	tx, err := pgdb.Begin(ctx, b.c.db, b.c.logger)
	if err != nil {
		return err
	}
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		_ = tx.Rollback(ctx) // the BEGIN's batch failed: nothing left open
		return err
	}
	b.tx = tx
	return nil
}

func (b *batchTx[T]) rollback(ctx context.Context) {
	if b.tx != nil {
		_ = b.tx.Rollback(ctx)
	}
}

// handle consumes m in the transaction under its savepoint: refused by
// Apply or by the database, its effects and its marker roll back to the
// savepoint and it is parked in the transaction, with its batch-mates'
// effects (what parked.Isolate does, its statements pipelined).
func (b *batchTx[T]) handle(ctx context.Context, m *pubsub.Received, v envelope.Verdict[T]) (string, error) {
	c := b.c
	if !v.Accepted() {
		if err := b.send(ctx, &pgx.Batch{}); err != nil {
			return "", err
		}
		return c.park(ctx, b.tx, m, v.Event, v.Outcome(OutcomeParked, OutcomeUnknownType), v.Reason())
	}
	batch := &pgx.Batch{}
	if b.saved {
		batch.Queue(qRelease)
	}
	batch.Queue(qSavepoint)
	cl, err := c.markers.queueClaim(batch, c.marker(m, v.Event))
	if err != nil {
		return "", err
	}
	began := b.tx != nil
	if err := b.send(ctx, batch); err != nil {
		// The database refused the marker itself (pgdb.IsData): in a
		// transaction begun before, the savepoint preceding the claim
		// isolates it; the first message's failed BEGIN batch left nothing
		// open, so the message is parked in a transaction begun anew.
		reason, ok := parked.Reason(err)
		if !ok {
			return "", err
		}
		if !began {
			if err := b.send(ctx, &pgx.Batch{}); err != nil {
				return "", err
			}
			return c.park(ctx, b.tx, m, v.Event, OutcomeParked, reason)
		}
		b.saved = true
		return b.refuse(ctx, m, v.Event, reason)
	}
	b.saved = true
	outcome, err := c.applyClaimed(ctx, b.tx, cl, m, v.Event)
	if err == nil {
		return outcome, nil
	}
	if retry.IsPermanent(err) {
		err = parked.Refuse(err.Error())
	}
	reason, ok := parked.Reason(err)
	if !ok {
		return "", err
	}
	return b.refuse(ctx, m, v.Event, reason)
}

// refuse rolls the open savepoint back (the message's marker and effects)
// and parks m with reason.
func (b *batchTx[T]) refuse(ctx context.Context, m *pubsub.Received, ev T, reason string) (string, error) {
	if _, err := b.tx.Exec(ctx, qRollbackTo); err != nil {
		return "", err
	}
	return b.c.park(ctx, b.tx, m, ev, OutcomeParked, reason)
}
