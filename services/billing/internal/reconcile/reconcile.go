// Package reconcile finds discrepancies in billing's own database between
// the invoice jobs, the invoices and the intake (consumed and parked
// messages), and across services between billing's invoices and the
// work-order service's orders (through its API: billing never reads the
// work-order database). On a healthy system both return nothing.
// docs/runbooks/billing-jobs-dead-or-stuck.md explains each kind.
package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// Discrepancy is one finding.
type Discrepancy struct {
	Kind        string `json:"kind"`
	WorkOrderID string `json:"work_order_id,omitempty"`
	JobID       int64  `json:"job_id,omitempty"`
	InvoiceID   string `json:"invoice_id,omitempty"`
	Detail      string `json:"detail"`
}

// Kinds found by Local.
const (
	// An invoice job finished but its order has no invoice.
	KindJobDoneWithoutInvoice = "job_done_without_invoice"
	// An invoice exists but the job that issued it is not done (or missing).
	KindInvoiceWithoutDoneJob = "invoice_without_done_job"
	// A job is parked (dead) and waits for an operator.
	KindJobDead = "job_dead"
	// A running job's lease expired longer ago than the rescue should take.
	KindLeaseExpiredNotRescued = "lease_expired_not_rescued"
	// A due job has waited longer than the threshold: no worker is claiming.
	KindJobWaiting = "job_waiting_too_long"
	// A consumed message was parked (poison or invalid).
	KindMessageParked = "message_parked"
	// An InvoiceIssued outbox row failed permanently: workorder never hears of the invoice.
	KindInvoiceEventFailed = "invoice_event_failed"
)

// LocalSQL is the in-database reconciliation, as run by `billing reconcile`
// and quoted in the runbook. $1 is the queue name, $2 the time now, $3 the
// tolerated age of expired leases and waiting jobs (interval).
const LocalSQL = `
-- A done job must have produced its order's invoice (one invoice per order).
SELECT 'job_done_without_invoice' AS kind, j.unique_key AS work_order_id, j.id AS job_id,
       NULL::text AS invoice_id, 'job finished ' || j.finished_at AS detail
FROM leasequeue_jobs j
WHERE j.queue = $1 AND j.state = 'done'
  AND NOT EXISTS (SELECT 1 FROM invoices i WHERE i.work_order_id::text = j.unique_key)
UNION ALL
-- An invoice is only written by its job's fenced completion.
SELECT 'invoice_without_done_job', i.work_order_id::text, i.job_id, i.id::text,
       'job state ' || coalesce(j.state, 'missing')
FROM invoices i LEFT JOIN leasequeue_jobs j ON j.id = i.job_id
WHERE j.state IS DISTINCT FROM 'done'
UNION ALL
SELECT 'job_dead', j.unique_key, j.id, NULL, coalesce(j.last_error, '')
FROM leasequeue_jobs j WHERE j.queue = $1 AND j.state = 'dead'
UNION ALL
SELECT 'lease_expired_not_rescued', j.unique_key, j.id, NULL,
       'owner ' || j.lease_owner || ', lease expired ' || j.due_at
FROM leasequeue_jobs j WHERE j.queue = $1 AND j.state = 'running' AND j.due_at < $2::timestamptz - $3::interval
UNION ALL
SELECT 'job_waiting_too_long', j.unique_key, j.id, NULL, 'due since ' || j.due_at
FROM leasequeue_jobs j WHERE j.queue = $1 AND j.state = 'available' AND j.due_at < $2::timestamptz - $3::interval
UNION ALL
SELECT 'message_parked', NULL, NULL, NULL,
       'parked message ' || p.id || ' (' || p.subscription || '/' || p.message_id || '): ' || p.reason
FROM parked_messages p WHERE p.replayed_at IS NULL -- a replayed message was repaired
UNION ALL
SELECT 'invoice_event_failed', o.aggregate_id, NULL, NULL,
       'outbox event ' || o.event_id || ': ' || coalesce(o.last_error, '')
FROM outbox o WHERE o.status = 'FAILED'
ORDER BY 1, 2`

// Local runs LocalSQL. tolerance is how old an expired lease or a waiting
// job may be before it counts (default 5m: well above the rescue interval
// and a busy queue's normal wait).
func Local(ctx context.Context, db pgdb.Executor, queue string, now time.Time, tolerance time.Duration) ([]Discrepancy, error) {
	if tolerance <= 0 {
		tolerance = 5 * time.Minute
	}
	rows, err := db.Query(ctx, LocalSQL, queue, now, tolerance)
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Discrepancy, error) {
		var d Discrepancy
		var wo, inv *string
		var job *int64
		err := r.Scan(&d.Kind, &wo, &job, &inv, &d.Detail)
		if wo != nil {
			d.WorkOrderID = *wo
		}
		if job != nil {
			d.JobID = *job
		}
		if inv != nil {
			d.InvoiceID = *inv
		}
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	return out, nil
}
