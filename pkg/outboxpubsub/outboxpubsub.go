// Package outboxpubsub is the outbox dispatcher that publishes events to
// Pub/Sub: an outbox row becomes one message whose event_id is the row's id,
// so a re-publish after a relay crash (F2) carries the same id and the
// consumer's unique key drops it. The ordering key is the event's aggregate,
// so a subscription with message ordering receives one aggregate's events in
// the order the relay dispatched them.
//
// Lesson: a publish is a dispatch like any other once its errors are
// classified (unreachable: outbox.Unavailable; refused: retry.Permanent).
// Guards F2 (one event_id across re-publishes) and F16 (Pub/Sub down: no
// attempt charged, the backlog goes once a probe succeeds).
//
// Next hop: pkg/consumer, which billing's intake runs on workorder-events.
//
// One Dispatcher publishes to one topic; register it for each event type
// that goes there, and group those types into one circuit so that an outage
// of the topic stops them all:
//
//	d := outboxpubsub.New(publisher) // a *pubsub.Publisher on the topic
//	relay, err := outbox.NewRelay(pool,
//		map[string]outbox.Dispatcher{typeA: d, typeB: d}, cfg, logger, meter,
//		outbox.WithDependency("pubsub:"+topic, typeA, typeB))
package outboxpubsub

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// headerAttributes are the outbox headers carried over as message
// attributes; other headers stay in the outbox row.
var headerAttributes = []string{pubsub.AttrTraceparent, pubsub.AttrTracestate, pubsub.AttrCorrelationID}

// Dispatcher publishes outbox events with one Publisher (one topic).
type Dispatcher struct {
	pub *pubsub.Publisher
}

// New returns an outbox.Dispatcher publishing each event's payload unchanged
// with the attributes of docs/adr/0005-message-contract.md (event_id = outbox
// event ID, event_type, schema_version, occurred_at, content_type,
// traceparent/tracestate/correlation_id from the headers) and ordering key =
// AggregateID. Errors Pub/Sub will repeat forever (InvalidArgument,
// PermissionDenied, NotFound) are permanent (retry.Permanent): the row goes to FAILED
// and alerts instead of retrying; Unavailable and DeadlineExceeded (Pub/Sub
// unreachable, after the client's own retries) are outbox.Unavailable: the
// relay charges the event nothing and the topic's circuit waits for Pub/Sub
// to answer a probe (F16); every other error is transient and the relay
// retries it with backoff. New panics on a nil publisher, a
// programming error at wiring time.
func New(pub *pubsub.Publisher) outbox.Dispatcher {
	if pub == nil {
		panic("outboxpubsub: nil publisher")
	}
	return &Dispatcher{pub: pub}
}

// Dispatch publishes ev and returns once Pub/Sub accepted it. No Commit:
// recording the event as published is all that follows.
func (d *Dispatcher) Dispatch(ctx context.Context, ev outbox.Event) (outbox.Commit, error) {
	attrs := pubsub.EventAttributes(ev.ID.String(), ev.Type, ev.SchemaVersion, ev.OccurredAt)
	for _, k := range headerAttributes {
		if v := ev.Headers[k]; v != "" {
			attrs[k] = v
		}
	}
	// Under a dispatch span (outbox.TraceDispatchers) the message names that span as
	// its producer, so the consumer links to the publish, which links to the
	// row's writer (docs/adr/0009). Untraced, the row's own context passes on.
	if tp, ts := telemetry.TraceHeaders(ctx); tp != "" {
		attrs[pubsub.AttrTraceparent] = tp
		delete(attrs, pubsub.AttrTracestate)
		if ts != "" {
			attrs[pubsub.AttrTracestate] = ts
		}
	}
	if _, err := d.pub.PublishRaw(ctx, ev.Payload, attrs, ev.AggregateID); err != nil {
		return nil, Classify(err)
	}
	return nil, nil
}

// Classify marks err permanent (retry.Permanent) when retrying cannot help,
// and outbox.Unavailable when Pub/Sub cannot be reached.
// A missing topic is permanent because provisioning is an operator step:
// FAILED rows are visible and replayable once the topic exists, while a
// transient classification would retry silently for as long as nobody looks.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	var coded interface{ GRPCStatus() *status.Status }
	code := status.Code(err)
	if code == codes.Unknown && errors.As(err, &coded) {
		code = coded.GRPCStatus().Code()
	}
	if code == codes.Unknown && errors.Is(err, context.DeadlineExceeded) {
		// The client retries UNAVAILABLE itself until the publisher's
		// Timeout and then reports only the timeout. (A cut-off of the
		// relay's own context is told apart by the relay.)
		code = codes.DeadlineExceeded
	}
	switch code {
	case codes.InvalidArgument, codes.PermissionDenied, codes.NotFound:
		return retry.Permanent(fmt.Errorf("outboxpubsub: %s: %w", code, err))
	case codes.Unavailable, codes.DeadlineExceeded:
		return outbox.Unavailable(fmt.Errorf("outboxpubsub: %s: %w", code, err))
	}
	return err
}
