package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// DeadLetterMonitorConfig tunes the DeadLetterMonitor.
type DeadLetterMonitorConfig struct {
	// Subscriptions are the dead-letter inspection subscriptions to watch
	// (e.g. SubWorkOrderCompletedDeadLetter). Required.
	Subscriptions []string
	// Interval between two counts. Default 30s: dead letters only appear
	// after a consumer failed for a long time (100 deliveries), so minutes of
	// detection delay are irrelevant, and each count briefly leases messages.
	Interval time.Duration
	// Limit caps one count: the gauge reads Limit when at least Limit
	// messages wait. Default 1000 (one Pull's maximum); beyond it the exact
	// number does not change the alert or the runbook.
	Limit int
	// PullTimeout bounds each Pull of a count. Real Pub/Sub holds a Pull on
	// an empty subscription for a while before answering; the count treats a
	// timeout as "no more messages". Default 2s.
	PullTimeout time.Duration
}

// Validate reports impossible settings.
func (c DeadLetterMonitorConfig) Validate() error {
	var errs []error
	if len(c.Subscriptions) == 0 {
		errs = append(errs, errors.New("dead-letter monitor: no subscription"))
	}
	for _, s := range c.Subscriptions {
		if err := validateID(s); err != nil {
			errs = append(errs, fmt.Errorf("dead-letter monitor: %w", err))
		}
	}
	if c.Interval < 0 || c.PullTimeout < 0 || c.Limit < 0 || c.Limit > 1000 {
		errs = append(errs, errors.New("dead-letter monitor: Interval and PullTimeout must not be negative, Limit within [0, 1000]"))
	}
	return errors.Join(errs...)
}

// DeadLetterMonitor exports pubsub.dead_letter.depth{subscription}: how many
// messages wait on each dead-letter inspection subscription (I7).
//
// On real Pub/Sub the authoritative number is Cloud Monitoring's
// pubsub.googleapis.com/subscription/num_undelivered_messages; alert on that
// in production (it needs no pulling). Neither emulator has an API that
// reports a backlog, so this monitor counts by peeking: it pulls up to Limit
// messages, holding each batch under the minimum ack deadline so a message is
// never counted twice, then nacks them all at once (ModifyAckDeadline 0): they
// are redelivered unchanged and never acked here.
//
// The trade-off of peeking, accepted for a gauge refreshed every Interval:
//   - during a count (milliseconds, at most a few PullTimeouts) the messages
//     are leased: an operator's replay pulling at that moment sees fewer, and
//     simply pulls again;
//   - each count is a delivery, so delivery_attempt on the inspection
//     subscription grows; it has no dead-letter policy of its own, so nothing
//     is forwarded or lost because of it;
//   - if the process dies mid-count, the lease (10 s) simply expires.
type DeadLetterMonitor struct {
	client *gpubsub.Client
	cfg    DeadLetterMonitorConfig
	logger *slog.Logger

	mu    sync.Mutex
	depth map[string]int64
}

// NewDeadLetterMonitor registers the gauge on meter (nil: no metrics).
func NewDeadLetterMonitor(c *gpubsub.Client, cfg DeadLetterMonitorConfig, logger *slog.Logger, meter metric.Meter) (*DeadLetterMonitor, error) {
	if c == nil || logger == nil {
		return nil, errors.New("pubsub: NewDeadLetterMonitor needs a client and a logger")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	setDefault(&cfg.Interval, 30*time.Second)
	setDefault(&cfg.Limit, 1000)
	setDefault(&cfg.PullTimeout, 2*time.Second)
	meter = telemetry.MeterOrNoop(meter)
	m := &DeadLetterMonitor{client: c, cfg: cfg, logger: logger, depth: map[string]int64{}}
	gauge, err := meter.Int64ObservableGauge("pubsub.dead_letter.depth",
		metric.WithDescription("Messages waiting on a dead-letter inspection subscription, counted by peeking every interval (capped). Alert on any."))
	if err != nil {
		return nil, err
	}
	if _, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		for sub, n := range m.depth {
			o.ObserveInt64(gauge, n, metric.WithAttributes(attribute.String("subscription", sub)))
		}
		return nil
	}, gauge); err != nil {
		return nil, err
	}
	return m, nil
}

// Run counts every Interval until ctx is cancelled.
func (m *DeadLetterMonitor) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		for _, sub := range m.cfg.Subscriptions {
			if _, err := m.Count(ctx, sub); err != nil && ctx.Err() == nil {
				m.logger.WarnContext(ctx, "dead-letter monitor: count failed", "subscription", sub, "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Count peeks at subscription (see DeadLetterMonitor), records the result
// for the gauge and returns it.
func (m *DeadLetterMonitor) Count(ctx context.Context, subscription string) (int64, error) {
	name := SubscriptionName(m.client.Project(), subscription)
	seen := map[string]bool{}
	var ackIDs []string
	// Nack whatever was pulled, whatever happens below; detached from ctx so
	// a shutdown mid-count does not leave messages leased.
	defer func() {
		if len(ackIDs) == 0 {
			return
		}
		nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := m.client.SubscriptionAdminClient.ModifyAckDeadline(nctx, &pubsubpb.ModifyAckDeadlineRequest{
			Subscription: name, AckIds: ackIDs, AckDeadlineSeconds: 0,
		}); err != nil {
			m.logger.WarnContext(ctx, "dead-letter monitor: releasing peeked messages failed; they return after their ack deadline",
				"subscription", subscription, "error", err)
		}
	}()
	for len(seen) < m.cfg.Limit {
		pctx, cancel := context.WithTimeout(ctx, m.cfg.PullTimeout)
		resp, err := m.client.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{
			Subscription: name,
			MaxMessages:  int32(m.cfg.Limit - len(seen)),
		})
		cancel()
		if status.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil {
			break // nothing more arrived within PullTimeout
		}
		if err != nil {
			return 0, fmt.Errorf("pubsub: count %s: %w", subscription, err)
		}
		fresh := 0
		for _, rm := range resp.GetReceivedMessages() {
			ackIDs = append(ackIDs, rm.GetAckId())
			if id := rm.GetMessage().GetMessageId(); !seen[id] {
				seen[id] = true
				fresh++
			}
		}
		if fresh == 0 {
			break
		}
	}
	n := int64(len(seen))
	m.mu.Lock()
	m.depth[subscription] = n
	m.mu.Unlock()
	return n, nil
}
