package pubsub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	otelcodes "go.opentelemetry.io/otel/codes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// leaseRenewEvery is how often RunBatch extends the leases of a batch whose
// handler is still running. Half of the smallest ack deadline Pub/Sub allows
// (10 s), so no subscription's deadline can pass between two renewals.
const leaseRenewEvery = MinAckDeadline / 2

// RunBatch receives with synchronous unary Pull and hands each pulled batch
// to h, split into calls of at most MaxBatchBytes; after each call it acks
// the messages h succeeded with in one Acknowledge call and nacks the others
// with ModifyAckDeadline(0). It is the mode for inbox-style ingest, where
// one database commit covers a whole batch.
//
// Why unary Pull rather than the client's StreamingPull: pstest hands a
// stream one message per 10 ms tick (40-90 msg/s), while Pull(1000) plus
// Acknowledge runs at ~41k msg/s; a batch handler also needs the batch, which
// StreamingPull's per-message callback does not give. On real Pub/Sub unary
// Pull is a supported, documented API; it costs a round trip per batch,
// negligible next to the batch's commit.
//
// Correctness on real Pub/Sub:
//   - Leases: messages arrive with the subscription's ack deadline; until
//     their handler call returned, RunBatch extends it to
//     BatchLeaseExtension every 5 s, for at most MaxExtension, so a slow
//     commit is not redelivered meanwhile, nor are the later calls' messages
//     of the same pull waiting their turn.
//   - Ordering: on an ordered subscription Pub/Sub does not deliver a key's
//     next messages while earlier ones of that key are outstanding, so
//     several pull loops never hold one key in two batches at once; within a
//     batch, messages of a key are in publish order and h sees them so (the
//     calls of one pull run one after another, in order). If a
//     message is nacked, Pub/Sub redelivers it and the key's later messages,
//     even those acked, so order is restored at the cost of duplicates,
//     which the consumer's unique key absorbs. The inbox additionally
//     applies entries of one order by its own guard (I4), so it does not
//     depend on delivery order.
//   - Acks are sent after h returned, even when ctx was cancelled meanwhile;
//     an ack that fails only causes a redelivery (at-least-once).
//   - Dead connections (WithOwnConnection): a pull, ack or lease extension
//     on a connection the liveness probe abandoned is cancelled and sent
//     again on the fresh one; handlers are not interrupted. An ack counts
//     (acks metric) only once Pub/Sub answered it, else it is an ack
//     failure and the message is redelivered.
//
// RunBatch runs BatchConcurrency pull loops and returns nil when ctx is
// cancelled (after in-flight batches were acked or nacked), or the first
// non-retryable Pull error (subscription missing, permission denied).
// Retryable Pull errors are logged and retried with PullBackoff; so is a
// batch in which every message failed (the database is likely down), so an
// outage does not burn the messages' delivery attempts at pull speed.
func (s *Subscriber) RunBatch(ctx context.Context, h BatchHandler) error {
	if h == nil {
		return errors.New("pubsub: RunBatch: nil handler")
	}
	l, closeConns, err := s.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConns()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range s.cfg.BatchConcurrency {
		wg.Go(func() {
			if err := s.pullLoop(ctx, l, h); err != nil {
				once.Do(func() { firstErr = err; cancel() })
			}
		})
	}
	wg.Wait()
	return firstErr
}

func (s *Subscriber) pullLoop(ctx context.Context, l *conns, h BatchHandler) error {
	failures, failedBatches := 0, 0
	maxMessages := s.cfg.BatchSize // until the first pull shows the message size
	for ctx.Err() == nil {
		// By default no ReturnImmediately: the server holds an empty Pull
		// until messages arrive, so an idle subscription is not a busy loop
		// (see SubscriberConfig.EmptyPollInterval for emulators).
		var resp *pubsubpb.PullResponse
		err := l.do(ctx, func(ctx context.Context, c *gpubsub.Client) (err error) {
			resp, err = c.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{
				Subscription:      s.name,
				MaxMessages:       int32(maxMessages),          //nolint:gosec // at most BatchSize (validated <= 1000)
				ReturnImmediately: s.cfg.EmptyPollInterval > 0, //nolint:staticcheck // deprecated on real Pub/Sub; used only against emulators
			})
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !retryablePullError(err) {
				return fmt.Errorf("pubsub: pull %s: %w", s.id, err)
			}
			failures++
			delay := s.cfg.PullBackoff.Delay(failures)
			s.logger.WarnContext(ctx, "pubsub pull failed; retrying", "error", err, "attempt", failures, "retry_in", delay)
			if !sleep(ctx, delay) {
				return nil
			}
			continue
		}
		failures = 0
		if len(resp.GetReceivedMessages()) == 0 {
			if s.cfg.EmptyPollInterval > 0 && !sleep(ctx, s.cfg.EmptyPollInterval) {
				return nil
			}
			continue
		}
		rms := resp.GetReceivedMessages()
		sizes := messageSizes(rms)
		maxMessages = s.nextPullSize(sizes)
		if acked, nacked := s.processPull(ctx, l, h, rms, sizes); acked == 0 && nacked > 0 {
			// Every message failed: the handler's dependency (the database)
			// is most likely down. Pulling again at once would only churn
			// the nacked messages through their delivery attempts; on
			// emulators that ignore the retry policy it would dead-letter
			// them within a second (ADR 0004). Back off like a failed Pull.
			failedBatches++
			delay := s.cfg.PullBackoff.Delay(failedBatches)
			s.logger.WarnContext(ctx, "pubsub batch failed entirely; backing off", "messages", nacked, "failed_batches", failedBatches, "retry_in", delay)
			if !sleep(ctx, delay) {
				return nil
			}
		} else if acked > 0 {
			failedBatches = 0
		}
	}
	return nil
}

