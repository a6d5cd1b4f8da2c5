// Package rivercompare holds benchmark B3 of docs/performance.md: the lease
// queue of pkg/leasequeue and River v0.51.2, each at its best of a sweep of
// worker counts, burn down the same number of no-op jobs on the same
// PostgreSQL server, in turn, then complete jobs inserted at a fixed mean
// rate, arriving as a Poisson process that is the same for both (River's
// completer flushes on a fixed 50 ms tick: evenly spaced inserts would
// measure one phase of it). It is a module of its own so that River stays
// out of the main go.mod; `make bench-river` runs it (and `make bench` with
// it).
package rivercompare
