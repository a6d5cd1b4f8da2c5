// Package watermillcompare holds benchmark B1w of docs/performance.md: the
// outbox relay of pkg/outbox and watermill-sql's outbox forwarder, at its
// best of its PostgreSQL adapters, drain the same backlog on the same
// PostgreSQL server, in turn, at each size of a sweep. It is a module of its
// own so that watermill stays out of the main go.mod; `make bench-watermill`
// runs it (and `make bench` with it).
package watermillcompare
