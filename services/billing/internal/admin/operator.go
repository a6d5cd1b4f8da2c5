package admin

import (
	"errors"
	"log/slog"

	gpubsub "cloud.google.com/go/pubsub/v2"

	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
)

// ConsumerIntake names the intake (subscription billing.workorder-events)
// in OperatorService requests and audit actions (intake.replay-parked,
// intake.replay-dead-letters).
const ConsumerIntake = "intake"

// OperatorDeps are the billing database's stores for the one operator API
// (pkg/operator), as the app mounts OperatorService (adding the token) and
// the CLI runs it in process (operator.NewInProcess, operator.RunCLI): the
// outbox, the operator_audit log, and the intake's parked messages and
// dead letters, consumed through in (configure it as the live consumer:
// intake.Process, the dedup marker and the invoice job, or parked with the
// reason, so a second replay has no second effect). ps is needed only to
// replay dead letters.
func OperatorDeps(db pgdb.DB, in *intake.Intake, ps *gpubsub.Client, logger *slog.Logger) (operator.Deps, error) {
	if in == nil {
		return operator.Deps{}, errors.New("admin: OperatorDeps needs the intake")
	}
	store, err := parked.New()
	if err != nil {
		return operator.Deps{}, err
	}
	return operator.Deps{DB: db, TokenEnv: EnvOperatorToken, Parked: store, PubSub: ps, Logger: logger, Consumers: []operator.Consumer{
		operator.ConsumerOf(ConsumerIntake, topology.SubWorkOrderEventsDeadLetter, in),
	}}, nil
}
