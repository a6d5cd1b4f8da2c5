// Package leasequeue holds pkg/leasequeue's burn-down benchmark (B3's half
// without River; B3 itself is bench/river-compare) in its _test files only.
// It lives outside pkg/, whose tests read no environment: the sizes and the
// server come from internal/testkit/benchkit.
package leasequeue
