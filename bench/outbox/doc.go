// Package outbox holds benchmarks B1 and B2 of docs/performance.md, of
// pkg/outbox's relay, in its _test files only. They live outside pkg/, whose
// packages (tests included) import nothing else of the module: the anchors
// and environment knobs come from internal/testkit/benchkit. Run with `make bench`.
package outbox
