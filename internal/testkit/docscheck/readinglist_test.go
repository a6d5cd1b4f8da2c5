package docscheck

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The tour's reading list is the learner's path: the files the hops open,
// in reading order, each with its line count. Its budget keeps the path
// walkable; a file that grows past it means choosing what a learner may skip.
// A pattern's core file (a pkg/ file on the list) is read whole, so it is
// kept to lesson size: what does not fit moves to a file of its own that the
// list need not name.
const (
	tourDoc             = "docs/tour.md"
	readingListHeading  = "## Reading list"
	readingListHeader   = "| # | file | lines | hop |"
	maxReadingListFiles = 15
	maxReadingListLines = 5000
	maxCoreFileLines    = 400
	// corePrefix marks a pattern package's file: what a forking team keeps.
	corePrefix = "pkg/"
	// notOnReadingList starts the bullet of a hop that names packages or
	// files the learner may skip: "- **Not on the reading list:** `pkg/x` (why)".
	notOnReadingList = "not on the reading list"
)

// requiredReading are the lessons the reading list must include: each a
// non-test file of its package directory (a lesson is in the code), holding
// marker when one is given.
var requiredReading = []struct {
	lesson string
	dir    string
	marker *regexp.Regexp // nil: any Go file of dir
	hint   string         // what the marker finds, for the failure message
}{
	{
		lesson: "the fenced lease", dir: "pkg/leasequeue",
		// A fenced write that finds its lease lost turns into ErrLeaseLost.
		marker: regexp.MustCompile(`(?m)[^!=<>]=\s*ErrLeaseLost\b|\breturn\b.*\bErrLeaseLost\b`),
		hint:   "the fence check: a write that finds the lease lost returns or assigns ErrLeaseLost",
	},
	{lesson: "the API idempotency key", dir: "pkg/idempotency"},
	{lesson: "the transaction primitive", dir: "pkg/pgdb"},
}

var (
	hopHeadingRE = regexp.MustCompile(`^### (\d+)\. `)
	totalLineRE  = regexp.MustCompile(`^Total: (\d+) files, (\d+) lines\.$`)
)

// readingRow is one row of the reading list.
type readingRow struct {
	line  int // 1-based line in docs/tour.md
	num   int
	file  string // slash path from the repository root
	lines int    // as the table records it
	hop   int
}

// hopRef is a Go file or package directory a hop's text names.
type hopRef struct {
	line   int
	hop    int
	path   string // a .go file or a directory holding .go files
	marked bool   // on the hop's "Not on the reading list" bullet
}

