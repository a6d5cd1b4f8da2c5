package admin

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/inbox"
)

// insertOperatorAudit writes the service's one audit log
// (migrations/workorder/00002_operations.sql).
const insertOperatorAudit = `
INSERT INTO operator_audit (action, actor, ticket, dry_run, params, affected)
VALUES ($1, $2, $3, $4, $5, $6)`

// operatorAudit records rec in tx, the transaction of the action. The
// inbox's operator actions reach it through inbox.WithAudit, so they land in
// operator_audit next to the service's own, not in inbox_audit.
func operatorAudit(ctx context.Context, tx pgx.Tx, rec inbox.AuditRecord) error {
	p, err := json.Marshal(rec.Params)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, insertOperatorAudit, rec.Action, rec.Actor, rec.Ticket, rec.DryRun, p, rec.Affected)
	return err
}

// audit records one of the service's own privileged actions in tx.
func audit(ctx context.Context, tx pgx.Tx, action string, auth inbox.Authorization, dryRun bool, params map[string]any, affected int) error {
	return operatorAudit(ctx, tx, inbox.AuditRecord{Action: action, Authorization: auth, DryRun: dryRun, Params: params, Affected: affected})
}
