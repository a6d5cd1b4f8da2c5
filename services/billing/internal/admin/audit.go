package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/lossless-dev/lossless/pkg/operator"
)

// ErrInvalidRequest is returned for an operator request that is incomplete
// or out of bounds; nothing was changed.
var ErrInvalidRequest = errors.New("admin: invalid request")

// Authorization names who runs a privileged operation under which change or
// incident ticket; both are required and recorded.
type Authorization struct {
	Ticket, Actor string
}

// Validate reports a missing, overlong or unstorable ticket or actor.
func (a Authorization) Validate() error {
	if err := operator.ValidateAuthorization(a.Ticket, a.Actor); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return nil
}

// ListAudit returns the operator_audit rows matching f, newest first, and
// whether more follow.
func (o *Ops) ListAudit(ctx context.Context, f operator.AuditFilter) ([]operator.AuditRecord, bool, error) {
	records, more, err := operator.ListAudit(ctx, o.db, f)
	if errors.Is(err, operator.ErrInvalidAuditFilter) {
		return nil, false, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return records, more, err
}
