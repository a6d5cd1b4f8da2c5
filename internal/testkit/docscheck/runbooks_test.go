package docscheck

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The runbooks' conventions, which the tests below hold them to:
//
//   - A runbook names the alerts that route to it (their runbook_url) in code
//     spans on a line of its own starting with "Alert:" or "Alerts:", and
//     only those: "Alerts: `BillingJobsParked`, `BillingMessagesParked`."
//   - A table whose header has a cell "alert" names alerts in that column;
//     they may route to other runbooks, but must exist.
//   - A log message is quoted in a code span right after "log line" or
//     "logs" ("look for the log line `outbox event moved to FAILED`"), or in
//     a table column headed "log message". It is quoted whole, as the code
//     writes it.
const (
	runbookDir        = "docs/runbooks"
	alertColumn       = "alert"
	logMessageColumn  = "log message"
	alertRulesRootDir = "deploy"
)

var (
	alertRuleRE    = regexp.MustCompile(`^\s*-\s+alert:\s*([A-Za-z0-9_]+)\s*$`)
	runbookURLRE   = regexp.MustCompile(`^\s*runbook_url:\s*(\S+)`)
	runbookPathRE  = regexp.MustCompile(`(docs/runbooks/[A-Za-z0-9_.-]+\.md)$`)
	alertLineRE    = regexp.MustCompile(`^Alerts?:`)
	logQuoteRE     = regexp.MustCompile(`(?i)\blog(?:s| line)\s*$`)
	alertNameShape = regexp.MustCompile(`^[A-Z][A-Za-z0-9]+$`)
)

// alertRule is one alerting rule of a Prometheus rule file.
type alertRule struct {
	name    string
	at      string // file:line of its "- alert:" line
	runbook string // slash path from the root, "" without a runbook_url into docs/runbooks
	url     string
}

