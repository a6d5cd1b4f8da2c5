// Package docscheck keeps the documentation true to the code. Its tests scan
// every Markdown file under docs/ and README.md and check what a reader would
// copy or look up: every quoted metric name (exported by some service), every
// quoted command line of workorder, billing and provider-sim (its commands and
// flags are defined in the code), every quoted environment variable (read by
// the code or set by a deployment), every quoted or linked repository path
// (exists), every quoted `make` target (is a Makefile target) and every quoted
// test name (exists, in the package the line names). A failure names the
// document, the line and the quoted name. It has tests only.
//
// The runbooks and the alert rules are held to each other: every alert rule
// under deploy/ routes (runbook_url) to a runbook of docs/runbooks that
// exists and names it on its "Alerts:" line; a runbook names only alerts
// that exist; and every log message a runbook quotes (after "log line" or
// "logs", or in a "log message" table column) is a string literal of the
// code. The conventions are spelled out in runbooks_test.go.
//
// The tour's reading list (docs/tour.md) is kept to a budget, with the
// files a learner must read on it (readinglist_test.go).
//
// The SQL of the runbooks is run against a migrated database by
// services/workorder/internal/admin (TestRunbookSQL); the alert rules and the
// metric contract deploy/compose/metrics.txt are checked by deploy/deploytest.
package docscheck
