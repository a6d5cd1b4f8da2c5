package outbox

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// The lock claim: a batch of due rows locked (FOR UPDATE SKIP LOCKED) in the
// transaction that ProcessBatch holds across their dispatch and that records
// their outcome (qClaim says why the statement is shaped as it is). The
// locks are the claim: a relay that dies loses its transaction, and its rows
// are claimable again at once. A keyset cursor keeps the claim off the dead
// index entries of published rows; a NOTIFY rewinds it (wake.go), and a
// sweep from the start of the index every SweepInterval finds what it
// stepped over. Slow types are left to the lease claim (lease.go).

type claimedRow struct {
	tid pgtype.TID // physical address, stable while the claim holds the row lock
	id  int64
	ev  Event
}

// claim begins tx and claims a batch in it, in one round trip.
func (r *Relay) claim(ctx context.Context, tx *pgdb.Tx, now time.Time) ([]claimedRow, int, error) {
	from := r.cursor
	if rw := r.rewind.Swap(math.MaxInt64); rw-1 < from {
		from = rw - 1 // a late commit behind the cursor: go back for it
	}
	sweep := now.Sub(r.lastSweep) >= max(r.sweepGap, r.cfg.SweepInterval) || now.Before(r.lastSweep)
	if sweep {
		from = 0
		// A sweep walks the dead index entries of every row published since
		// vacuum last ran; while a long transaction holds vacuum back, that
		// walk grows to seconds. Spacing sweeps by four times their duration
		// keeps them under a fifth of the relay's time, instead of every
		// claim becoming a sweep (B2 measured the relay at ~1% of its rate
		// that way).
		defer func() {
			done := r.now()
			r.lastSweep, r.sweepGap = done, 4*done.Sub(now)
		}()
	}
	excluded := r.unclaimable(now)
	for _, typ := range r.excluded {
		if !slices.Contains(excluded, typ) {
			// A probe is due (or the circuit closed): the type's rows lie
			// behind the cursor, which moved on while they were excluded.
			from = 0
			break
		}
	}
	r.excluded = excluded
	if len(r.slowTypes) > 0 {
		excluded = slices.Concat(excluded, r.slowTypes) // leased by slowLoop
	}
	var (
		out       []claimedRow
		scanned   int
		scannedTo = from
	)
	b := &pgx.Batch{}
	b.Queue(r.q.claim, from, r.cfg.BatchSize, now, excluded).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var (
				row       claimedRow
				sv, att   int32
				headers   []byte
				claimable bool
			)
			ev := &row.ev
			if err := rows.Scan(&row.tid, &row.id, &ev.ID, &ev.AggregateType, &ev.AggregateID, &ev.Type, &sv,
				&ev.Payload, &headers, &ev.OccurredAt, &att, &claimable); err != nil {
				return fmt.Errorf("scan: %w", err)
			}
			scanned++
			scannedTo = row.id
			if !claimable {
				continue // behind an earlier event of its aggregate
			}
			ev.SchemaVersion, ev.Attempts = int(sv), int(att)
			var err error
			if ev.Headers, err = decodeHeaders(headers); err != nil {
				r.log.Warn("outbox event with unreadable headers; dispatching without them", "event_id", ev.ID, "error", err)
			}
			out = append(out, row)
		}
		return rows.Err()
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, 0, fmt.Errorf("outbox: claim: %w", err)
	}
	// Move the cursor past everything scanned, claimed or not: skipped rows
	// (locked by another relay, blocked behind their aggregate) are another
	// relay's or the next sweep's. A sweep that found nothing keeps the
	// cursor where it was.
	if scannedTo > r.cursor || scanned > 0 {
		r.cursor = scannedTo
	}
	return out, scanned, nil
}
