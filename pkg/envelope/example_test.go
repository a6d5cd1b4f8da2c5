package envelope_test

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// A consumer decodes each message with its own rule after the envelope's,
// and parks what is refused with the reason.
func ExampleDecode() {
	atLeastOne := func(ev *testpb.OrderCompleted) []string {
		if ev.GetQuantity() < 1 {
			return []string{"quantity: want at least 1"}
		}
		return nil
	}
	data, err := proto.Marshal(&testpb.OrderCompleted{EventId: "evt-1", OrderId: "order-1"})
	if err != nil {
		panic(err)
	}
	m := &pubsub.Received{ID: "1001", Data: data, Attributes: map[string]string{
		pubsub.AttrEventType: "lossless.pkgtest.v1.OrderCompleted", pubsub.AttrEventID: "evt-1",
		pubsub.AttrCorrelationID: "req\x00-1"}}

	v := envelope.Decode(m, envelope.Config{MaxPayloadBytes: 1 << 20}, atLeastOne)
	fmt.Println(v.Outcome("parked", "unknown_type"))
	fmt.Println(v.Reason())
	p := envelope.Parked("orders.order-events", m, v.Event, v.Event.GetOrderId(), v.Reason())
	fmt.Println(p.EventID, p.Subject)
	// Output:
	// parked
	// attribute "correlation_id": value contains a NUL byte; quantity: want at least 1
	// evt-1 order-1
}
