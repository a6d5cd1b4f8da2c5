package correlation

import (
	"errors"
	"fmt"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
)

// Source is the emitter of the events this inbox receives; with the event id
// it is the inbox's dedup key.
const Source = "provider"

// The event types the provider publishes on work-order-completed.
var (
	TypeCompleted        = string(proto.MessageName(&eventsv1.WorkOrderCompleted{}))
	TypeExecutionStarted = string(proto.MessageName(&eventsv1.WorkOrderExecutionStarted{}))
)

// EventCompletionRecorded is the outbox event type the correlation appends
// when an order completes; the outbox relay publishes it on workorder-events.
var EventCompletionRecorded = string(proto.MessageName(&eventsv1.WorkOrderCompletionRecorded{}))

// SupportedSchemaVersion is the only schema version understood. A higher one
// is poison until this code learns it; then the parked entries are replayed.
const SupportedSchemaVersion = 1

// Event is a decoded, validated provider event.
type Event struct {
	Type    string
	EventID string
	OrderID uuid.UUID
	// CompletedItems of a completion tranche; 0 for ExecutionStarted.
	CompletedItems int
}

// ErrInvalid wraps every reason a payload is poison (F9).
var ErrInvalid = errors.New("invalid event")

// Parse decodes and validates one payload. The receiver uses it to find the
// dedup key and correlation key (anything failing here is stored as poison);
// the relay uses it again on the stored payload, so a replayed poison entry
// is re-checked by the same rules.
func Parse(eventType string, schemaVersion int, payload []byte) (Event, error) {
	if schemaVersion != SupportedSchemaVersion {
		return Event{}, fmt.Errorf("%w: unsupported schema_version %d (supported: %d)", ErrInvalid, schemaVersion, SupportedSchemaVersion)
	}
	var (
		ev                Event
		eventID, orderStr string
	)
	switch eventType {
	case TypeCompleted:
		var m eventsv1.WorkOrderCompleted
		if err := proto.Unmarshal(payload, &m); err != nil {
			return Event{}, fmt.Errorf("%w: unparseable %s: %w", ErrInvalid, eventType, err)
		}
		if m.GetCompletedItems() < 1 {
			return Event{}, fmt.Errorf("%w: completed_items %d must be at least 1", ErrInvalid, m.GetCompletedItems())
		}
		eventID, orderStr, ev.CompletedItems = m.GetEventId(), m.GetWorkOrderId(), int(m.GetCompletedItems())
	case TypeExecutionStarted:
		var m eventsv1.WorkOrderExecutionStarted
		if err := proto.Unmarshal(payload, &m); err != nil {
			return Event{}, fmt.Errorf("%w: unparseable %s: %w", ErrInvalid, eventType, err)
		}
		eventID, orderStr = m.GetEventId(), m.GetWorkOrderId()
	default:
		return Event{}, fmt.Errorf("%w: unknown event_type %q", ErrInvalid, eventType)
	}
	if eventID == "" || len(eventID) > 200 {
		return Event{}, fmt.Errorf("%w: missing or oversized event_id", ErrInvalid)
	}
	id, err := uuid.Parse(orderStr)
	if err != nil {
		return Event{}, fmt.Errorf("%w: work_order_id %q is not a UUID", ErrInvalid, orderStr)
	}
	ev.Type, ev.EventID, ev.OrderID = eventType, eventID, id
	return ev, nil
}
