// Package admin is billing's operator surface: the one operator API,
// lossless.ops.v1.OperatorService (pkg/operator over OperatorDeps), over
// the billing database's stores: the outbox, the intake's parked messages
// and dead letters (consumer intake), the invoice jobs (pkg/leasequeue:
// list, retry dead ones) and the operator_audit log. The app mounts it
// (operator token from env BILLING_OPERATOR_TOKEN) and the command line
// runs it in process (`billing outbox|parked|dead-letters|jobs|audit ...`,
// operator.RunCLI). Every repair needs a ticket and an actor and is audited
// in operator_audit, dry runs included.
package admin

import (
	"errors"
	"log/slog"

	gpubsub "cloud.google.com/go/pubsub/v2"

	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
)

// EnvOperatorToken names the environment variable holding the operator token.
const EnvOperatorToken = "BILLING_OPERATOR_TOKEN"

// ConsumerIntake names the intake (subscription billing.workorder-events)
// in OperatorService requests and audit actions (intake.replay-parked,
// intake.replay-dead-letters).
const ConsumerIntake = "intake"

// OperatorDeps are the billing database's stores for the one operator API
// (pkg/operator), as the app mounts OperatorService (adding the token) and
// the CLI runs it in process (operator.NewInProcess, operator.RunCLI): the
// outbox, the operator_audit log, the invoice jobs of queue (their unique
// key is the work order id), and the intake's parked messages and dead
// letters, consumed through in (configure it as the live consumer:
// intake.Process, the dedup marker and the invoice job, or parked with the
// reason, so a second replay has no second effect). ps is needed only to
// replay dead letters.
func OperatorDeps(db pgdb.DB, queue *leasequeue.Queue, in *intake.Intake, ps *gpubsub.Client, logger *slog.Logger) (operator.Deps, error) {
	if in == nil || queue == nil {
		return operator.Deps{}, errors.New("admin: OperatorDeps needs the invoice queue and the intake")
	}
	store, err := parked.New()
	if err != nil {
		return operator.Deps{}, err
	}
	return operator.Deps{DB: db, TokenEnv: EnvOperatorToken, Parked: store, Jobs: queue, PubSub: ps, Logger: logger,
		Consumers: []operator.Consumer{
			operator.ConsumerOf(ConsumerIntake, topology.SubWorkOrderEventsDeadLetter, in),
		}}, nil
}