// alertRules reads every alerting rule of the YAML files under deploy/: the
// compose stack's rules and the Kubernetes rules generated from them.
func alertRules(t *testing.T, root string) []alertRule {
	t.Helper()
	var rules []alertRule
	err := filepath.WalkDir(filepath.Join(root, alertRulesRootDir), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".terraform" || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(p); ext != ".yml" && ext != ".yaml" {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		sc := bufio.NewScanner(f)
		n := 0
		for sc.Scan() {
			n++
			if m := alertRuleRE.FindStringSubmatch(sc.Text()); m != nil {
				rules = append(rules, alertRule{name: m[1], at: fmt.Sprintf("%s:%d", filepath.ToSlash(rel), n)})
				continue
			}
			if m := runbookURLRE.FindStringSubmatch(sc.Text()); m != nil && len(rules) > 0 {
				r := &rules[len(rules)-1]
				r.url = strings.Trim(m[1], `"'`)
				if pm := runbookPathRE.FindStringSubmatch(r.url); pm != nil {
					r.runbook = pm[1]
				}
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) == 0 {
		t.Fatalf("no alerting rule (\"- alert: <name>\") found in the YAML files under %s/: the extraction is broken", alertRulesRootDir)
	}
	return rules
}

// runbookLine is a line of a runbook, with its code spans.
type runbookLine struct {
	doc   string
	line  int
	text  string
	spans []span
}

func (l runbookLine) at() string { return fmt.Sprintf("%s:%d", l.doc, l.line) }

// runbookLines returns the lines outside fenced code of every runbook, by
// runbook path.
func runbookLines(t *testing.T, root string) map[string][]runbookLine {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(runbookDir), "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]runbookLine{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		doc := path.Join(runbookDir, filepath.Base(f))
		out[doc] = []runbookLine{}
		fence := ""
		for i, l := range strings.Split(string(b), "\n") {
			trimmed := strings.TrimSpace(l)
			if fence != "" {
				if strings.HasPrefix(trimmed, fence) {
					fence = ""
				}
				continue
			}
			if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
				fence = trimmed[:3]
				continue
			}
			spans, _ := inlineSpans(l)
			out[doc] = append(out[doc], runbookLine{doc: doc, line: i + 1, text: l, spans: spans})
		}
	}
	if len(out) == 0 {
		t.Fatalf("no runbook found under %s", runbookDir)
	}
	return out
}

// tableState tracks the table columnSpans is in.
type tableState struct {
	col    int // column index of the wanted header, -1 when absent
	inBody bool
}

// cells returns the cells of a table row, nil for a line that is not one.
// A pipe inside a code span or escaped (\|) does not end a cell.
func cells(line string) []string {
	l := strings.TrimSpace(line)
	if !strings.HasPrefix(l, "|") {
		return nil
	}
	l = strings.TrimSuffix(strings.TrimPrefix(l, "|"), "|")
	var out []string
	start, inCode := 0, false
	for i := 0; i < len(l); i++ {
		switch {
		case l[i] == '\\':
			i++
		case l[i] == '`':
			inCode = !inCode
		case l[i] == '|' && !inCode:
			out = append(out, l[start:i])
			start = i + 1
		}
	}
	return append(out, l[start:])
}

// columnSpans walks a runbook's lines and calls fn with the code spans of
// the column headed header in every body row of every table.
func columnSpans(lines []runbookLine, header string, fn func(l runbookLine, spans []span)) {
	st := tableState{col: -1}
	for _, l := range lines {
		cs := cells(l.text)
		if cs == nil {
			st = tableState{col: -1}
			continue
		}
		if !st.inBody {
			if strings.Trim(strings.TrimSpace(l.text), "|-: ") == "" {
				st.inBody = true // the separator row
				continue
			}
			st.col = -1
			for i, c := range cs {
				if strings.EqualFold(strings.TrimSpace(c), header) {
					st.col = i
				}
			}
			continue
		}
		if st.col < 0 || st.col >= len(cs) {
			continue
		}
		spans, _ := inlineSpans(cs[st.col])
		fn(l, spans)
	}
}

// TestAlertsRouteToRunbooksThatNameThem: every alerting rule has a
// runbook_url into docs/runbooks/ whose file exists, and that runbook names
// the alert on its "Alert:"/"Alerts:" line.
func TestAlertsRouteToRunbooksThatNameThem(t *testing.T) {
	root := repoRoot(t)
	rules := alertRules(t, root)
	books := runbookLines(t, root)
	named := map[string]map[string]bool{} // runbook -> alerts on its alert lines
	for doc, lines := range books {
		named[doc] = map[string]bool{}
		for _, l := range lines {
			if alertLineRE.MatchString(l.text) {
				for _, s := range l.spans {
					named[doc][s.text] = true
				}
			}
		}
	}
	for _, r := range rules {
		switch {
		case r.runbook == "":
			t.Errorf("%s: alert %s has no runbook_url into %s/ (got %q): every alert routes to the runbook that handles it", r.at, r.name, runbookDir, r.url)
		case !exists(root, r.runbook):
			t.Errorf("%s: alert %s routes to %s, which does not exist: write it or fix the runbook_url", r.at, r.name, r.runbook)
		case !named[r.runbook][r.name]:
			t.Errorf("%s: alert %s routes to %s, which does not name it: add `%s` to the runbook's \"Alerts:\" line", r.at, r.name, r.runbook, r.name)
		}
	}
}

// TestRunbooksNameExistingAlerts: every alert a runbook names (on its
// "Alert:"/"Alerts:" line, or in a table's "alert" column) is an alerting
// rule, and the alert line names only the alerts routed to that runbook.
func TestRunbooksNameExistingAlerts(t *testing.T) {
	root := repoRoot(t)
	routed := map[string]string{} // alert -> runbook it routes to
	for _, r := range alertRules(t, root) {
		routed[r.name] = r.runbook
	}
	checked := 0
	for _, doc := range sortedRunbooks(runbookLines(t, root)) {
		lines := doc.lines
		for _, l := range lines {
			if !alertLineRE.MatchString(l.text) {
				continue
			}
			for _, s := range l.spans {
				if !alertNameShape.MatchString(s.text) {
					continue // the rule's expression, quoted beside the name
				}
				checked++
				rb, ok := routed[s.text]
				switch {
				case !ok:
					t.Errorf("%s: alert `%s` is not an alerting rule of %s/ (renamed or removed?)", l.at(), s.text, alertRulesRootDir)
				case rb != doc.path:
					t.Errorf("%s: alert `%s` routes to %s, not here: the \"Alerts:\" line names only the alerts whose runbook_url is this runbook (mention others in the text)",
						l.at(), s.text, rb)
				}
			}
		}
		columnSpans(lines, alertColumn, func(l runbookLine, spans []span) {
			for _, s := range spans {
				if !alertNameShape.MatchString(s.text) {
					continue // a rule's expression or threshold, not a name
				}
				checked++
				if _, ok := routed[s.text]; !ok {
					t.Errorf("%s: alert `%s` (table column %q) is not an alerting rule of %s/ (renamed or removed?)", l.at(), s.text, alertColumn, alertRulesRootDir)
				}
			}
		})
	}
	if checked == 0 {
		t.Fatal("no alert named by any runbook: the extraction is broken")
	}
}

// TestRunbooksQuoteExistingLogMessages: every log message a runbook quotes
// (after "log line" or "logs", or in a "log message" table column) is a
// string literal of the code, so that searching the logs for it finds what
// the code writes.
func TestRunbooksQuoteExistingLogMessages(t *testing.T) {
	ix, _ := load(t)
	checked := 0
	check := func(l runbookLine, msg string) {
		checked++
		if !ix.strs[msg] {
			t.Errorf("%s: log message %q is not a string literal of the code: quote the message as the code writes it (reworded or removed?)", l.at(), msg)
		}
	}
	for _, doc := range sortedRunbooks(runbookLines(t, ix.root)) {
		for _, l := range doc.lines {
			for _, s := range l.spans {
				if logQuoteRE.MatchString(s.before) {
					check(l, s.text)
				}
			}
		}
		columnSpans(doc.lines, logMessageColumn, func(l runbookLine, spans []span) {
			for _, s := range spans {
				check(l, s.text)
			}
		})
	}
	if checked == 0 {
		t.Fatal("no log message quoted by any runbook: the extraction is broken")
	}
}

type runbook struct {
	path  string
	lines []runbookLine
}

func sortedRunbooks(m map[string][]runbookLine) []runbook {
	out := make([]runbook, 0, len(m))
	for p, ls := range m {
		out = append(out, runbook{path: p, lines: ls})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out
}
