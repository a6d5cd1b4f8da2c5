package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Received is one delivered message.
type Received struct {
	ID          string // Pub/Sub message id (server-assigned; not the event id)
	Data        []byte
	Attributes  map[string]string
	OrderingKey string
	PublishTime time.Time
	// DeliveryAttempt counts deliveries of this message to this subscription,
	// 1 on the first. 0 when unknown: Pub/Sub only counts when the
	// subscription has a dead-letter policy, and the count is best-effort.
	DeliveryAttempt int
}

// Handler processes one message. nil acks it; any error nacks it, so
// Pub/Sub redelivers it (after the subscription's retry backoff). A handler
// must therefore return nil only once the message is durably stored or
// handled, and should not return an error for a business rejection: park it
// and return nil, or it is redelivered until it is dead-lettered.
type Handler func(ctx context.Context, m *Received) error

// BatchHandler processes a batch and returns one error per message (same
// length, same order): nil entries are acked, the others nacked. A result of
// another length nacks the whole batch.
type BatchHandler func(ctx context.Context, ms []*Received) []error

// SubscriberConfig tunes receiving. Zero fields take the documented default.
type SubscriberConfig struct {
	// NumGoroutines is the number of StreamingPull streams Run opens. Default
	// 4. One stream carries about 10 MB/s on real Pub/Sub; on pstest one
	// stream gets one message per 10 ms tick (40-90 msg/s), so local runs
	// that need throughput use RunBatch or raise this (32 streams: ~2.4k/s).
	NumGoroutines int
	// MaxOutstandingMessages bounds messages Run holds unacked, which is also
	// the number of concurrent handler calls. Default 100: keep it near the
	// handler's database pool size; more only queues on the pool while the
	// messages' leases run.
	MaxOutstandingMessages int
	// MaxOutstandingBytes bounds the bytes of those messages. Default 64 MiB.
	MaxOutstandingBytes int
	// MaxExtension is the longest a message's lease is extended while its
	// handler (or its batch) runs; after it Pub/Sub redelivers the message
	// even if the handler is still busy. Default 10 min: far above any
	// legitimate pre-ack work (one insert), so only a stuck handler hits it.
	MaxExtension time.Duration

	// BatchSize is RunBatch's MaxMessages per Pull. Default 500, at most 1000.
	BatchSize int
	// MaxBatchBytes bounds the message bytes (proto size: data, attributes,
	// ordering key) of one RunBatch handler call, so a batch of large
	// messages cannot take the handler's memory and transaction with it: a
	// pulled batch above it is handed over in several calls, each acked and
	// nacked by its own result; a single message above it goes alone. The
	// next Pull asks for MaxBatchBytes / (mean message size of the previous
	// pull) messages, at most BatchSize, so one pull stays near the bound.
	// The first pull of each loop, and a pull whose messages are much larger
	// than the previous ones, can still exceed it once: Pull bounds messages,
	// not bytes, so that response may hold up to BatchSize messages of up to
	// 10 MB (Pub/Sub's largest). Default 16 MiB.
	MaxBatchBytes int
	// BatchConcurrency is the number of RunBatch pull loops, i.e. batches in
	// flight at once. Default 2: one batch is pulled while another commits.
	BatchConcurrency int
	// BatchLeaseExtension is the ack deadline RunBatch sets, every 5 s, on
	// the messages of a batch whose handler is still running. Default 20 s,
	// the consumer subscriptions' own: a replica killed mid-batch holds its
	// messages no longer than that.
	BatchLeaseExtension time.Duration
	// AckTimeout bounds one Acknowledge/ModifyAckDeadline call of RunBatch.
	// Acks are sent even when ctx was cancelled after the handler succeeded:
	// the effect is committed, an unsent ack only causes a redelivery.
	// Default 30 s.
	AckTimeout time.Duration
	// PullBackoff spaces RunBatch's next Pull after a failed Pull
	// (Unavailable, ...) or after a batch whose every message failed.
	// Default Base 100 ms, Max 10 s.
	PullBackoff retry.Backoff
	// EmptyPollInterval, when positive, makes RunBatch pull with
	// ReturnImmediately and wait this long after an empty pull itself.
	// Default 0: the server holds an empty Pull until a message arrives,
	// which is right on real Pub/Sub (ReturnImmediately is discouraged
	// there). pstest instead holds an empty Pull for a fixed 500 ms and does
	// not wake on new messages (pstest/fake.go), which adds up to 500 ms per
	// hop; DefaultSubscriberConfigFor sets 10 ms when an emulator is used.
	EmptyPollInterval time.Duration

	// ProbeInterval is how often a subscriber with a connection of its own
	// (WithOwnConnection) checks that connection with a GetSubscription
	// call, and ProbeTimeout bounds that call. A probe that ends
	// DEADLINE_EXCEEDED or UNAVAILABLE abandons the connection: its pulls,
	// streams, acks and lease extensions are cancelled and sent again on a
	// fresh connection, so a dead one is replaced within ProbeInterval +
	// ProbeTimeout (10 s by default) without relying on the peer answering
	// transport pings (pstest answers frequent ones with GOAWAY, and so may
	// Pub/Sub's front-ends). Nothing is lost: messages pulled but not acked
	// on the abandoned connection are redelivered after their ack deadline,
	// and an ack counts as sent only once Pub/Sub answered it.
	//
	// Cost on real Pub/Sub: a probe is one administrator operation, not
	// billed as message throughput but counted against the project's
	// administrator-operations quota, which every replica and subscriber
	// shares: replicas × subscribers × 60 s / ProbeInterval calls a minute
	// (12 per subscriber at the default). Raise ProbeInterval for a large
	// fleet; the bound grows with it. Defaults 5 s and 5 s.
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
}

