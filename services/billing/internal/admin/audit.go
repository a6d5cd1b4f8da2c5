package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgtext"
)

// ErrInvalidRequest is returned for an operator request that is incomplete
// or out of bounds; nothing was changed.
var ErrInvalidRequest = errors.New("admin: invalid request")

// maxAuditLength is operator_audit's CHECK limit of ticket and actor, in
// characters.
const maxAuditLength = 200

// Authorization names who runs a privileged operation under which change or
// incident ticket; both are required and recorded.
type Authorization struct {
	Ticket, Actor string
}

// Validate reports a missing, overlong or unstorable ticket or actor.
func (a Authorization) Validate() error {
	var errs []error
	for _, f := range [...]struct{ name, v string }{{"ticket", a.Ticket}, {"actor", a.Actor}} {
		name, v := f.name, f.v
		switch {
		case strings.TrimSpace(v) == "":
			errs = append(errs, fmt.Errorf("%s is required", name))
		case utf8.RuneCountInString(v) > maxAuditLength:
			errs = append(errs, fmt.Errorf("%s: at most %d characters", name, maxAuditLength))
		case pgtext.Problem(v) != "":
			errs = append(errs, fmt.Errorf("%s %s", name, pgtext.Problem(v)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return nil
}

// insertOperatorAudit writes billing's audit log
// (migrations/billing/00002_operator_audit.sql).
const insertOperatorAudit = `
INSERT INTO operator_audit (action, actor, ticket, dry_run, params, affected)
VALUES ($1, $2, $3, $4, $5, $6)`

// audit records one privileged action in tx.
func audit(ctx context.Context, tx pgx.Tx, action string, a Authorization, dryRun bool, params map[string]any, affected int) error {
	p, err := json.Marshal(params)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, insertOperatorAudit, action, strings.TrimSpace(a.Actor), strings.TrimSpace(a.Ticket), dryRun, p, affected)
	if err != nil {
		return fmt.Errorf("admin: audit %s: %w", action, err)
	}
	return nil
}

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
	// BeforeID pages backwards: only rows with a smaller id (0: from the
	// newest).
	BeforeID int64
	// Limit caps the result; 0 means 50, at most 500.
	Limit int
}

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
		return nil, false, fmt.Errorf("%w: limit %d (0..%d), before id %d", ErrInvalidRequest, f.Limit, maxPageSize, f.BeforeID)
	case f.Limit == 0:
		f.Limit = defaultPageSize
	}
	rows, err := o.db.Query(ctx, listOperatorAudit, f.Action, f.Actor, f.Ticket, f.BeforeID, f.Limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("admin: list audit: %w", err)
	}
	records, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditRecord, error) {
		var a AuditRecord
		var params []byte
		if err := r.Scan(&a.ID, &a.Action, &a.Actor, &a.Ticket, &a.DryRun, &params, &a.Affected, &a.OccurredAt); err != nil {
			return a, err
		}
		return a, json.Unmarshal(params, &a.Params)
	})
	if err != nil {
		return nil, false, fmt.Errorf("admin: list audit: %w", err)
	}
	if len(records) > f.Limit {
		return records[:f.Limit], true, nil
	}
	return records, false, nil
}
