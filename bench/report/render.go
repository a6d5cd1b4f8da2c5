package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// Meta is what the report states about the run besides the benchmark
// output.
type Meta struct {
	Commit string
	// GoVersion is used when no benchmark log states go=...
	GoVersion string
}

// Plot is one series file and the image made of it (or why none was).
type Plot struct {
	CSV     string // file name, e.g. m1_rss.csv
	PNG     string // path relative to the report, "" when not plotted
	Caption string // what the plot shows, or why there is none
}

// check is one target evaluated against one metric of one result line.
type check struct {
	target Target
	unit   string // the metric's unit (the target's, or what its * matched)
	sub    string
	value  float64
	found  bool
}

func (c check) met() bool { return c.found && c.target.Cmp.holds(c.value, c.target.Threshold) }

func (c check) label() string {
	if c.sub != "" {
		return c.sub + ": " + c.unit
	}
	return c.unit
}

// evaluate applies the id's targets to every result line of b.
func evaluate(id string, b *BenchRun) []check {
	var out []check
	for _, t := range targets {
		if t.ID != id {
			continue
		}
		matched := false
		for _, res := range b.Results {
			if t.Sub != "" && !strings.Contains(res.Sub(), t.Sub) {
				continue
			}
			for _, m := range res.Metrics {
				if m.Unit == t.Unit || (strings.HasSuffix(t.Unit, "*") && strings.HasPrefix(m.Unit, strings.TrimSuffix(t.Unit, "*"))) {
					out = append(out, check{target: t, unit: m.Unit, sub: res.Sub(), value: m.Value, found: true})
					matched = true
				}
			}
		}
		if !matched {
			out = append(out, check{target: t, unit: t.Unit, sub: t.Sub})
		}
	}
	return out
}

// Render writes the markdown report.
func Render(w io.Writer, r *Run, meta Meta, plots []Plot, tables []Table) error {
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }

	p("# Benchmark report\n\n")
	p("Written by `make bench` (bench/report) from the `go test -json` output of one run and the series in bench/data. ")
	p("Every target is a ratio against an anchor measured on the same machine in the same run ([docs/performance.md](../docs/performance.md)). ")
	p("A benchmark run on its own afterwards (`make bench-distance`, `make bench-pipeline`, `make bench-river`, `make bench-watermill`) replaces its own row, Details and series, and the Environment names that run.\n\n")

	p("## Environment\n\n| | |\n|---|---|\n")
	env := func(k, label, def string) {
		v := r.Env[k]
		if v == "" {
			v = def
		}
		p("| %s | %s |\n", label, v)
	}
	p("| date | %s (start of the run) |\n", runDate(r))
	p("| commit | %s |\n", orDefault(meta.Commit, "unknown"))
	env("go", "Go", orDefault(meta.GoVersion, "unknown"))
	env("GOMAXPROCS", "GOMAXPROCS", "unknown")
	env("cpu", "CPU", "unknown")
	p("| OS/arch | %s/%s |\n", orDefault(r.Env["goos"], "?"), orDefault(r.Env["goarch"], "?"))
	env("PostgreSQL", "PostgreSQL", "not stated in the output")
	env("fsync", "PostgreSQL fsync", "not stated in the output")
	env("server settings", "PostgreSQL checkpoints and autovacuum (B1w, B2, B3: internal/testkit/benchkit PinnedSettings)", "not stated in the output")
	env("B2 tables", "B2's queue tables (autovacuum storage parameters)", "not stated in the output")
	p("\n")

	p("## Targets\n\n")
	p("| id | benchmark | anchor, same run | measured | target | result |\n|---|---|---|---|---|---|\n")
	for _, bm := range benchmarks {
		b := r.Find(bm.Package, bm.Func)
		where := fmt.Sprintf("`%s` `%s`", bm.Package, bm.Func)
		var targetText []string
		for _, t := range targets {
			if t.ID == bm.ID {
				s := fmt.Sprintf("%s %s %s", t.Unit, t.Cmp.symbol(), formatValue(t.Threshold))
				if t.Sub != "" {
					s = t.Sub + ": " + s
				}
				targetText = append(targetText, s)
			}
		}
		measured, result := summarize(r, bm, b)
		p("| %s | %s | %s | %s | %s | %s |\n", bm.ID, where, bm.Anchor, cell(measured), cell(targetText), result)
	}
	p("\n")

	p("## Details\n\n")
	known := map[*BenchRun]bool{}
	for _, bm := range benchmarks {
		b := r.Find(bm.Package, bm.Func)
		if b == nil {
			continue
		}
		known[b] = true
		p("### %s: `%s` `%s`\n\n", bm.ID, bm.Package, bm.Func)
		details(p, b)
	}
	var others []*BenchRun
	for _, b := range r.Benchmarks {
		if !known[b] {
			others = append(others, b)
		}
	}
	if len(others) > 0 {
		p("### Other benchmarks of the run\n\n")
		for _, b := range others {
			p("#### `%s` `%s`\n\n", b.Package, b.Func)
			details(p, b)
		}
	}

	if len(r.Failed) > 0 {
		p("### Packages that failed without running a benchmark\n\n")
		pkgs := slices.Sorted(maps.Keys(r.Failed))
		for _, pkg := range pkgs {
			p("`%s`:\n\n```text\n%s\n```\n\n", pkg, strings.Join(r.Failed[pkg], "\n"))
		}
	}

	if len(tables) > 0 {
		p("## Tables\n\n")
		for _, t := range tables {
			p("### %s\n\n%s\n\n", t.Title, t.Markdown)
		}
	}

	if len(plots) > 0 {
		p("## Series\n\n")
		for _, pl := range plots {
			p("### %s\n\n", pl.CSV)
			if pl.PNG != "" {
				p("![%s](%s)\n\n", strings.TrimSuffix(pl.CSV, ".csv"), pl.PNG)
			}
			if pl.Caption != "" {
				p("%s\n\n", pl.Caption)
			}
		}
	}
	_, err := io.WriteString(w, strings.TrimRight(sb.String(), "\n")+"\n")
	return err
}

