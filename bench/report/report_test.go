package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

var update = flag.Bool("update", false, "rewrite testdata/report.md from the current output")

func parseFile(t *testing.T, name string) *Run {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only
	r := &Run{}
	if err := r.Parse(f); err != nil {
		t.Fatal(err)
	}
	return r
}

// row returns the Targets table row of a benchmark id.
func row(t *testing.T, md, id string) string {
	t.Helper()
	var found []string
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "| "+id+" | `") {
			found = append(found, l)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d rows for %s, want 1:\n%s", len(found), id, md)
	}
	return found[0]
}

func TestRender_SampleRunGivesOneRowPerIdWithRatiosTargetsAndNotRun(t *testing.T) {
	r := parseFile(t, "testdata/run.json")
	dir := t.TempDir()
	plots, err := makePlots("testdata/data", filepath.Join(dir, "plots"), dir, true)
	if err != nil {
		t.Fatal(err)
	}
	tables := readTables("testdata/data")
	var buf bytes.Buffer
	if err := Render(&buf, r, Meta{Commit: "abc1234", GoVersion: "go-unused"}, plots, tables); err != nil {
		t.Fatal(err)
	}
	md := buf.String()

	for _, want := range []struct{ id, text string }{
		{"B4", "ratio = 5.36 ✓"},
		{"B4", "| met |"},
		{"M1", "burst/steady_workorder = 1.25 ✓"},
		{"M1", "rss_mb_steady_provider-sim = 45.3 ✓"},
		{"M1", "| met |"},
		{"R1", "publishThenCrash=0.2: p99_affected_s_postgres = 5.30 ✓"},
		{"R1", "publishThenCrash=0: recovery_s_billing = 0.00 ✓"},
		{"B1", "| **not run** |"},
		{"B1w", "| **not run** |"},
		{"B6", "| **not run** |"},
		{"B1p", "**not run**: its package failed"},
		{"B2", "**failed**"},
		{"B7", "p50_5ms/p50_0ms = 3.69 ✓"},
		{"B7", "capacity_5ms/capacity_0ms = 0.09 ✗"},
		{"B7", "**not met**: capacity_5ms/capacity_0ms |"},
	} {
		if got := row(t, md, want.id); !strings.Contains(got, want.text) {
			t.Errorf("%s row lacks %q:\n%s", want.id, want.text, got)
		}
	}
	// R1's p99 target holds only for the publishThenCrash pass.
	if strings.Contains(row(t, md, "R1"), "publishThenCrash=0: p99_affected") {
		t.Errorf("R1's p99 target applied to the pass without publishThenCrash:\n%s", row(t, md, "R1"))
	}
	for _, want := range []string{
		"| Go | go1.26.8 |", "| GOMAXPROCS | 2 |", "| CPU | AMD EPYC |", "| commit | abc1234 |",
		"| PostgreSQL fsync | on |", "undefined: ceilingInFlight", "raise OUTBOX_B2_BACKLOG",
		"![m1_rss](plots/m1_rss.png)", "Phases (s): capacity", "![b5_hops](plots/b5_hops.png)",
		"handoff: n 3, p50 14.2, p99 30.1",
		"![b7_latency](plots/b7_latency.png)", "p50_ms, p99_ms against the added round-trip time, one line per column.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, pl := range plots {
		b, err := os.ReadFile(filepath.Join(dir, pl.PNG))
		if err != nil {
			t.Fatalf("%s: %v", pl.CSV, err)
		}
		if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("%s: not a PNG", pl.PNG)
		}
	}

	if *update {
		if err := os.WriteFile("testdata/report.md", buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	golden, err := os.ReadFile("testdata/report.md")
	if err != nil {
		t.Fatal(err)
	}
	if md != string(golden) {
		t.Errorf("report differs from testdata/report.md (go test -run Render -update to accept):\n%s", md)
	}
}

// The statements of testdata/data/b5_statements.csv add up to 1000 ms; five
// of its twenty fall outside the top 15.
func TestRender_StatementsFileIsATableOfItsTop15WithMeanAndShareNotAPlot(t *testing.T) {
	dir := t.TempDir()
	plots, err := makePlots("testdata/data", filepath.Join(dir, "plots"), dir, true)
	if err != nil {
		t.Fatal(err)
	}
	tables := readTables("testdata/data")
	var buf bytes.Buffer
	if err := Render(&buf, &Run{}, Meta{}, plots, tables); err != nil {
		t.Fatal(err)
	}
	md := buf.String()

	_, section, ok := strings.Cut(md, "### PostgreSQL statements during B5's 50 % phase\n")
	if !ok {
		t.Fatalf("no statements section:\n%s", md)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	if !strings.Contains(section, "the 15 of 20 statements") || !strings.Contains(section, "1000 ms in all") {
		t.Errorf("section does not say it shows 15 of 20 statements totalling 1000 ms:\n%s", section)
	}
	var rows []string
	for _, l := range strings.Split(section, "\n") {
		if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| database |") {
			rows = append(rows, l)
		}
	}
	if len(rows) != 15 {
		t.Fatalf("%d statement rows, want 15:\n%s", len(rows), section)
	}
	for i, want := range map[int]string{
		// Mean 250/400, share 250/1000; the line break of the query collapsed.
		0: "| workorder | 400 | 400 | 250 | 0.625 | 25.0 % | `INSERT INTO outbox (aggregate_id, kind, payload) VALUES ($1, $2, $3)` |",
		// Commas, quotes and pipes of the query kept, the pipes escaped.
		1:  "| billing | 3 | 3 | 100 | 33.333 | 10.0 % | `SELECT a, b FROM invoices WHERE note = $1 AND (tags \\|\\| $2) <> '{\"x\":1}'` |",
		14: "| workorder | 40 | 40 | 20.0 | 0.500 | 2.0 % | `SELECT statement fifteen` |",
	} {
		if rows[i] != want {
			t.Errorf("row %d:\n got %s\nwant %s", i+1, rows[i], want)
		}
	}
	long := rows[12]
	if !strings.HasPrefix(long, "| billing | 8 | 800 | 25.0 | 3.125 | 2.5 % | `WITH due AS (SELECT id FROM leasequeue_jobs") {
		t.Errorf("row 13: %s", long)
	}
	if q := long[strings.Index(long, "`")+1 : strings.LastIndex(long, "`")]; utf8.RuneCountInString(q) != statementWidth || !strings.HasSuffix(q, "…") {
		t.Errorf("row 13's statement is %d characters, want %d ending in …: %s", utf8.RuneCountInString(q), statementWidth, q)
	}
	if strings.Contains(section, "statement sixteen") {
		t.Errorf("the 16th statement is in the table:\n%s", section)
	}

	for _, pl := range plots {
		if pl.CSV == "b5_statements.csv" {
			t.Errorf("b5_statements.csv listed as a series: %+v", pl)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "plots", "b5_statements.png")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("b5_statements.png: %v, want not made", err)
	}

	// Without the file, no section.
	none := readTables(t.TempDir())
	if len(none) != 0 {
		t.Fatalf("readTables of a directory without table files = %v", none)
	}

	// A file of another shape is named as not rendered, not dropped.
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "b5_statements.csv"), []byte("database,calls\nworkorder,1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := readTables(bad); len(got) != 1 || !strings.HasPrefix(got[0].Markdown, "Not rendered: b5_statements.csv: no column rows") {
		t.Errorf("readTables of a file without rows and total_ms = %+v", got)
	}
	buf.Reset()
	if err := Render(&buf, &Run{}, Meta{}, plots, none); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "PostgreSQL statements") {
		t.Errorf("statements section without b5_statements.csv:\n%s", buf.String())
	}
}

