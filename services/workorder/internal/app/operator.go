package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/services/workorder/internal/admin"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
)

// operatorService builds the one operator API (pkg/operator) over the
// work-order database: its outbox, the operator_audit log, and the
// InvoiceIssued consumer's parked messages and dead letters (consumer
// invoicing), replayed through inv, configured as the live consumer.
func (a *App) operatorService(pool *pgxpool.Pool, inv *invoicing.Invoicing) (*operator.Service, error) {
	store, err := parked.New()
	if err != nil {
		return nil, err
	}
	dlSub := topology.SubBillingEventsDeadLetter
	return operator.NewService(operator.Deps{DB: pool, Token: a.cfg.OperatorToken, TokenEnv: admin.EnvOperatorToken,
		Parked: store, PubSub: a.ps, Logger: a.log.With("component", "operator"), Consumers: []operator.Consumer{{
			Name: "invoicing", DeadLetterSubscription: dlSub, Process: inv.Process,
			Replay: func(ctx context.Context, tx pgx.Tx, id int64, ticket, actor string) (string, error) {
				outcome, err := inv.Replay(ctx, tx, id, ticket, actor)
				if errors.Is(err, invoicing.ErrStillRefused) {
					return "", fmt.Errorf("%w: %w", operator.ErrStillRefused, err)
				}
				return outcome, err
			},
		}}})
}