// DefaultSubscriberConfigFor returns the defaults for the endpoint of c:
// against an emulator (PUBSUB_EMULATOR_HOST set), empty pulls poll every
// 10 ms instead of being held by the server (see EmptyPollInterval).
func DefaultSubscriberConfigFor(c ClientConfig) SubscriberConfig {
	d := DefaultSubscriberConfig()
	if c.EmulatorHost != "" {
		d.EmptyPollInterval = 10 * time.Millisecond
	}
	return d
}

// DefaultSubscriberConfig returns the defaults documented on each field.
func DefaultSubscriberConfig() SubscriberConfig {
	return SubscriberConfig{
		NumGoroutines:          4,
		MaxOutstandingMessages: 100,
		MaxOutstandingBytes:    64 << 20,
		MaxExtension:           10 * time.Minute,
		BatchSize:              500,
		MaxBatchBytes:          16 << 20,
		BatchConcurrency:       2,
		BatchLeaseExtension:    20 * time.Second,
		AckTimeout:             30 * time.Second,
		PullBackoff:            retry.Backoff{Base: 100 * time.Millisecond, Max: 10 * time.Second},
		ProbeInterval:          5 * time.Second,
		ProbeTimeout:           5 * time.Second,
	}
}

// setDefaults fills zero fields with DefaultSubscriberConfig's values.
func (c *SubscriberConfig) setDefaults() {
	d := DefaultSubscriberConfig()
	setDefault(&c.NumGoroutines, d.NumGoroutines)
	setDefault(&c.MaxOutstandingMessages, d.MaxOutstandingMessages)
	setDefault(&c.MaxOutstandingBytes, d.MaxOutstandingBytes)
	setDefault(&c.MaxExtension, d.MaxExtension)
	setDefault(&c.BatchSize, d.BatchSize)
	setDefault(&c.MaxBatchBytes, d.MaxBatchBytes)
	setDefault(&c.BatchConcurrency, d.BatchConcurrency)
	setDefault(&c.BatchLeaseExtension, d.BatchLeaseExtension)
	setDefault(&c.AckTimeout, d.AckTimeout)
	setDefault(&c.PullBackoff.Base, d.PullBackoff.Base)
	setDefault(&c.PullBackoff.Max, d.PullBackoff.Max)
	setDefault(&c.ProbeInterval, d.ProbeInterval)
	setDefault(&c.ProbeTimeout, d.ProbeTimeout)
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Validate reports impossible settings. Zero fields are valid (defaults).
func (c SubscriberConfig) Validate() error {
	var errs []error
	if c.NumGoroutines < 0 || c.MaxOutstandingMessages < 0 || c.MaxOutstandingBytes < 0 || c.BatchConcurrency < 0 || c.MaxBatchBytes < 0 {
		errs = append(errs, errors.New("subscriber: counts must not be negative"))
	}
	if c.MaxExtension < 0 || c.AckTimeout < 0 || c.EmptyPollInterval < 0 || c.ProbeInterval < 0 || c.ProbeTimeout < 0 {
		errs = append(errs, errors.New("subscriber: durations must not be negative"))
	}
	if c.BatchSize < 0 || c.BatchSize > 1000 {
		errs = append(errs, fmt.Errorf("subscriber: BatchSize %d outside [0, 1000]", c.BatchSize))
	}
	if e := c.BatchLeaseExtension; e != 0 && (e < MinAckDeadline || e > MaxAckDeadline || e%time.Second != 0) {
		errs = append(errs, fmt.Errorf("subscriber: BatchLeaseExtension %v: want whole seconds in [%v, %v]", e, MinAckDeadline, MaxAckDeadline))
	}
	if err := c.PullBackoff.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("subscriber: PullBackoff: %w", err))
	}
	return errors.Join(errs...)
}

