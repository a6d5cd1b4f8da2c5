package admin

import (
	"context"

	"github.com/lossless-dev/lossless/internal/operatoraudit"
	"github.com/lossless-dev/lossless/pkg/outbox"
)

// Page sizes of the operator listings, as the proto's page_size documents
// them (ListOperatorAudit's are operatoraudit.DefaultLimit and MaxLimit, the
// same).
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// Outbox returns the read-only view of the service's outbox.
func (o *Ops) Outbox() *outbox.Inspector { return o.outbox }

// ListAudit returns the operator_audit rows matching f, newest first, and
// whether more follow; a filter out of range is
// operatoraudit.ErrInvalidFilter.
func (o *Ops) ListAudit(ctx context.Context, f operatoraudit.Filter) ([]operatoraudit.Record, bool, error) {
	return operatoraudit.List(ctx, o.deps.Pool, f)
}