// summarize returns the measured cell's lines and the result cell of one
// benchmark id.
func summarize(r *Run, bm Benchmark, b *BenchRun) ([]string, string) {
	if b == nil {
		if _, failed := r.FailedPackage(bm.Package); failed {
			return nil, "**not run**: its package failed (see Details)"
		}
		return nil, "**not run**"
	}
	switch b.Status {
	case "fail":
		return nil, "**failed** (see Details)"
	case "skip":
		return nil, "skipped: " + firstSkipReason(b)
	case "":
		return nil, "**did not finish** (timeout or crash)"
	}
	checks := evaluate(bm.ID, b)
	if len(checks) == 0 {
		return nil, "no target defined"
	}
	var measured, notMet, missing []string
	for _, c := range checks {
		if !c.found {
			missing = append(missing, c.label())
			continue
		}
		mark := "✓"
		if !c.met() {
			mark = "✗"
			notMet = append(notMet, c.label())
		}
		measured = append(measured, fmt.Sprintf("%s = %s %s", c.label(), formatValue(c.value), mark))
	}
	switch {
	case len(notMet) > 0:
		return measured, "**not met**: " + strings.Join(notMet, ", ")
	case len(missing) > 0:
		return measured, "**incomplete**: not reported: " + strings.Join(missing, ", ")
	}
	return measured, "met"
}

func firstSkipReason(b *BenchRun) string {
	for _, l := range b.Log {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		if _, after, ok := strings.Cut(l, ": "); ok && strings.Contains(l, "_test.go:") {
			return escape(after)
		}
		return escape(l)
	}
	return "no reason given"
}

func details(p func(string, ...any), b *BenchRun) {
	status := map[string]string{"pass": "passed", "fail": "**failed**", "skip": "skipped", "": "**did not finish**"}[b.Status]
	p("Status: %s.\n\n", status)
	for _, res := range b.Results {
		p("`%s` (GOMAXPROCS %d, %d iteration(s)):\n\n| metric | value |\n|---|---|\n", res.Name, res.Procs, res.N)
		for _, m := range res.Metrics {
			p("| %s | %s |\n", escape(m.Unit), formatValue(m.Value))
		}
		p("\n")
	}
	if len(b.Log) > 0 {
		p("```text\n%s\n```\n\n", strings.Join(b.Log, "\n"))
	}
}

func cell(lines []string) string {
	if len(lines) == 0 {
		return "—"
	}
	for i, l := range lines {
		lines[i] = escape(l)
	}
	return strings.Join(lines, "<br>")
}

// escape keeps a value inside its table cell.
func escape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// runDate is when the run started, or "unknown".
func runDate(r *Run) string {
	if r.Start.IsZero() {
		return "unknown"
	}
	return r.Start.UTC().Format("2006-01-02 15:04 MST")
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
