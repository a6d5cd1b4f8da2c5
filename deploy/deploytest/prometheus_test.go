package deploytest

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
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
	root, module := mainModule(t)
	blob, sub := githubBlob(module)
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
			rel, err := runbookPath(r.Annotations["runbook_url"], blob, sub)
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

// githubBlob is, for a module on github.com, its repository's blob URL prefix
// ("https://github.com/owner/name/blob/") and the module's directory in the
// repository ("" or "dir/"); a trailing major version element (/v2) is a
// branch, not a directory. Other hosts have none: their runbook URLs are
// repository paths. cmd/rename writes runbook URLs by the same rule.
func githubBlob(module string) (blob, sub string) {
	elems := strings.Split(module, "/")
	if len(elems) < 3 || elems[0] != "github.com" {
		return "", ""
	}
	if last := elems[len(elems)-1]; len(elems) > 3 && majorVersion.MatchString(last) {
		elems = elems[:len(elems)-1]
	}
	blob = "https://github.com/" + elems[1] + "/" + elems[2] + "/blob/"
	if len(elems) > 3 {
		sub = strings.Join(elems[3:], "/") + "/"
	}
	return blob, sub
}

var majorVersion = regexp.MustCompile(`^v[2-9][0-9]*$|^v1[0-9]+$`)

// runbookPath turns a runbook_url (a repository path, or a GitHub blob URL of
// this repository at any ref) into a repository path under docs/runbooks/.
func runbookPath(u, blob, sub string) (string, string) {
	if u == "" {
		return "", "no runbook_url annotation"
	}
	u, _, _ = strings.Cut(u, "#")
	if rest, ok := strings.CutPrefix(u, blob); ok && blob != "" {
		_, u, _ = strings.Cut(rest, "/") // drop the ref
		var inModule bool
		if u, inModule = strings.CutPrefix(u, sub); !inModule {
			return "", "runbook_url " + u + " is outside the module's directory " + sub
		}
	} else if strings.Contains(u, "://") {
		want := "a repository path"
		if blob != "" {
			want += " or " + blob + "<ref>/" + sub + "..."
		}
		return "", "runbook_url " + u + " is not " + want + " (go.mod's module path)"
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

// TestRunbookPathFollowsTheModulePath: runbook URLs are checked against the
// module path of go.mod, whatever it is, so a renamed fork passes with its own
// URLs and fails with the template's.
func TestRunbookPathFollowsTheModulePath(t *testing.T) {
	t.Parallel()
	const file = "docs/runbooks/service-down.md"
	for _, tc := range []struct {
		module, url string
		ok          bool
	}{
		{"github.com/example/svc", "https://github.com/example/svc/blob/main/" + file, true},
		{"github.com/example/svc", "https://github.com/example/svc/blob/v1.2.0/" + file + "#steps", true},
		{"github.com/example/svc", "https://github.com/other/svc/blob/main/" + file, false},
		{"github.com/example/svc/v2", "https://github.com/example/svc/blob/main/" + file, true},
		{"github.com/example/mono/svc", "https://github.com/example/mono/blob/main/svc/" + file, true},
		{"github.com/example/mono/svc", "https://github.com/example/mono/blob/main/" + file, false},
		{"gitlab.com/example/svc", file, true},
		{"gitlab.com/example/svc", "https://gitlab.com/example/svc/-/blob/main/" + file, false},
		{"github.com/example/svc", "docs/runbooks/../../etc/passwd.md", false},
	} {
		blob, sub := githubBlob(tc.module)
		_, err := runbookPath(tc.url, blob, sub)
		if ok := err == ""; ok != tc.ok {
			t.Errorf("module %s, runbook_url %s: accepted %v (%s), want %v", tc.module, tc.url, ok, err, tc.ok)
		}
	}
}
