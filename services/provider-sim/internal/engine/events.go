package engine

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/faults"
)

// Event kinds, as stored in job_events.kind.
const (
	kindStarted      = "STARTED"
	kindCompleted    = "COMPLETED"
	kindPoison       = "POISON"
	kindUnknownOrder = "UNKNOWN_ORDER"
)

// unparseablePayload starts with byte 0x6e: field 13 with wire type 6, which
// does not exist, so every protobuf decoder rejects it at the first byte.
const unparseablePayload = "\x6epoison: not a protobuf message"

// eventRow is one message to publish, recorded in job_events before it is
// published.
type eventRow struct {
	EventID     uuid.UUID
	Seq         int
	Kind        string
	EventType   string
	OrderingKey string
	Payload     []byte
	Copies      int
	OccurredAt  time.Time
}

// eventID derives a business event's id from the job, the kind and the
// tranche: the same fact gets the same id even if its row had to be built
// twice, and ids of different facts never collide.
func eventID(jobID uuid.UUID, kind string, n int) uuid.UUID {
	return uuid.NewSHA1(uuid.NameSpaceURL, fmt.Appendf(nil, "urn:lossless:provider-sim:job:%s:%s:%d", jobID, kind, n))
}

// startedEvent is published when execution starts.
func startedEvent(j *job, at time.Time) (eventRow, error) {
	id := eventID(j.ID, kindStarted, 0)
	return newRow(id, 1, kindStarted, j.WorkOrderID.String(), 1, at, &eventsv1.WorkOrderExecutionStarted{
		EventId:     id.String(),
		WorkOrderId: j.WorkOrderID.String(),
		StartedAt:   timestamppb.New(at),
	})
}

// completionEvents are published when execution ends, in this order: the
// poison message and the unknown-order completion first (they must not be
// hidden behind a completed order), then the completion tranche(s).
func completionEvents(j *job, at time.Time) ([]eventRow, error) {
	var rows []eventRow
	seq := 1
	next := func() int { seq++; return seq }
	copies := 1
	if j.Plan.Duplicate {
		copies = 2
	}
	if j.Plan.Poison != faults.PoisonNone {
		id := eventID(j.ID, kindPoison, 0)
		var payload []byte
		switch j.Plan.Poison {
		case faults.PoisonUnparseable:
			payload = []byte(unparseablePayload)
		case faults.PoisonMissingWorkOrderID, faults.PoisonNegativeItems:
			msg := &eventsv1.WorkOrderCompleted{
				EventId:        id.String(),
				WorkOrderId:    j.WorkOrderID.String(),
				CompletedItems: j.Positions,
				CompletedAt:    timestamppb.New(at),
			}
			if j.Plan.Poison == faults.PoisonMissingWorkOrderID {
				msg.WorkOrderId = ""
			} else {
				msg.CompletedItems = -j.Positions
			}
			var err error
			if payload, err = marshal(msg); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("unknown poison kind %q", j.Plan.Poison)
		}
		rows = append(rows, eventRow{
			EventID: id, Seq: next(), Kind: kindPoison, EventType: completedType(),
			OrderingKey: j.WorkOrderID.String(), Payload: payload, Copies: 1, OccurredAt: at,
		})
	}
	if j.Plan.UnknownOrder {
		id := eventID(j.ID, kindUnknownOrder, 0)
		// A name-based id: reproducible, and no job can have it (job work
		// order ids are the caller's, and this namespace is ours).
		unknown := uuid.NewSHA1(uuid.NameSpaceURL, fmt.Appendf(nil, "urn:lossless:provider-sim:unknown-order:%s", j.ID))
		row, err := newRow(id, next(), kindUnknownOrder, unknown.String(), 1, at, &eventsv1.WorkOrderCompleted{
			EventId:        id.String(),
			WorkOrderId:    unknown.String(),
			CompletedItems: j.Positions,
			CompletedAt:    timestamppb.New(at),
		})
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	tranches := []int32{j.Positions}
	if j.Plan.SplitFirst > 0 {
		tranches = []int32{j.Plan.SplitFirst, j.Positions - j.Plan.SplitFirst}
	}
	for i, items := range tranches {
		id := eventID(j.ID, kindCompleted, i+1)
		row, err := newRow(id, next(), kindCompleted, j.WorkOrderID.String(), copies, at, &eventsv1.WorkOrderCompleted{
			EventId:        id.String(),
			WorkOrderId:    j.WorkOrderID.String(),
			CompletedItems: items,
			CompletedAt:    timestamppb.New(at),
		})
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func newRow(id uuid.UUID, seq int, kind, orderingKey string, copies int, at time.Time, msg proto.Message) (eventRow, error) {
	payload, err := marshal(msg)
	if err != nil {
		return eventRow{}, err
	}
	return eventRow{
		EventID: id, Seq: seq, Kind: kind, EventType: string(proto.MessageName(msg)),
		OrderingKey: orderingKey, Payload: payload, Copies: copies, OccurredAt: at,
	}, nil
}

func marshal(msg proto.Message) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", proto.MessageName(msg), err)
	}
	return b, nil
}

func completedType() string {
	return string(proto.MessageName((*eventsv1.WorkOrderCompleted)(nil)))
}
