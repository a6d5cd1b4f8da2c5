// Package topology names the Pub/Sub topics and subscriptions of this
// system's example services, for their code and tests: a topic is the
// contract between its publisher and its consumers, so both sides name it
// here. What exists is declared in services/<name>/service.json (topics a
// service publishes, topics it consumes); this package's test checks every
// name below against the declarations (internal/devtools/declared). A new
// service names its own topic in its own config package (cmd/newservice does
// so) and needs nothing here.
package topology

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
