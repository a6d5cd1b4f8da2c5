package api

import (
	"context"
	"errors"
	"log/slog"

	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// AuditLog is the operator API (pkg/operator's OperatorService) as the
// simulator mounts it: ListOperatorAudit reads its operator_audit, the
// fault changes UpdateFaults records, for the console's Audit page and any
// operator with the token. The simulator has no outbox, consumer or parked
// messages, so every other method answers UNIMPLEMENTED.
type AuditLog struct {
	opsv1.UnimplementedOperatorServiceServer
	ops *operator.Service
}

// NewAuditLog returns the audit read over the simulator's database, behind
// the operator token (token from the variable tokenEnv; empty refuses every
// call). Install AuthInterceptor as well, so a call is refused before its
// request is validated.
func NewAuditLog(db pgdb.DB, token, tokenEnv string, logger *slog.Logger) (*AuditLog, error) {
	if db == nil {
		return nil, errors.New("api: NewAuditLog: nil database")
	}
	ops, err := operator.NewService(operator.Deps{DB: db, Token: token, TokenEnv: tokenEnv, Logger: logger})
	if err != nil {
		return nil, err
	}
	return &AuditLog{ops: ops}, nil
}

// ListOperatorAudit implements OperatorService: newest first, filtered and
// paged as every service's (pkg/operator ListAudit).
func (l *AuditLog) ListOperatorAudit(ctx context.Context, req *opsv1.ListOperatorAuditRequest) (*opsv1.ListOperatorAuditResponse, error) {
	return l.ops.ListOperatorAudit(ctx, req)
}
