// The operator audit (table operator_audit): the services'
// log of privileged operator actions,
// one row per privileged operator action (replay, requeue, retry,
// re-hand-off), dry runs included, saying who acted under which ticket with
// which parameters and how many rows it touched. The work-order and billing
// databases each have the table in the same shape
// (migrations/workorder/00002_operations.sql,
// migrations/billing/00002_operator_audit.sql); this package's tests fail
// when the two differ.
//
// An action writes its row in the transaction of its effect (WriteAudit takes
// that transaction), so no action commits unaudited. InSavepoint runs an action's effect so that a dry run
// rolls the effect back and still commits the audit row.

package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtext"
)

// MaxAuditLength is the CHECK limit of ticket and actor, in characters.
const MaxAuditLength = 200

// Bounds of AuditFilter.Limit.
const (
	DefaultAuditLimit = 50
	MaxAuditLimit     = 500
)

var (
	// ErrInvalidAuditEntry refuses an AuditEntry without an action, or with a
	// missing, overlong or unstorable ticket or actor; nothing was written.
	ErrInvalidAuditEntry = errors.New("operator: invalid entry")
	// ErrInvalidAuditFilter refuses a AuditFilter out of range.
	ErrInvalidAuditFilter = errors.New("operator: invalid filter")
	// ErrNoOperator refuses an AuditEntry without an actor because no guard
	// verified an operator for the call (UNAUTHENTICATED); it wraps
	// ErrInvalidAuditEntry.
	ErrNoOperator = fmt.Errorf("%w: actor is required: no verified operator", ErrInvalidAuditEntry)
)

// AuditEntry is one privileged action to record.
type AuditEntry struct {
	// Action names it, e.g. "outbox.requeue" or "intake.replay-parked" (required).
	Action string
	// Actor is who acted and Ticket the change or incident it was done
	// under (both required, at most MaxAuditLength characters; trimmed).
	// The operator a Guard verified for ctx (PrincipalFrom) replaces Actor:
	// a service leaves Actor empty and puts its request's own actor field in
	// StatedActor, so a request never names who is recorded.
	Actor, Ticket string
	// StatedActor is the actor a request stated (free text, optional, at
	// most MaxAuditLength characters): kept in Params as "stated_actor"
	// when it differs from the recorded actor.
	StatedActor string
	// DryRun: the action reported what it would do and changed nothing.
	DryRun bool
	// Params are the request's parameters and results, stored as JSON.
	Params map[string]any
	// Affected counts the rows changed (on a dry run: that would be).
	Affected int
}

// ValidateAuthorization reports a missing, overlong or unstorable ticket or
// actor, naming the field. A service calls it to refuse a request before
// doing anything. The request's actor stays required for compatibility but
// is only stated: the verified operator is recorded (AuditEntry).
func ValidateAuthorization(ticket, actor string) error {
	return joinViolations(AuthorizationViolations("", ticket, actor))
}

func joinViolations(vs []apierror.Violation) error {
	var errs []error
	for _, v := range vs {
		errs = append(errs, fmt.Errorf("%s %s", v.Field, v.Description))
	}
	return errors.Join(errs...)
}

// AuthorizationViolations is ValidateAuthorization's check as one field
// violation per bad field, named prefix+"ticket" and prefix+"actor" (prefix
// e.g. "authorization."), for an INVALID_ARGUMENT answer
// (apierror.InvalidArgument). Empty when both are valid.
func AuthorizationViolations(prefix, ticket, actor string) []apierror.Violation {
	return violations(prefix, ticket, actor, true)
}

func violations(prefix, ticket, actor string, actorRequired bool) []apierror.Violation {
	var vs []apierror.Violation
	for _, f := range [...]struct {
		name, v  string
		required bool
	}{{"ticket", ticket, true}, {"actor", actor, actorRequired}} {
		var problem string
		switch v := strings.TrimSpace(f.v); {
		case v == "" && !f.required:
		case v == "":
			problem = "is required"
		case utf8.RuneCountInString(v) > MaxAuditLength:
			problem = fmt.Sprintf("must be at most %d characters", MaxAuditLength)
		default:
			problem = pgtext.Problem(v)
		}
		if problem != "" {
			vs = append(vs, apierror.Violation{Field: prefix + f.name, Description: problem})
		}
	}
	return vs
}

// insertEntry writes one row; id and occurred_at are the table's.
const insertEntry = `
INSERT INTO operator_audit (action, actor, ticket, dry_run, params, affected)
VALUES ($1, $2, $3, $4, $5, $6)`

