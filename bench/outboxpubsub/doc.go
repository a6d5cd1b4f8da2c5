// Package outboxpubsub holds benchmark B1p of docs/performance.md, of
// pkg/outbox's relay with pkg/outboxpubsub's dispatcher, in its _test files
// only. It lives outside pkg/, whose packages (tests included) import nothing
// else of the module: the anchors and environment knobs come from
// internal/testkit/benchkit. Run with `make bench`.
package outboxpubsub