// TestTourReadingList keeps the reading list of docs/tour.md true:
//
//   - its table is `| # | file | lines | hop |`, rows numbered 1..n in
//     reading order (hops ascending), each file listed once and existing;
//   - each row's line count is exactly what `wc -l` prints for the file
//     (no tolerance: the failure prints the corrected table to paste), and
//     the "Total: N files, M lines." line below the table is the sum;
//   - at most maxReadingListFiles files and maxReadingListLines lines, and
//     each pkg/ file (a pattern's core) at most maxCoreFileLines lines;
//   - it includes the lessons of requiredReading: the fenced lease, the API
//     idempotency key and the transaction primitive;
//   - the table's files are the files the hops name: every Go file or
//     package a hop names (in a code span, as a path or a qualified name like
//     `pkg/outbox.Relay.Run`, or as a link) has a file on the list (a package
//     is covered by any file of it) or is on that hop's "Not on the reading
//     list" bullet; and every row's hop names its file or its package.
func TestTourReadingList(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, tourDoc))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	rows, total, totalLine := parseReadingList(t, lines)
	if len(rows) == 0 {
		t.Fatalf("%s: no reading list: want a %q section with the table %q", tourDoc, readingListHeading, readingListHeader)
	}

	// Shape, order and existence.
	listed := map[string]bool{}
	listedDirs := map[string]bool{}
	contents := map[string][]byte{}
	actual := make([]int, len(rows))
	sum := 0
	stale := false
	for i, r := range rows {
		at := fmt.Sprintf("%s:%d", tourDoc, r.line)
		if r.num != i+1 {
			t.Errorf("%s: row numbered %d, want %d: number the rows 1..n in reading order", at, r.num, i+1)
		}
		if i > 0 && r.hop < rows[i-1].hop {
			t.Errorf("%s: %s is on hop %d after a file of hop %d: the list is in reading order, hops ascending", at, r.file, r.hop, rows[i-1].hop)
		}
		if listed[r.file] {
			t.Errorf("%s: %s is listed twice", at, r.file)
		}
		listed[r.file] = true
		listedDirs[path.Dir(r.file)] = true
		if !strings.HasSuffix(r.file, ".go") {
			t.Errorf("%s: %s: the reading list names Go files, not directories", at, r.file)
		}
		content, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(r.file)))
		if err != nil {
			t.Errorf("%s: %s does not exist (moved or renamed?): update the row to the file's new path and line count", at, r.file)
			actual[i] = r.lines
			continue
		}
		contents[r.file] = content
		actual[i] = bytes.Count(content, []byte("\n")) // what wc -l counts
		sum += actual[i]
		if strings.HasPrefix(r.file, corePrefix) && actual[i] > maxCoreFileLines {
			t.Errorf("%s: %s has %d lines; a pattern's core file on the reading list has at most %d: "+
				"move what a learner need not read first (options, metrics, operator tooling, a second mode) to a file of its own",
				at, r.file, actual[i], maxCoreFileLines)
		}
		if actual[i] != r.lines {
			stale = true
			t.Errorf("%s: %s has %d lines (wc -l), the table says %d", at, r.file, actual[i], r.lines)
		}
	}
	wantTotal := fmt.Sprintf("Total: %d files, %d lines.", len(rows), sum)
	switch {
	case totalLine == 0:
		stale = true
		t.Errorf("%s: no total below the reading list: want the line %q", tourDoc, wantTotal)
	case total != wantTotal:
		stale = true
		t.Errorf("%s:%d: %q, want %q", tourDoc, totalLine, total, wantTotal)
	}
	if stale {
		t.Errorf("the reading list's counts are stale: replace the table and its total in %s (section %q) with:\n\n%s",
			tourDoc, readingListHeading, renderReadingList(rows, actual))
	}

	// Budget.
	if len(rows) > maxReadingListFiles || sum > maxReadingListLines {
		t.Errorf("%s: the reading list has %d files and %d lines; the budget is %d files and %d lines: drop the least essential file "+
			"(and name its package on its hop's \"- **Not on the reading list:**\" bullet), or shorten the code it lists",
			tourDoc, len(rows), sum, maxReadingListFiles, maxReadingListLines)
	}

	// The lessons a learner must not miss.
	for _, req := range requiredReading {
		found := false
		for _, r := range rows {
			if path.Dir(r.file) != req.dir || strings.HasSuffix(r.file, "_test.go") {
				continue
			}
			if req.marker == nil || req.marker.Match(contents[r.file]) {
				found = true
			}
		}
		if !found {
			want := "a non-test file of " + req.dir
			if req.marker != nil {
				want += " holding " + req.hint
			}
			t.Errorf("%s: the reading list misses %s: add %s to the table (and name it in its hop)", tourDoc, req.lesson, want)
		}
	}

	// The table's files are the files the hops name.
	refs, hops := hopRefs(t, root, lines)
	named := map[int]map[string]bool{} // per hop, the paths its text names
	for _, r := range refs {
		if named[r.hop] == nil {
			named[r.hop] = map[string]bool{}
		}
		named[r.hop][r.path] = true
	}
	marked := map[string]bool{}
	for _, r := range refs {
		if r.marked {
			marked[r.path] = true
		}
	}
	for _, r := range refs {
		at := fmt.Sprintf("%s:%d", tourDoc, r.line)
		onList := listed[r.path] || listedDirs[r.path]
		switch {
		case r.marked && onList:
			t.Errorf("%s: hop %d marks %s %q, but the reading list has it: remove it from one of the two", at, r.hop, r.path, notOnReadingList)
		case !r.marked && !onList && !marked[r.path]:
			t.Errorf("%s: hop %d names %s, which has no file on the reading list: add the file a learner opens to the table "+
				"(%s), or name %s on the hop's \"- **Not on the reading list:**\" bullet", at, r.hop, r.path, readingListHeader, r.path)
		}
	}
	for _, r := range rows {
		at := fmt.Sprintf("%s:%d", tourDoc, r.line)
		if !hops[r.hop] {
			t.Errorf("%s: %s is listed under hop %d, and the tour has no heading \"### %d. ...\"", at, r.file, r.hop, r.hop)
			continue
		}
		if !named[r.hop][r.file] && !named[r.hop][path.Dir(r.file)] {
			t.Errorf("%s: %s is listed under hop %d, whose text names neither it nor its package %s: name it in that hop, or move the row to the hop that does",
				at, r.file, r.hop, path.Dir(r.file))
		}
	}
}

