// Package rivercompare holds benchmark B3 of docs/performance.md: the lease
// queue of pkg/leasequeue and River v0.51.2 burn down the same number of
// no-op jobs with the same number of workers on the same PostgreSQL server,
// in turn. It is a module of its own so that River stays out of the main
// go.mod; `make bench-river` runs it (and `make bench` with it).
package rivercompare
