// Package rivercompare holds benchmark B3 of docs/performance.md: the lease
// queue of pkg/leasequeue and River v0.51.2, each at its best of a sweep of
// worker counts, burn down the same number of no-op jobs on the same
// PostgreSQL server, in turn, then complete jobs inserted at a fixed rate. It is a module of its own so that River stays out of the main
// go.mod; `make bench-river` runs it (and `make bench` with it).
package rivercompare
