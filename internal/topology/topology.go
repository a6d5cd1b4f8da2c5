// Package topology names the Pub/Sub topics and subscriptions of this
// system's example services, for their code and tests. What exists is
// declared in services/<name>/service.json (topics a service publishes, topics
// it consumes); System derives the topology from there, and this package's
// test checks every name below against it. A new service names its own topic
// in its own config package (cmd/newservice does so) and needs nothing here.
package topology

import (
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services"
)

// Topics, by publisher.
const (
	TopicWorkOrderCompleted = "work-order-completed" // provider-sim -> workorder (WorkOrderCompleted, WorkOrderExecutionStarted)
	TopicWorkOrderEvents    = "workorder-events"     // workorder -> billing (WorkOrderCompletionRecorded)
	TopicBillingEvents      = "billing-events"       // billing -> workorder (InvoiceIssued)
)

// Consumer subscriptions ("<consumer>.<topic>"), their dead-letter topics and
// the inspection subscriptions on those.
const (
	SubWorkOrderCompleted = "workorder.work-order-completed" // workorder's inbox
	SubWorkOrderEvents    = "billing.workorder-events"       // billing's idempotent consumer
	SubBillingEvents      = "workorder.billing-events"       // workorder applies invoices

	TopicWorkOrderCompletedDeadLetter = SubWorkOrderCompleted + ".dead-letter"
	TopicWorkOrderEventsDeadLetter    = SubWorkOrderEvents + ".dead-letter"
	TopicBillingEventsDeadLetter      = SubBillingEvents + ".dead-letter"

	SubWorkOrderCompletedDeadLetter = SubWorkOrderCompleted + ".dead-letter-inspect"
	SubWorkOrderEventsDeadLetter    = SubWorkOrderEvents + ".dead-letter-inspect"
	SubBillingEventsDeadLetter      = SubBillingEvents + ".dead-letter-inspect"
)

// System is the whole system's topology, derived from the services'
// declarations compiled into the binary. It panics when they do not parse:
// they are constants of the build, and this package's test parses them.
func System() pubsub.Topology {
	c, err := services.Catalog()
	if err != nil {
		panic(err)
	}
	return c.Topology()
}
