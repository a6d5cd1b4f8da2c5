package admin

import (
	"context"

	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/outbox"
)

// Page sizes of the operator listings, as the proto's page_size documents
// them (ListOperatorAudit's are operator.DefaultAuditLimit and MaxLimit, the
// same).
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// Outbox returns the read-only view of the service's outbox.
func (o *Ops) Outbox() *outbox.Inspector { return o.outbox }

// ListAudit returns the operator_audit rows matching f, newest first, and
// whether more follow; a filter out of range is
// operator.ErrInvalidAuditFilter.
func (o *Ops) ListAudit(ctx context.Context, f operator.AuditFilter) ([]operator.AuditRecord, bool, error) {
	return operator.ListAudit(ctx, o.deps.Pool, f)
}
