package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// tableFile is a CSV of the data directory that is a table, not a series:
// the report shows it as a markdown table, and makePlots skips it.
type tableFile struct {
	title string
	// render turns the file's records (header first) into markdown.
	render func(recs [][]string) (string, error)
}

// tableFiles by file name.
var tableFiles = map[string]tableFile{
	"b5_statements.csv":       {"PostgreSQL statements during B5's 50 % phase", statementsTable("b5_statements.csv")},
	"b5_probe_statements.csv": {"PostgreSQL statements during B5's capacity probe (the per-hop cost's input)", statementsTable("b5_probe_statements.csv")},
	"b5_hop_cost.csv":         {"B5 per-hop cost: statements, round trips and commits per order over the capacity probe", hopCostTable},
	"ab_rounds.csv":           {"A/B (make bench-ab): each side's figures per round", csvTable},
	"b1w_sweep.csv":           {"B1w sweep: each side's rows/s per backlog size and watermill adapter, over the rounds (which adapter won)", csvTable},
	"b1w_rounds.csv":          {"B1w rounds: relay and watermill rows/s per size, adapter and round (which side ran first)", csvTable},
	"b3_sweep.csv":            {"B3 sweep: each side's burn-down jobs/s and continuous completion latency per worker count, over the rounds (which setting won)", csvTable},
	"b3_rounds.csv":           {"B3 rounds: both sides per worker count and round (which side ran first)", csvTable},
}

// Table is one table file of the run, rendered (or why it was not).
type Table struct {
	Title    string
	Markdown string
}

