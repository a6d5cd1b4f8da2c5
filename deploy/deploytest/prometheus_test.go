package deploytest

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func loadRules(t testing.TB) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.ParseFile(repoPath(t, alertsFile), false, model.UTF8Validation,
		promqlParser(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, err := range errs {
		t.Error(err)
	}
	if groups == nil {
		t.FailNow()
	}
	return groups
}

// TestAlertRulesParse: Prometheus's own rule parser accepts the file (YAML
// shape, PromQL, label and annotation templates), and the alerts I7 and I5
// require are all there.
func TestAlertRulesParse(t *testing.T) {
	t.Parallel()
	alerts := map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				if alerts[r.Alert] {
					t.Errorf("alert %s defined twice", r.Alert)
				}
				alerts[r.Alert] = true
			}
		}
	}
	for _, want := range []string{
		"OutboxOldestPendingEventTooOld",   // oldest pending outbox event too old
		"OutboxFailedEvents",               // outbox FAILED events
		"InboxOldestOpenEntryTooOld",       // oldest open inbox entry too old
		"InboxEntriesParked",               // any parked inbox entry
		"InboxAmbiguousCorrelation",        // parked as ambiguous (F7)
		"PubSubDeadLetters",                // dead-letter depth > 0
		"BillingJobsParked",                // billing jobs parked
		"BillingFencedCommits",             // fenced-off commits (F13)
		"BillingLeasesExpired",             // expired leases (I7)
		"OutboxDependencyUnavailable",      // a destination down: events wait uncharged (circuit open)
		"UnknownEventTypeParked",           // nothing dropped silently: unknown types parked
		"WorkOrderInvoicingMessagesParked", // an InvoiceIssued the work-order service cannot apply
		"ServiceDown",                      // the others cannot fire without a scrape
	} {
		if !alerts[want] {
			t.Errorf("alert %s missing", want)
		}
	}
}

// TestAlertsHaveRunbooks: every alert has a severity, a summary and a
// runbook_url that resolves to a file in docs/runbooks/.
func TestAlertsHaveRunbooks(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, s)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("alert %s: no summary annotation", r.Alert)
			}
			rel, err := runbookPath(r.Annotations["runbook_url"])
			if err != "" {
				t.Errorf("alert %s: %s", r.Alert, err)
				continue
			}
			if _, statErr := os.Stat(filepath.Join(root, filepath.FromSlash(rel))); statErr != nil {
				t.Errorf("alert %s: runbook %s does not exist", r.Alert, rel)
			}
		}
	}
}

// runbookPath turns a runbook_url (a repository path, or a GitHub blob URL of
// this repository) into a repository path under docs/runbooks/.
func runbookPath(u string) (string, string) {
	if u == "" {
		return "", "no runbook_url annotation"
	}
	u, _, _ = strings.Cut(u, "#")
	const github = "https://github.com/lossless-dev/lossless/blob/"
	if rest, ok := strings.CutPrefix(u, github); ok {
		_, u, _ = strings.Cut(rest, "/") // drop the ref
	}
	if !strings.HasPrefix(u, runbooksDir+"/") || !strings.HasSuffix(u, ".md") || strings.Contains(u, "..") {
		return "", "runbook_url " + u + " is not a .md file under " + runbooksDir + "/"
	}
	return u, ""
}

// TestAlertMetricsAreInTheContract: every metric a rule reads is in
// metrics.txt, the list the services are checked against.
func TestAlertMetricsAreInTheContract(t *testing.T) {
	t.Parallel()
	contract := metricsContract(t)
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			expr, err := promqlParser().ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", r.Alert, err)
				continue
			}
			for _, name := range metricNames(expr) {
				if _, ok := contractFamily(contract, name); !ok && !prometheusSynthesized[name] {
					t.Errorf("alert %s reads %s, which is not in %s", r.Alert+r.Record, name, metricsFile)
				}
			}
		}
	}
}

// usedMetrics collects the contract families that rules and dashboards read.
func usedMetrics(t testing.TB, contract map[string]bool) map[string]bool {
	t.Helper()
	used := map[string]bool{}
	add := func(expr parser.Expr) {
		for _, n := range metricNames(expr) {
			if fam, ok := contractFamily(contract, n); ok {
				used[fam] = true
			}
		}
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if e, err := promqlParser().ParseExpr(r.Expr); err == nil {
				add(e)
			}
		}
	}
	for _, q := range dashboardQueries(t) {
		if e, err := promqlParser().ParseExpr(grafanaMacros.Replace(q.Expr)); err == nil {
			add(e)
		}
	}
	return used
}

// TestMetricsContractIsUsed: every name in metrics.txt is read by a rule or a
// panel; an unused entry is a typo or a leftover that would make the services
// export metrics nobody looks at.
func TestMetricsContractIsUsed(t *testing.T) {
	t.Parallel()
	contract := metricsContract(t)
	used := usedMetrics(t, contract)
	var unused []string
	for name := range contract {
		if !used[name] {
			unused = append(unused, name)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		t.Errorf("%s lists metrics no rule or panel reads: %v", metricsFile, unused)
	}
}
