package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/lossless-dev/lossless/pkg/outbox"
)

// Page sizes of the operator listings (ListOutboxEvents, ListOperatorAudit):
// the proto's page_size documents them.
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// Outbox returns the read-only view of the service's outbox.
func (o *Ops) Outbox() *outbox.Inspector { return o.outbox }

// AuditRecord is one operator_audit row.
type AuditRecord struct {
	ID         int64
	Action     string
	Actor      string
	Ticket     string
	DryRun     bool
	Params     map[string]any
	Affected   int
	OccurredAt time.Time
}

// AuditFilter selects operator_audit rows; empty fields match all.
type AuditFilter struct {
	Action, Actor, Ticket string
	// BeforeID pages backwards: only rows with a smaller id (0: from the newest).
	BeforeID int64
	// Limit caps the result; 0 means 50, at most 500.
	Limit int
}

// ErrInvalidFilter refuses a listing filter out of range.
var ErrInvalidFilter = errors.New("admin: invalid filter")

// listOperatorAudit reads the log newest first, by its primary key. The log
// grows by operator actions only (a few a day), so the optional filters are
// plain conditions rather than indexes.
const listOperatorAudit = `
SELECT id, action, actor, ticket, dry_run, params, affected, occurred_at
FROM operator_audit
WHERE ($1 = '' OR action = $1) AND ($2 = '' OR actor = $2) AND ($3 = '' OR ticket = $3)
  AND ($4 = 0 OR id < $4)
ORDER BY id DESC
LIMIT $5`

// ListAudit returns the operator_audit rows matching f, newest first, and
// whether more follow.
func (o *Ops) ListAudit(ctx context.Context, f AuditFilter) (records []AuditRecord, more bool, err error) {
	switch {
	case f.Limit < 0 || f.Limit > maxPageSize || f.BeforeID < 0:
		return nil, false, fmt.Errorf("%w: limit %d (0..%d), before id %d", ErrInvalidFilter, f.Limit, maxPageSize, f.BeforeID)
	case f.Limit == 0:
		f.Limit = defaultPageSize
	}
	rows, err := o.deps.Pool.Query(ctx, listOperatorAudit, f.Action, f.Actor, f.Ticket, f.BeforeID, f.Limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("admin: list audit: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var r AuditRecord
		var params []byte
		if err := rows.Scan(&r.ID, &r.Action, &r.Actor, &r.Ticket, &r.DryRun, &params, &r.Affected, &r.OccurredAt); err != nil {
			return nil, false, fmt.Errorf("admin: list audit: %w", err)
		}
		if err := json.Unmarshal(params, &r.Params); err != nil {
			return nil, false, fmt.Errorf("admin: audit row %d params: %w", r.ID, err)
		}
		records = append(records, r)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("admin: list audit: %w", err)
	}
	if len(records) > f.Limit {
		return records[:f.Limit], true, nil
	}
	return records, false, nil
}