// readTables renders the table files present in dataDir, in file name
// order. A file that cannot be rendered is listed with the reason instead.
func readTables(dataDir string) []Table {
	if dataDir == "" {
		return nil
	}
	var out []Table
	for _, name := range slices.Sorted(maps.Keys(tableFiles)) {
		recs, err := readCSV(filepath.Join(dataDir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		tf := tableFiles[name]
		var md string
		if err == nil {
			md, err = tf.render(recs)
		}
		if err != nil {
			md = fmt.Sprintf("Not rendered: %s: %v", name, err)
		}
		out = append(out, Table{Title: tf.title, Markdown: md})
	}
	return out
}

func readCSV(name string) ([][]string, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, errors.New("no header")
	}
	return recs, nil
}

const (
	// topStatements is how many statements the table shows (B5 names as
	// many on stderr).
	topStatements = 15
	// statementWidth keeps a statement to about one line of a rendered
	// table.
	statementWidth = 140
)

type statement struct {
	db, query   string
	calls, rows int64
	totalMs     float64
}

// statementsTable renders a statements file of B5 (pg_stat_statements of
// the services' databases): the statements with the most execution time,
// each with its share of the time of every statement in the file.
func statementsTable(name string) func(recs [][]string) (string, error) {
	return func(recs [][]string) (string, error) { return renderStatements(name, recs) }
}

func renderStatements(name string, recs [][]string) (string, error) {
	cols := map[string]int{}
	for _, h := range []string{"database", "calls", "rows", "total_ms", "query"} {
		cols[h] = slices.Index(recs[0], h)
		if cols[h] < 0 {
			return "", fmt.Errorf("no column %s", h)
		}
	}
	var sts []statement
	var sum float64
	for n, r := range recs[1:] {
		st := statement{db: r[cols["database"]], query: r[cols["query"]]}
		var errs [3]error
		st.calls, errs[0] = strconv.ParseInt(r[cols["calls"]], 10, 64)
		st.rows, errs[1] = strconv.ParseInt(r[cols["rows"]], 10, 64)
		st.totalMs, errs[2] = strconv.ParseFloat(r[cols["total_ms"]], 64)
		if err := errors.Join(errs[:]...); err != nil {
			return "", fmt.Errorf("row %d: %w", n+2, err)
		}
		sum += st.totalMs
		sts = append(sts, st)
	}
	if len(sts) == 0 {
		return "No statements recorded.", nil
	}
	slices.SortStableFunc(sts, func(a, b statement) int {
		switch {
		case a.totalMs > b.totalMs:
			return -1
		case a.totalMs < b.totalMs:
			return 1
		}
		return 0
	})
	top := sts[:min(len(sts), topStatements)]

	var sb strings.Builder
	fmt.Fprintf(&sb, "From `%s`: the %d of %d statements with the most execution time (pg_stat_statements' "+
		"total_exec_time, lock and I/O waits included), %s ms in all; share is of that sum.\n\n", name, len(top), len(sts), formatValue(sum))
	sb.WriteString("| database | calls | rows | total ms | mean ms | share | statement |\n|---|---|---|---|---|---|---|\n")
	for _, st := range top {
		mean, share := "—", "—"
		if st.calls > 0 {
			mean = fmt.Sprintf("%.3f", st.totalMs/float64(st.calls))
		}
		if sum > 0 {
			share = fmt.Sprintf("%.1f %%", 100*st.totalMs/sum)
		}
		fmt.Fprintf(&sb, "| %s | %d | %d | %s | %s | %s | %s |\n",
			escape(st.db), st.calls, st.rows, formatValue(st.totalMs), mean, share, codeSpan(escape(shorten(st.query, statementWidth))))
	}
	return strings.TrimRight(sb.String(), "\n"), nil
}

// csvTable renders a table file as it is: its header, then one row per
// record, every cell escaped.
func csvTable(recs [][]string) (string, error) {
	var sb strings.Builder
	row := func(cells []string) {
		sb.WriteString("|")
		for _, c := range cells {
			sb.WriteString(" " + escape(c) + " |")
		}
		sb.WriteString("\n")
	}
	row(recs[0])
	row(slices.Repeat([]string{"---"}, len(recs[0])))
	for n, r := range recs[1:] {
		if len(r) != len(recs[0]) {
			return "", fmt.Errorf("row %d: %d cells, header has %d", n+2, len(r), len(recs[0]))
		}
		row(r)
	}
	return strings.TrimRight(sb.String(), "\n"), nil
}

// shorten collapses whitespace and cuts s to at most n characters, the
// last an ellipsis when cut.
func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// codeSpan quotes s as inline code, so that SQL's * and < are not read as
// markdown, with a fence longer than any run of backticks in s.
func codeSpan(s string) string {
	longest, run := 0, 0
	for _, c := range s {
		if c == '`' {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	fence := strings.Repeat("`", longest+1)
	if longest > 0 {
		return fence + " " + s + " " + fence
	}
	return fence + s + fence
}

// hopCostTable renders b5_hop_cost.csv (e2e/hopcost_bench_test.go): one row
// per stage of the path, the service databases as column groups, the
// databases' totals last. A stage's commits are its transaction markers'
// calls; what they leave of a database's commits is that database's
// "other" (negative when markers overcount).
func hopCostTable(recs [][]string) (string, error) {
	cols := map[string]int{}
	for _, h := range []string{"stage", "database", "statements_per_order", "round_trips_per_order", "commits_per_order"} {
		cols[h] = slices.Index(recs[0], h)
		if cols[h] < 0 {
			return "", fmt.Errorf("no column %s", h)
		}
	}
	type cell struct{ st, rt, cm string }
	var stages, dbs []string
	cells := map[[2]string]cell{}
	for n, r := range recs[1:] {
		if len(r) != len(recs[0]) {
			return "", fmt.Errorf("row %d: %d cells, header has %d", n+2, len(r), len(recs[0]))
		}
		for _, h := range []string{"statements_per_order", "round_trips_per_order", "commits_per_order"} {
			if _, err := strconv.ParseFloat(r[cols[h]], 64); err != nil {
				return "", fmt.Errorf("row %d: %s: %w", n+2, h, err)
			}
		}
		stage, db := r[cols["stage"]], r[cols["database"]]
		if !slices.Contains(stages, stage) {
			stages = append(stages, stage)
		}
		if !slices.Contains(dbs, db) {
			dbs = append(dbs, db)
		}
		cells[[2]string{stage, db}] = cell{short(r[cols["statements_per_order"]]), short(r[cols["round_trips_per_order"]]), short(r[cols["commits_per_order"]])}
	}
	slices.Sort(dbs)
	var sb strings.Builder
	sb.WriteString("From `b5_hop_cost.csv` (e2e/hopcost_bench_test.go): per order over the capacity probe, each cell " +
		"statements / round trips / commits. Statements are pg_stat_statements calls (BEGIN, COMMIT and SET LOCAL " +
		"under transaction control); round trips count the statements of one pgx.Batch or one multi-statement query " +
		"once; commits are pg_stat_database's, split by each stage's transaction marker, the rest under other.\n\n")
	sb.WriteString("| stage |")
	for _, db := range dbs {
		sb.WriteString(" " + escape(db) + " |")
	}
	sb.WriteString("\n|---|" + strings.Repeat("---|", len(dbs)) + "\n")
	for _, stage := range stages {
		sb.WriteString("| " + escape(stage) + " |")
		for _, db := range dbs {
			c, ok := cells[[2]string{stage, db}]
			if !ok {
				sb.WriteString(" — |")
				continue
			}
			fmt.Fprintf(&sb, " %s / %s / %s |", c.st, c.rt, c.cm)
		}
		sb.WriteString("\n")
	}
	return strings.TrimRight(sb.String(), "\n"), nil
}

// short prints a per-order figure with two decimals.
func short(v string) string {
	f, _ := strconv.ParseFloat(v, 64) // checked by the caller
	return strconv.FormatFloat(f, 'f', 2, 64)
}
