package receiver_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/orderhop/orderhoptest"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/correlation"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// A handed-off order's ExecutionStarted and then its completion, over the
// emulator, through the receiver and the correlation relay: the deliver hop
// (publish → inbox) is observed for the completion only, the correlate hop
// (inbox → COMPLETED) once, when the order completes.
func TestHopsDeliverAndCorrelate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	reader := sdkmetric.NewManualReader()
	hops, err := orderhop.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	order := uuid.New()
	if _, err := b.pool.Exec(ctx, `INSERT INTO work_orders (id, customer_id, description, positions, currency_code, unit_price_minor, status)
		VALUES ($1, 'c', 'd', 1, 'EUR', 1, 'HANDED_OFF')`, order); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO waiting_points (work_order_id, cause) VALUES ($1, 'handoff')`, order); err != nil {
		t.Fatal(err)
	}

	sub, err := pubsub.NewSubscriber(b.emu.Client, topology.SubWorkOrderCompleted, pubsub.SubscriberConfig{
		PullBackoff: retry.Backoff{Base: time.Millisecond, Max: 10 * time.Millisecond}}, quiet, nil)
	if err != nil {
		t.Fatal(err)
	}
	recv, err := receiver.New(b.store, sub, receiver.Config{}, quiet, receiver.WithHops(hops))
	if err != nil {
		t.Fatal(err)
	}
	relay, err := inbox.NewRelay(b.pool, correlation.NewHandler(correlation.WithHops(hops)),
		inbox.Config{PollInterval: 5 * time.Millisecond}, quiet, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { _ = recv.Run(rctx); done <- struct{}{} }()
	go func() { _ = relay.Run(rctx); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()

	if _, err := b.pub.Publish(ctx, pubsub.Message{EventID: "started-1", OrderingKey: order.String(),
		Event: &eventsv1.WorkOrderExecutionStarted{EventId: "started-1", WorkOrderId: order.String()}}); err != nil {
		t.Fatal(err)
	}
	b.publish(t, "completed-1", order, 1)
	waitfor.Value(t, 10*time.Second, "order completed", 1, func() int {
		return b.count(t, `SELECT count(*) FROM work_orders WHERE id = $1 AND status = 'COMPLETED'`, order)
	})
	waitfor.Condition(t, 10*time.Second, "every message acked", b.allAcked)

	got := orderhoptest.Collect(t, reader)
	if got[orderhop.Deliver].Count != 1 || got[orderhop.Correlate].Count != 1 {
		t.Fatalf("hops %+v, want deliver and correlate observed once each", got)
	}
	if mx := got[orderhop.Deliver].Max; mx <= 0 || mx > 10 {
		t.Errorf("deliver hop %v s: not a publish → store span", mx)
	}
}
