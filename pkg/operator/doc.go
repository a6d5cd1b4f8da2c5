// Package operator operates a pipeline safely: authenticated, dry run
// first, audited. It serves lossless.ops.v1.OperatorService (Service), the
// one repair surface of every service, over the service's own stores
// (Deps): list and requeue outbox events (pkg/outbox), list and replay
// parked messages (pkg/parked) through their consumer, replay dead letters,
// list, show, replay and clean up inbox entries (pkg/inbox), list and retry
// dead lease-queue jobs (pkg/leasequeue), list the operator audit. The
// pattern packages implement the repair interface (ParkedMessages,
// InboxEntries, DeadJobs) beside their own schema without importing this
// package; Service adds what every repair shares. RunCLI is the same
// operations as every service's command line, `<service> <group>
// <command>`. A service's admin service keeps only the repairs no pattern
// package owns.
//
// The pieces it is made of are usable alone: Guard checks the operator
// token (`authorization: Bearer <token>`; fails closed), WriteAudit and
// ListAudit write and read the operator_audit log (every mutating action
// writes its row in the transaction of its effect, dry runs included,
// InSavepoint rolls a dry run's effect back), and DeadLetterReplayer pulls a
// dead-letter inspection subscription through a consumer's own handler.
package operator
