package operator

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/envelope"
)

// ConsumerOf is the Consumer of a pkg/consumer consumer c, configured as the
// live one: dead letters go through c.Process, parked messages through
// c.Replay in the operator's transaction (a dry run rolls it back), and a
// message c still refuses is ErrStillRefused.
func ConsumerOf[T envelope.Event](name, deadLetterSubscription string, c *consumer.Consumer[T]) Consumer {
	return Consumer{Name: name, DeadLetterSubscription: deadLetterSubscription, Process: c.Process,
		Replay: func(ctx context.Context, tx pgx.Tx, id int64, ticket, actor string) (string, error) {
			outcome, err := c.Replay(ctx, tx, id, ticket, actor)
			if errors.Is(err, consumer.ErrStillRefused) {
				return "", fmt.Errorf("%w: %w", ErrStillRefused, err)
			}
			return outcome, err
		}}
}