// retryablePullError: a missing subscription or missing permission will not
// heal by retrying; the service should stop visibly (readiness, crash loop)
// instead of logging forever.
func retryablePullError(err error) bool {
	switch status.Code(err) {
	case codes.NotFound, codes.PermissionDenied, codes.InvalidArgument, codes.Unimplemented, codes.Unauthenticated:
		return false
	}
	return true
}

// messageSizes returns each message's size as Pub/Sub counts it (the
// PubsubMessage's encoded size).
func messageSizes(rms []*pubsubpb.ReceivedMessage) []int {
	sizes := make([]int, len(rms))
	for i, rm := range rms {
		sizes[i] = proto.Size(rm.GetMessage())
	}
	return sizes
}

// nextPullSize is how many messages of the mean size of the last pull fit
// in MaxBatchBytes, between 1 and BatchSize.
func (s *Subscriber) nextPullSize(sizes []int) int {
	total := 0
	for _, n := range sizes {
		total += n
	}
	mean := max(1, total/len(sizes))
	return min(s.cfg.BatchSize, max(1, s.cfg.MaxBatchBytes/mean))
}

// splitByBytes cuts sizes into consecutive runs of at most limit bytes; a
// single message above limit is a run of its own. It returns the end index
// of each run.
func splitByBytes(sizes []int, limit int) []int {
	var ends []int
	run := 0
	for i, n := range sizes {
		if run > 0 && run+n > limit {
			ends = append(ends, i)
			run = 0
		}
		run += n
	}
	return append(ends, len(sizes))
}

// processPull hands one pulled batch to h in calls of at most MaxBatchBytes,
// one after another, acking and nacking after each call. The leases of the
// messages whose call has not returned are extended throughout. It returns
// how many messages h succeeded and failed with.
func (s *Subscriber) processPull(ctx context.Context, l *conns, h BatchHandler, rms []*pubsubpb.ReceivedMessage, sizes []int) (acked, nacked int) {
	leases := &pendingLeases{ids: make([]string, len(rms))}
	for i, rm := range rms {
		leases.ids[i] = rm.GetAckId()
	}
	stopLeases := s.extendLeases(ctx, l, leases)
	defer stopLeases()
	start := 0
	for _, end := range splitByBytes(sizes, s.cfg.MaxBatchBytes) {
		a, n := s.processBatch(ctx, l, h, rms[start:end], leases.ids[start:end], func() { leases.settle(end) })
		acked, nacked = acked+a, nacked+n
		start = end
	}
	return acked, nacked
}

// pendingLeases are the ack IDs of one pull; ids[from:] still await their
// handler call, and only those are extended.
type pendingLeases struct {
	mu   sync.Mutex // held across an extension, so settle waits for it
	ids  []string
	from int
}

// settle stops the extension of ids[:end]: once it returns, no extension of
// them is in flight or will be sent, so a nack (deadline 0) is not undone.
func (p *pendingLeases) settle(end int) {
	p.mu.Lock()
	p.from = end
	p.mu.Unlock()
}