// Subscriber receives from one subscription. It never acks a message whose
// handler failed or panicked.
type Subscriber struct {
	client *gpubsub.Client
	id     string
	name   string
	cfg    SubscriberConfig
	logger *slog.Logger
	own    *ClientConfig // WithOwnConnection: dial, probe and replace a connection of its own

	tracer      trace.Tracer
	attrs       metric.MeasurementOption
	acks        metric.Int64Counter
	nacks       metric.Int64Counter
	ackFailures metric.Int64Counter
	panics      metric.Int64Counter
	reconnects  metric.Int64Counter
}

// SubscriberOption adds an optional dependency to a Subscriber.
type SubscriberOption func(*Subscriber)

// WithTracerProvider traces deliveries: each pulled batch (RunBatch) or
// message (Run) is processed under a consumer span that starts a new trace
// and links to every producer span named by the messages' traceparent
// attributes (docs/adr/0009). Handlers store that span's context with what
// they write (inbox row, job), so the next hop links to it in turn. Without
// it nothing is traced.
func WithTracerProvider(tp trace.TracerProvider) SubscriberOption {
	return func(s *Subscriber) {
		if tp != nil {
			s.tracer = tp.Tracer("github.com/lossless-dev/lossless/pkg/pubsub")
		}
	}
}

// NewSubscriber returns a subscriber for subscriptionID. meter may be nil.
func NewSubscriber(c *gpubsub.Client, subscriptionID string, cfg SubscriberConfig, logger *slog.Logger, meter metric.Meter, opts ...SubscriberOption) (*Subscriber, error) {
	if c == nil {
		return nil, errors.New("pubsub: NewSubscriber: nil client")
	}
	if logger == nil {
		return nil, errors.New("pubsub: NewSubscriber: nil logger")
	}
	if err := validateID(subscriptionID); err != nil {
		return nil, fmt.Errorf("pubsub: NewSubscriber: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("pubsub: NewSubscriber: %w", err)
	}
	cfg.setDefaults()
	meter = telemetry.MeterOrNoop(meter)
	s := &Subscriber{
		client: c,
		id:     subscriptionID,
		name:   SubscriptionName(c.Project(), subscriptionID),
		cfg:    cfg,
		logger: logger.With("subscription", subscriptionID),
		attrs:  metric.WithAttributes(attribute.String("subscription", subscriptionID)),
		tracer: tracenoop.NewTracerProvider().Tracer(""),
	}
	for _, o := range opts {
		o(s)
	}
	var err error
	if s.acks, err = meter.Int64Counter("pubsub.subscriber.acks",
		metric.WithDescription("Messages acknowledged after their handler succeeded.")); err != nil {
		return nil, err
	}
	if s.nacks, err = meter.Int64Counter("pubsub.subscriber.nacks",
		metric.WithDescription("Messages nacked because their handler failed or panicked; Pub/Sub redelivers them.")); err != nil {
		return nil, err
	}
	if s.ackFailures, err = meter.Int64Counter("pubsub.subscriber.ack_failures",
		metric.WithDescription("Messages whose ack or nack request failed; Pub/Sub redelivers them after the ack deadline.")); err != nil {
		return nil, err
	}
	if s.panics, err = meter.Int64Counter("pubsub.subscriber.handler_panics",
		metric.WithDescription("Handler panics, recovered and turned into nacks.")); err != nil {
		return nil, err
	}
	if s.reconnects, err = meter.Int64Counter("pubsub.subscriber.reconnects",
		metric.WithDescription("Connections abandoned because their liveness probe found them unreachable, and replaced by a fresh one (WithOwnConnection).")); err != nil {
		return nil, err
	}
	// The series exist from the start, so rates and alerts read 0, not "no data".
	for _, c := range []metric.Int64Counter{s.acks, s.nacks, s.ackFailures, s.panics, s.reconnects} {
		c.Add(context.Background(), 0, s.attrs)
	}
	return s, nil
}

// Run receives with StreamingPull through the Go client and calls h once per
// message, concurrently (up to MaxOutstandingMessages). The client extends
// each message's lease while h runs (up to MaxExtension). Run returns nil
// when ctx is cancelled, after the running handlers returned (their ctx is
// cancelled too; a handler failing because of that nacks), or the client's
// non-retryable error. Only one Run per Subscriber at a time.
//
// With WithOwnConnection, a connection the liveness probe declared dead is
// abandoned with its streams: the running handlers' ctx is cancelled, and
// their messages, whose acks cannot reach Pub/Sub any more, are redelivered
// after their ack deadline; Run receives again on the fresh connection. The
// client library sends a stream's acks asynchronously and confirms them only
// on exactly-once subscriptions, so the acks metric counts acks handed to it.
func (s *Subscriber) Run(ctx context.Context, h Handler) error {
	if h == nil {
		return errors.New("pubsub: Run: nil handler")
	}
	l, closeConns, err := s.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConns()
	for {
		c := l.current()
		rctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(c.dead, cancel)
		err := s.receive(rctx, c.client, h)
		stop()
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case c.dead.Err() != nil:
			continue // abandoned: receive on the fresh connection
		case err != nil:
			return fmt.Errorf("pubsub: receive %s: %w", s.id, err)
		}
		return nil
	}
}