// WriteAudit records e through tx, normally the transaction of the action, so
// that the row exists if and only if the action committed. The actor is the
// operator verified for ctx (PrincipalFrom), else e.Actor; neither is
// ErrNoOperator. Ticket and actor are stored trimmed.
func WriteAudit(ctx context.Context, tx pgdb.Executor, e AuditEntry) error {
	if p, ok := PrincipalFrom(ctx); ok {
		e.Actor = p
	}
	if strings.TrimSpace(e.Actor) == "" {
		return ErrNoOperator
	}
	if stated := strings.TrimSpace(e.StatedActor); stated != "" && stated != strings.TrimSpace(e.Actor) {
		e.Params = maps.Clone(e.Params)
		if e.Params == nil {
			e.Params = map[string]any{}
		}
		e.Params["stated_actor"] = stated
	}
	err := joinViolations(violations("", e.Ticket, e.Actor, true))
	if v := violations("stated_", "-", e.StatedActor, false); len(v) > 0 {
		err = errors.Join(err, joinViolations(v))
	}
	if strings.TrimSpace(e.Action) == "" {
		err = errors.Join(err, errors.New("action is required"))
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidAuditEntry, err)
	}
	p, err := json.Marshal(e.Params)
	if err != nil {
		return fmt.Errorf("operator: %s params: %w", e.Action, err)
	}
	_, err = tx.Exec(ctx, insertEntry, e.Action, strings.TrimSpace(e.Actor), strings.TrimSpace(e.Ticket), e.DryRun, p, e.Affected)
	if err != nil {
		return fmt.Errorf("operator: write %s: %w", e.Action, err)
	}
	return nil
}

// InSavepoint runs fn, an action's effect, under a savepoint of tx and
// keeps its effect, or on a dry run rolls back to the savepoint, leaving tx
// usable for the audit row (Write) that records the dry run. An error of
// fn rolls back to the savepoint and is returned as it is; the caller's
// transaction then normally rolls back, audit row and all.
func InSavepoint(ctx context.Context, tx pgx.Tx, dryRun bool, fn func(pgx.Tx) error) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(sp); err != nil {
		// fn's error is the one to report; a failed rollback leaves tx
		// aborted, which its next statement reports.
		_ = sp.Rollback(ctx)
		return err
	}
	if dryRun {
		return sp.Rollback(ctx)
	}
	return sp.Commit(ctx)
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
	// Limit caps the result; 0 means DefaultAuditLimit, at most MaxAuditLimit.
	Limit int
}

// listEntries reads the log newest first, by its primary key. The log grows
// by operator actions only (a few a day), so the optional filters are plain
// conditions rather than indexes.
const listEntries = `
SELECT id, action, actor, ticket, dry_run, params, affected, occurred_at
FROM operator_audit
WHERE ($1 = '' OR action = $1) AND ($2 = '' OR actor = $2) AND ($3 = '' OR ticket = $3)
  AND ($4 = 0 OR id < $4)
ORDER BY id DESC
LIMIT $5`

// ListAudit returns the rows matching f, newest first, and whether more follow.
func ListAudit(ctx context.Context, db pgdb.Executor, f AuditFilter) (records []AuditRecord, more bool, err error) {
	switch {
	case f.Limit < 0 || f.Limit > MaxAuditLimit || f.BeforeID < 0:
		return nil, false, fmt.Errorf("%w: limit %d (0..%d), before id %d", ErrInvalidAuditFilter, f.Limit, MaxAuditLimit, f.BeforeID)
	case f.Limit == 0:
		f.Limit = DefaultAuditLimit
	}
	// One more than asked for tells whether more follow.
	rows, err := db.Query(ctx, listEntries, f.Action, f.Actor, f.Ticket, f.BeforeID, f.Limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("operator: list: %w", err)
	}
	records, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditRecord, error) {
		var a AuditRecord
		var params []byte
		if err := r.Scan(&a.ID, &a.Action, &a.Actor, &a.Ticket, &a.DryRun, &params, &a.Affected, &a.OccurredAt); err != nil {
			return a, err
		}
		if err := json.Unmarshal(params, &a.Params); err != nil {
			return a, fmt.Errorf("row %d params: %w", a.ID, err)
		}
		return a, nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("operator: list: %w", err)
	}
	if len(records) > f.Limit {
		return records[:f.Limit], true, nil
	}
	return records, false, nil
}
