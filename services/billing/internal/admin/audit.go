package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
