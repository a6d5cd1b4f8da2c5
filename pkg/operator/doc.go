// Package operator operates a pipeline safely: authenticated, dry run
// first, audited. It serves lossless.ops.v1.OperatorService (Service) once
// for every service with an outbox (pkg/outbox), consumers that park
// (pkg/parked) or dead letters to replay: list and requeue outbox events,
// list and replay parked messages, replay dead letters, list the operator
// audit. Each service constructs it over its own stores (Deps) and mounts it
// next to its own admin service, which keeps only its specific repairs.
//
// The pieces it is made of are usable alone: Guard checks the operator
// token (`authorization: Bearer <token>`; fails closed), WriteAudit and
// ListAudit write and read the operator_audit log (every mutating action
// writes its row in the transaction of its effect, dry runs included,
// InSavepoint rolls a dry run's effect back), and DeadLetterReplayer pulls a
// dead-letter inspection subscription through a consumer's own handler.
package operator