// processBatch runs h on one handler call's messages, calls handled, then
// acks and nacks; it returns how many messages h succeeded and failed with.
func (s *Subscriber) processBatch(ctx context.Context, l *conns, h BatchHandler, rms []*pubsubpb.ReceivedMessage, ackIDs []string, handled func()) (acked, nacked int) {
	ms := make([]*Received, len(rms))
	for i, rm := range rms {
		ms[i] = fromReceivedMessage(rm)
	}
	ctx, span := s.startSpan(ctx, ms)
	defer span.End()
	errs := s.callBatch(ctx, h, ms)
	handled()

	var acks, nacks []string
	for i, id := range ackIDs {
		if errs[i] == nil {
			acks = append(acks, id)
			continue
		}
		nacks = append(nacks, id)
		s.logNack(ctx, ms[i], errs[i])
	}
	// Detached from ctx: the handler's effects are committed; cancelling now
	// would only turn a finished batch into redeliveries.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.AckTimeout)
	defer cancel()
	if len(acks) > 0 {
		if err := l.do(actx, func(ctx context.Context, c *gpubsub.Client) error {
			return c.SubscriptionAdminClient.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: s.name, AckIds: acks})
		}); err != nil {
			s.ackFailures.Add(actx, int64(len(acks)), s.attrs)
			s.logger.WarnContext(ctx, "pubsub ack failed; messages will be redelivered", "messages", len(acks), "error", err)
		} else {
			s.acks.Add(actx, int64(len(acks)), s.attrs)
		}
	}
	if len(nacks) > 0 {
		span.SetStatus(otelcodes.Error, fmt.Sprintf("%d of %d messages nacked", len(nacks), len(ms)))
		s.nacks.Add(actx, int64(len(nacks)), s.attrs)
		if err := s.modifyAckDeadline(actx, l, nacks, 0); err != nil {
			// The lease simply runs out; the message is redelivered later.
			s.ackFailures.Add(actx, int64(len(nacks)), s.attrs)
			s.logger.WarnContext(ctx, "pubsub nack failed; messages are redelivered after their ack deadline", "messages", len(nacks), "error", err)
		}
	}
	return len(acks), len(nacks)
}

// callBatch calls h and guarantees one error per message: a panic or a
// result of the wrong length nacks the whole batch.
func (s *Subscriber) callBatch(ctx context.Context, h BatchHandler, ms []*Received) []error {
	var errs []error
	err := s.call(ctx, ms[0], func(ctx context.Context) error {
		errs = h(ctx, ms)
		return nil
	})
	if err == nil && len(errs) != len(ms) {
		err = fmt.Errorf("pubsub: batch handler returned %d results for %d messages", len(errs), len(ms))
		s.logger.ErrorContext(ctx, "pubsub batch handler bug; nacking the batch", "error", err)
	}
	if err != nil {
		errs = make([]error, len(ms))
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// extendLeases renews the ack deadline of the pending messages every
// leaseRenewEvery until stop is called, none is pending or MaxExtension has
// passed.
func (s *Subscriber) extendLeases(ctx context.Context, l *conns, p *pendingLeases) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(leaseRenewEvery)
		defer t.Stop()
		limit := time.Now().Add(s.cfg.MaxExtension)
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case now := <-t.C:
				if now.After(limit) {
					s.logger.WarnContext(ctx, "pubsub batch handler exceeded MaxExtension; its messages will be redelivered",
						"messages", len(p.ids), "max_extension", s.cfg.MaxExtension)
					return
				}
				if !s.extendPending(ctx, l, p) {
					return
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

// extendPending extends the pending messages' leases; false when none is
// pending. The call is bounded by AckTimeout, as settle waits for it.
func (s *Subscriber) extendPending(ctx context.Context, l *conns, p *pendingLeases) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	ackIDs := p.ids[p.from:]
	if len(ackIDs) == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.AckTimeout)
	defer cancel()
	if err := s.modifyAckDeadline(ctx, l, ackIDs, s.cfg.BatchLeaseExtension); err != nil && ctx.Err() == nil {
		s.logger.WarnContext(ctx, "pubsub lease extension failed", "messages", len(ackIDs), "error", err)
	}
	return true
}

func (s *Subscriber) modifyAckDeadline(ctx context.Context, l *conns, ackIDs []string, d time.Duration) error {
	return l.do(ctx, func(ctx context.Context, c *gpubsub.Client) error {
		return c.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{
			Subscription:       s.name,
			AckIds:             ackIDs,
			AckDeadlineSeconds: int32(d / time.Second),
		})
	})
}

func fromReceivedMessage(rm *pubsubpb.ReceivedMessage) *Received {
	m := rm.GetMessage()
	attrs := m.GetAttributes()
	if attrs == nil {
		attrs = map[string]string{}
	}
	return &Received{
		ID:              m.GetMessageId(),
		Data:            m.GetData(),
		Attributes:      attrs,
		OrderingKey:     m.GetOrderingKey(),
		PublishTime:     m.GetPublishTime().AsTime(),
		DeliveryAttempt: int(rm.GetDeliveryAttempt()),
	}
}

// sleep waits d or until ctx is done; false means ctx is done.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