// parseReadingList reads the table of the reading-list section and the
// total line below it.
func parseReadingList(t *testing.T, lines []string) (rows []readingRow, total string, totalLine int) {
	t.Helper()
	start := -1
	for i, l := range lines {
		if strings.TrimSpace(l) == readingListHeading {
			start = i + 1
			break
		}
	}
	if start < 0 {
		return nil, "", 0
	}
	header := false
	for i := start; i < len(lines) && !strings.HasPrefix(lines[i], "#"); i++ {
		l := strings.TrimSpace(lines[i])
		if totalLineRE.MatchString(l) {
			total, totalLine = l, i+1
			continue
		}
		if !strings.HasPrefix(l, "|") {
			continue
		}
		if !header {
			if strings.Join(strings.Fields(l), " ") != readingListHeader {
				t.Fatalf("%s:%d: the reading list's header is %q, want %q", tourDoc, i+1, l, readingListHeader)
			}
			header = true
			continue
		}
		if strings.Trim(l, "|-: ") == "" {
			continue // the separator row
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) != 4 {
			t.Errorf("%s:%d: %q: want 4 cells %s", tourDoc, i+1, l, readingListHeader)
			continue
		}
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		r := readingRow{line: i + 1}
		var err1, err2, err3 error
		r.num, err1 = strconv.Atoi(cells[0])
		r.lines, err2 = strconv.Atoi(cells[2])
		r.hop, err3 = strconv.Atoi(cells[3])
		spans, rest := inlineSpans(cells[1])
		if err1 != nil || err2 != nil || err3 != nil || len(spans) != 1 {
			t.Errorf("%s:%d: %q: want | <n> | [`<file>`](../<file>) | <lines> | <hop> |", tourDoc, i+1, l)
			continue
		}
		r.file = spans[0].text
		if m := linkRE.FindStringSubmatch(rest); m != nil && m[1] != "../"+r.file {
			t.Errorf("%s:%d: the link of %s goes to %s, want ../%s", tourDoc, i+1, r.file, m[1], r.file)
		}
		rows = append(rows, r)
	}
	return rows, total, totalLine
}

// hopRefs returns the Go files and packages each hop's text names (headings
// "### <n>. ...", up to the next heading), and the hops found.
func hopRefs(t *testing.T, root string, lines []string) ([]hopRef, map[int]bool) {
	t.Helper()
	var refs []hopRef
	hops := map[int]bool{}
	hop, inMarked := -1, false
	for i, l := range lines {
		if strings.HasPrefix(l, "#") {
			hop = -1
			if m := hopHeadingRE.FindStringSubmatch(l); m != nil {
				hop, _ = strconv.Atoi(m[1])
				hops[hop] = true
			}
			continue
		}
		if hop < 0 {
			continue
		}
		// A bullet runs over its indented continuation lines.
		switch trimmed := strings.TrimSpace(l); {
		case strings.HasPrefix(trimmed, "- "):
			inMarked = strings.Contains(strings.ToLower(trimmed), notOnReadingList)
		case trimmed == "" || !strings.HasPrefix(l, " "):
			inMarked = false
		}
		spans, rest := inlineSpans(l)
		var cands []string
		for _, s := range spans {
			cands = append(cands, goPathOf(root, strings.TrimSuffix(s.text, "()")))
		}
		for _, m := range linkRE.FindAllStringSubmatch(rest, -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if !strings.Contains(target, "://") {
				cands = append(cands, goPathOf(root, path.Join(path.Dir(tourDoc), target)))
			}
		}
		for _, p := range cands {
			if p != "" {
				refs = append(refs, hopRef{line: i + 1, hop: hop, path: p, marked: inMarked})
			}
		}
	}
	return refs, hops
}

// goPathOf returns the Go file or package directory text names (a path, or
// a name qualified by its package directory), or "" when it names neither.
func goPathOf(root, text string) string {
	if m := symbolRE.FindStringSubmatch(text); m != nil {
		text = m[1]
	}
	text = strings.TrimSuffix(text, "/")
	if !strings.Contains(text, "/") || strings.HasPrefix(text, "../") {
		return ""
	}
	fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(text)))
	switch {
	case err != nil:
		return ""
	case !fi.IsDir():
		if strings.HasSuffix(text, ".go") {
			return text
		}
		return ""
	}
	goFiles, _ := filepath.Glob(filepath.Join(root, filepath.FromSlash(text), "*.go"))
	if len(goFiles) == 0 {
		return ""
	}
	return text
}

// renderReadingList prints the table and its total with the files' actual
// line counts.
func renderReadingList(rows []readingRow, actual []int) string {
	var b strings.Builder
	b.WriteString(readingListHeader + "\n|---:|---|---:|---:|\n")
	sum := 0
	for i, r := range rows {
		sum += actual[i]
		fmt.Fprintf(&b, "| %d | [`%s`](../%s) | %d | %d |\n", i+1, r.file, r.file, actual[i], r.hop)
	}
	fmt.Fprintf(&b, "\nTotal: %d files, %d lines.\n", len(rows), sum)
	return b.String()
}