func TestParse_ResultLineSplitAcrossOutputEventsIsOneResult(t *testing.T) {
	const in = `{"Action":"output","Package":"x/e2e","Test":"BenchmarkM1_Memory","Output":"BenchmarkM1_Memory-2   \t       1\t100 ns/op\t"}
{"Action":"output","Package":"x/e2e","Test":"BenchmarkM1_Memory","Output":"  150.5 rss_mb_steady_workorder\n"}
{"Action":"pass","Package":"x/e2e","Test":"BenchmarkM1_Memory"}
`
	r := &Run{}
	if err := r.Parse(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	b := r.Find("e2e", "BenchmarkM1_Memory")
	if b == nil || len(b.Results) != 1 {
		t.Fatalf("got %+v, want one result", b)
	}
	checks := evaluate("M1", b)
	var steady *check
	for i := range checks {
		if checks[i].unit == "rss_mb_steady_workorder" {
			steady = &checks[i]
		}
	}
	if steady == nil || steady.value != 150.5 || steady.met() {
		t.Fatalf("rss_mb_steady_workorder check = %+v, want 150.5, not met (target ≤ 150)", steady)
	}
}

func TestTargets_EveryIdIsADeclaredBenchmark(t *testing.T) {
	ids := map[string]bool{}
	for _, b := range benchmarks {
		if ids[b.ID] {
			t.Errorf("%s declared twice", b.ID)
		}
		ids[b.ID] = true
	}
	for _, tg := range targets {
		if !ids[tg.ID] {
			t.Errorf("target %s %s: no benchmark %s", tg.Unit, tg.Cmp, tg.ID)
		}
		if tg.Cmp.symbol() == "" || !strings.Contains(">=<=<", string(tg.Cmp)) {
			t.Errorf("target %s %s: unknown comparison %q", tg.ID, tg.Unit, tg.Cmp)
		}
	}
}

func TestPlot_TimeSeriesOfRoundsDrawsOneLinePerRoundAndSideNotARoundLine(t *testing.T) {
	dir := t.TempDir()
	csvPath := filepath.Join(dir, "b3_rate.csv")
	data := "round,side,t_s,jobs_per_s\n" +
		"0,river,1,7000\n0,river,2,7100\n0,leasequeue,1,11000\n0,leasequeue,2,11500\n" +
		"1,river,1,6900\n1,river,2,7000\n1,leasequeue,1,10000\n1,leasequeue,2,10500\n"
	if err := os.WriteFile(csvPath, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	caption, err := plotSeries(csvPath, filepath.Join(dir, "b3_rate.png"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "jobs_per_s over time, one line per round and side."; caption != want {
		t.Errorf("caption %q, want %q (round is a line's name, not a plotted value)", caption, want)
	}
	// Without a time axis the rounds are values: a distribution per column.
	rounds := filepath.Join(dir, "b3_rounds.csv")
	if err := os.WriteFile(rounds, []byte("round,ours,theirs\n0,11000,7000\n1,10000,6900\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	caption, err = plotSeries(rounds, filepath.Join(dir, "b3_rounds.png"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(caption, "ours: n 2") {
		t.Errorf("caption %q: want the distribution of column ours over 2 rounds", caption)
	}
}

// B7 writes its series against the added round-trip time, not over time:
// rtt_ms is the x axis, in any row order, and never a plotted value.
func TestPlot_SeriesAgainstAddedRTTDrawsRTTOnTheXAxis(t *testing.T) {
	dir := t.TempDir()
	csvPath := filepath.Join(dir, "b7_hops.csv")
	data := "rtt_ms,hop,p50_ms\n5,handoff,120\n0,handoff,12\n1,handoff,30\n5,correlate,66\n0,correlate,5\n1,correlate,16\n"
	if err := os.WriteFile(csvPath, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	png := filepath.Join(dir, "b7_hops.png")
	caption, err := plotSeries(csvPath, png)
	if err != nil {
		t.Fatal(err)
	}
	if want := "p50_ms against the added round-trip time, one line per hop."; caption != want {
		t.Errorf("caption %q, want %q", caption, want)
	}
	b, err := os.ReadFile(png)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("%s: not a PNG", png)
	}
}

func TestTables_SweepFilesAreTablesNamingTheWinner(t *testing.T) {
	dir := t.TempDir()
	sweep := "side,workers,burn_down_jobs_per_s,burn_down_range,continuous_p50_ms,p50_range,continuous_p99_ms,won\n" +
		"river,100,5494,5400–5600,25.8,25.0–26.0,103.2,\n" +
		"river,2000,7100,7000–7200,24.1,23.0–25.0,99.0,\"best burn-down, best latency\"\n"
	if err := os.WriteFile(filepath.Join(dir, "b3_sweep.csv"), []byte(sweep), 0o644); err != nil {
		t.Fatal(err)
	}
	tables := readTables(dir)
	if len(tables) != 1 || !strings.HasPrefix(tables[0].Title, "B3 sweep") {
		t.Fatalf("readTables = %+v, want the B3 sweep table", tables)
	}
	for _, want := range []string{
		"| side | workers | burn_down_jobs_per_s |",
		"| river | 2000 | 7100 | 7000–7200 | 24.1 | 23.0–25.0 | 99.0 | best burn-down, best latency |",
	} {
		if !strings.Contains(tables[0].Markdown, want) {
			t.Errorf("table\n%s\nlacks %q", tables[0].Markdown, want)
		}
	}
	plots, err := makePlots(dir, filepath.Join(dir, "plots"), dir, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(plots) != 0 {
		t.Errorf("makePlots drew %+v from a table file", plots)
	}
}

// b5_hop_cost.csv is a table of stages by service database, each cell
// statements / round trips / commits per order, not a plot; a malformed
// figure is named, not rendered.
func TestTables_HopCostIsAStageByDatabaseTableNotAPlot(t *testing.T) {
	dir := t.TempDir()
	file := "stage,database,statements_per_order,round_trips_per_order,commits_per_order\n" +
		"handoff,workorder,5.190,5.190,5.190\n" +
		"invoiced,billing,5.000,5.000,2.540\n" +
		"invoiced,workorder,1.080,1.080,1.080\n" +
		"other,workorder,0.000,0.000,-1.250\n" +
		"total,billing,44.360,26.580,5.000\n" +
		"total,workorder,139.444,74.220,10.000\n"
	if err := os.WriteFile(filepath.Join(dir, "b5_hop_cost.csv"), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	tables := readTables(dir)
	if len(tables) != 1 || !strings.HasPrefix(tables[0].Title, "B5 per-hop cost") {
		t.Fatalf("readTables = %+v, want the B5 per-hop cost table", tables)
	}
	for _, want := range []string{
		"| stage | billing | workorder |\n|---|---|---|\n",
		"| handoff | — | 5.19 / 5.19 / 5.19 |",
		"| invoiced | 5.00 / 5.00 / 2.54 | 1.08 / 1.08 / 1.08 |",
		"| other | — | 0.00 / 0.00 / -1.25 |",
		"| total | 44.36 / 26.58 / 5.00 | 139.44 / 74.22 / 10.00 |",
	} {
		if !strings.Contains(tables[0].Markdown, want) {
			t.Errorf("table\n%s\nlacks %q", tables[0].Markdown, want)
		}
	}
	plots, err := makePlots(dir, filepath.Join(dir, "plots"), dir, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(plots) != 0 {
		t.Errorf("makePlots drew %+v from a table file", plots)
	}
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "b5_hop_cost.csv"), []byte("stage,database,statements_per_order,round_trips_per_order,commits_per_order\nhandoff,workorder,x,1,1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := readTables(bad); len(got) != 1 || !strings.HasPrefix(got[0].Markdown, "Not rendered: b5_hop_cost.csv: row 2: statements_per_order") {
		t.Errorf("readTables of a malformed file = %+v", got)
	}
}

// The conditions B2 logs (benchkit.PinServer's settings, its queue tables'
// storage parameters) reach the report's environment.
func TestParse_ServerConditionsOfB2AreInTheEnvironment(t *testing.T) {
	const in = `{"Action":"output","Package":"x/bench/outbox","Test":"BenchmarkB2_SustainedDrain","Output":"    bench_test.go:150: B2 server settings pinned: checkpoint_timeout=1800s max_wal_size=32768MB\n"}
{"Action":"output","Package":"x/bench/outbox","Test":"BenchmarkB2_SustainedDrain","Output":"    bench_test.go:160: B2 queue tables: outbox (autovacuum_vacuum_threshold=300000)\n"}
{"Action":"pass","Package":"x/bench/outbox","Test":"BenchmarkB2_SustainedDrain"}
`
	r := &Run{}
	if err := r.Parse(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Render(&buf, r, Meta{}, nil, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| PostgreSQL checkpoints and autovacuum (B1w, B2, B3: internal/testkit/benchkit PinnedSettings) | pinned: checkpoint_timeout=1800s max_wal_size=32768MB |",
		"| B2's queue tables (autovacuum storage parameters) | outbox (autovacuum_vacuum_threshold=300000) |",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, buf.String())
		}
	}
}

// A benchmark run on its own merges into the report of an earlier full run:
// its row, Details and series replace the earlier ones, the rest of the
// earlier report stays as it was, the Environment names the later run, and
// merging the same run again changes nothing.
func TestMerge_ALaterRunOfOneBenchmarkReplacesOnlyItsOwnRowsSectionsAndSeries(t *testing.T) {
	raw, err := os.ReadFile("testdata/run.json")
	if err != nil {
		t.Fatal(err)
	}
	var first, later []string
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if strings.Contains(l, `"Test": "BenchmarkB7_Distance"`) {
			later = append(later, l)
		} else {
			first = append(first, l)
		}
	}
	render := func(lines []string, dataDir string, clean bool, dir string) (string, *Run) {
		t.Helper()
		r := &Run{}
		if err := r.Parse(strings.NewReader(strings.Join(lines, "\n") + "\n")); err != nil {
			t.Fatal(err)
		}
		plots, err := makePlots(dataDir, filepath.Join(dir, "plots"), dir, clean)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := Render(&buf, r, Meta{Commit: "abc1234"}, plots, readTables(dataDir)); err != nil {
			t.Fatal(err)
		}
		return buf.String(), r
	}
	dir := t.TempDir()
	firstData, laterData := filepath.Join(dir, "first"), filepath.Join(dir, "later")
	for d, files := range map[string][]string{firstData: {"m1_rss.csv", "b5_hops.csv", "b5_statements.csv"}, laterData: {"b7_latency.csv"}} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join("testdata/data", f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	earlier, _ := render(first, firstData, true, dir)
	if got := row(t, earlier, "B7"); !strings.Contains(got, "**not run**") {
		t.Fatalf("the earlier report ran B7: %s", got)
	}
	fresh, r := render(later, laterData, false, dir)
	merged, err := Merge(earlier, fresh, r, Meta{Commit: "def5678"})
	if err != nil {
		t.Fatal(err)
	}
	if got := row(t, merged, "B7"); !strings.Contains(got, "p50_5ms/p50_0ms = 3.69 ✓") {
		t.Errorf("B7's row not replaced: %s", got)
	}
	for _, id := range []string{"B1", "B4", "M1", "R1", "B2"} {
		if row(t, merged, id) != row(t, earlier, id) {
			t.Errorf("%s's row changed:\n%s\n%s", id, row(t, earlier, id), row(t, merged, id))
		}
	}
	for _, want := range []string{"### B7: `e2e` `BenchmarkB7_Distance`", "### b7_latency.csv", "### m1_rss.csv", "### B4: ", "### PostgreSQL statements during B5's 50 % phase"} {
		if n := strings.Count(merged, "\n"+want); n != 1 {
			t.Errorf("%d sections %q, want 1", n, want)
		}
	}
	if !strings.Contains(merged, "| commit | abc1234 |") || !strings.Contains(merged, "| later run: B7 | 2026-12-02 14:41 UTC, commit def5678") {
		t.Errorf("Environment does not name both runs:\n%s", merged[:strings.Index(merged, "## Targets")])
	}
	if i, j := strings.Index(merged, "### B7: "), strings.Index(merged, "### Packages that failed"); j < 0 || i > j {
		t.Error("B7's Details section landed after the packages that failed (or they went)")
	}
	for _, png := range []string{"m1_rss.png", "b7_latency.png"} {
		if _, err := os.Stat(filepath.Join(dir, "plots", png)); err != nil {
			t.Errorf("plot %s: %v", png, err)
		}
	}
	again, err := Merge(merged, fresh, r, Meta{Commit: "def5678"})
	if err != nil {
		t.Fatal(err)
	}
	if again != merged {
		t.Errorf("merging the same run twice changed the report:\n%s", again)
	}

	// A report from before B7 existed has no row for it: the row goes
	// in the benchmarks' order, and so does its Details section.
	older, ok := replaceLine(earlier, "| B7 | `", "\x00")
	if !ok {
		t.Fatal("no B7 row to drop")
	}
	older = strings.Replace(older, "\x00\n", "", 1)
	merged, err = Merge(older, fresh, r, Meta{Commit: "def5678"})
	if err != nil {
		t.Fatal(err)
	}
	if got := row(t, merged, "B7"); !strings.Contains(got, "p50_5ms/p50_0ms = 3.69 ✓") {
		t.Errorf("B7's row not added: %s", got)
	}
	if i, j, k := strings.Index(merged, "| B6 | `"), strings.Index(merged, "| B7 | `"), strings.Index(merged, "| M1 | `"); i > j || j > k {
		t.Errorf("B7's row not between B6's and M1's:\n%s", merged)
	}
	if i, j := strings.Index(merged, "### B7: "), strings.Index(merged, "### M1: "); i < 0 || i > j {
		t.Errorf("B7's Details section not before M1's:\n%s", merged)
	}
}

func TestRepoRelative_PathsUnderTheRepositoryAreWrittenFromItsRoot(t *testing.T) {
	in := "CPU profile of billing (/srv/repo/bench/data/b5/billing.pprof):\n" +
		"profiles in /srv/repo\nrun in /srv/repo, not /srv/repo2/x\n"
	want := "CPU profile of billing (bench/data/b5/billing.pprof):\n" +
		"profiles in .\nrun in ., not /srv/repo2/x\n"
	for _, root := range []string{"/srv/repo", "/srv/repo/"} {
		if got := string(repoRelative([]byte(in), root)); got != want {
			t.Errorf("root %q:\n got %q\nwant %q", root, got, want)
		}
	}
	if got := string(repoRelative([]byte(in), "")); got != in {
		t.Errorf("no root: changed the text to %q", got)
	}
}

// A later run that ran again every benchmark of an earlier later run
// replaces all of that run's rows, so the Environment stops naming it; a run
// some of whose benchmarks were not run again stays named.
func TestDropSuperseded_NamesOnlyTheRunsWhoseRowsAreLeft(t *testing.T) {
	md := strings.Join([]string{
		"| commit | abc1234 |",
		"| later run: B1 | 06:13, commit 1111111 |",
		"| later run: B2, B3 | 06:25, commit 2222222 |",
		"| later run: B1, B2 | 07:00, commit 3333333 |",
		"| later run: B5 | 08:14, commit 4444444 |",
		"",
	}, "\n")
	got := dropSuperseded(md, "| later run: B1, B2 |", []string{"B1", "B2"})
	want := strings.Join([]string{
		"| commit | abc1234 |",
		"| later run: B2, B3 | 06:25, commit 2222222 |",
		"| later run: B1, B2 | 07:00, commit 3333333 |",
		"| later run: B5 | 08:14, commit 4444444 |",
		"",
	}, "\n")
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}