// receive is one StreamingPull Receive on client, until ctx ends.
func (s *Subscriber) receive(ctx context.Context, client *gpubsub.Client, h Handler) error {
	sub := client.Subscriber(s.name)
	sub.ReceiveSettings = gpubsub.ReceiveSettings{
		MaxExtension:           s.cfg.MaxExtension,
		MaxOutstandingMessages: s.cfg.MaxOutstandingMessages,
		MaxOutstandingBytes:    s.cfg.MaxOutstandingBytes,
		NumGoroutines:          s.cfg.NumGoroutines,
	}
	return sub.Receive(ctx, func(ctx context.Context, m *gpubsub.Message) {
		r := fromClientMessage(m)
		ctx, span := s.startSpan(ctx, []*Received{r})
		defer span.End()
		if err := s.call(ctx, r, func(ctx context.Context) error { return h(ctx, r) }); err != nil {
			m.Nack()
			s.nacks.Add(ctx, 1, s.attrs)
			s.logNack(ctx, r, err)
			span.SetStatus(codes.Error, "nacked")
			return
		}
		m.Ack()
		s.acks.Add(ctx, 1, s.attrs)
	})
}

// startSpan starts the consumer span of a delivery of ms: a new root, linked
// to each message's producer span (OpenTelemetry messaging conventions for
// batch receiving). The SDK keeps 128 links per span by default;
// telemetry.Setup raises that to a full Pull (1000).
func (s *Subscriber) startSpan(ctx context.Context, ms []*Received) (context.Context, trace.Span) {
	links := make([]trace.Link, 0, len(ms))
	for _, m := range ms {
		if l, ok := telemetry.ProducerLink(m.Attributes[AttrTraceparent], m.Attributes[AttrTracestate]); ok {
			l.Attributes = []attribute.KeyValue{attribute.String("messaging.message.id", m.ID), attribute.String("event_id", m.Attributes[AttrEventID])}
			links = append(links, l)
		}
	}
	return s.tracer.Start(ctx, "process "+s.id, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("messaging.system", "gcp_pubsub"),
			attribute.String("messaging.destination.subscription.name", s.id),
			attribute.Int("messaging.batch.message_count", len(ms))))
}

// call runs fn and turns a panic into an error, so the message is nacked and
// the process keeps serving the other messages.
func (s *Subscriber) call(ctx context.Context, r *Received, fn func(context.Context) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			s.panics.Add(ctx, 1, s.attrs)
			s.logger.ErrorContext(ctx, "pubsub handler panicked; nacking",
				"message_id", r.ID, "event_id", r.Attributes[AttrEventID], "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			err = fmt.Errorf("pubsub: handler panic: %v", v)
		}
	}()
	return fn(ctx)
}

func (s *Subscriber) logNack(ctx context.Context, r *Received, err error) {
	s.logger.WarnContext(ctx, "pubsub message nacked; Pub/Sub will redeliver it",
		"message_id", r.ID, "event_id", r.Attributes[AttrEventID], "event_type", r.Attributes[AttrEventType],
		"delivery_attempt", r.DeliveryAttempt, "error", err)
}

func fromClientMessage(m *gpubsub.Message) *Received {
	r := &Received{
		ID:          m.ID,
		Data:        m.Data,
		Attributes:  m.Attributes,
		OrderingKey: m.OrderingKey,
		PublishTime: m.PublishTime,
	}
	if m.DeliveryAttempt != nil {
		r.DeliveryAttempt = *m.DeliveryAttempt
	}
	if r.Attributes == nil {
		r.Attributes = map[string]string{}
	}
	return r
}
