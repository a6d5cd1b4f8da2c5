package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Merge splices the benchmarks of a later run into the report of an earlier
// one, so that a benchmark run on its own (make bench-distance, bench-river,
// bench-watermill) lands in bench/report.md without dropping the rest of the
// last full run. For each
// id the later run ran, its Targets row and its Details section replace the
// earlier ones; so do the Series and Tables sections of the files it wrote;
// the Environment gains a row naming the later run (date, commit, fsync),
// replacing one an earlier merge of the same ids wrote and dropping those of
// earlier merges whose every id it ran again. Everything else
// keeps the earlier run's text, so every figure still says which run it
// came from.
func Merge(earlier, later string, r *Run, meta Meta) (string, error) {
	var ids []string
	for _, bm := range benchmarks {
		if r.Find(bm.Package, bm.Func) != nil {
			ids = append(ids, bm.ID)
		}
	}
	if len(ids) == 0 {
		return "", errors.New("merge: the run holds none of the report's benchmarks")
	}
	out := earlier
	if intro, ok := line(later, "Written by "); ok {
		out, _ = replaceLine(out, "Written by ", intro)
	}
	for _, id := range ids {
		prefix := "| " + id + " | `"
		row, ok := line(later, prefix)
		if !ok {
			return "", fmt.Errorf("merge: no Targets row for %s in the later run's report", id)
		}
		if o, ok := replaceLine(out, prefix, row); ok {
			out = o
		} else if out, ok = insertRow(out, id, row); !ok {
			return "", errors.New("merge: the earlier report has no Targets table")
		}
		sec, ok := section(later, "### "+id+": ")
		if !ok {
			return "", fmt.Errorf("merge: no Details section for %s in the later run's report", id)
		}
		out = putSection(out, "## Details", "### "+id+": ", sec)
	}
	for _, block := range []string{"## Tables", "## Series"} {
		for _, title := range titles(later, block) {
			sec, _ := section(later, "### "+title+"\n")
			out = putSection(out, block, "### "+title+"\n", sec)
		}
	}
	key := laterRunPrefix + strings.Join(ids, ", ") + " |"
	out = dropSuperseded(out, key, ids)
	envRow := fmt.Sprintf("%s %s, commit %s, %s, PostgreSQL fsync %s (its rows, Details and series replace the run above's) |",
		key, runDate(r), orDefault(meta.Commit, "unknown"), orDefault(r.Env["go"], orDefault(meta.GoVersion, "unknown")),
		orDefault(r.Env["fsync"], "not stated"))
	if o, ok := replaceLine(out, key, envRow); ok {
		return o, nil
	}
	// The Environment table ends at its first blank line.
	head, rest, ok := strings.Cut(out, "## Environment\n\n")
	if !ok {
		return "", errors.New("merge: the earlier report has no Environment section")
	}
	table, tail, _ := strings.Cut(rest, "\n\n")
	return head + "## Environment\n\n" + table + "\n" + envRow + "\n\n" + tail, nil
}

// rank is id's place in the report's order of benchmarks.
func rank(id string) int {
	return slices.IndexFunc(benchmarks, func(b Benchmark) bool { return b.ID == id })
}

// idOf returns the benchmark id of a Targets row or a Details heading
// ("| B7 | `…", "### B7: `…"), or "".
func idOf(l string) string {
	var id string
	var ok bool
	if rest, row := strings.CutPrefix(l, "| "); row {
		id, _, ok = strings.Cut(rest, " | `")
	} else if rest, heading := strings.CutPrefix(l, "### "); heading {
		id, _, ok = strings.Cut(rest, ": `")
	}
	if !ok || rank(id) < 0 {
		return ""
	}
	return id
}

// insertRow adds id's Targets row to an earlier report that has none (the
// benchmark is newer than its run), before the row of the first id that
// comes after it, else after the table's last row.
func insertRow(md, id, row string) (string, bool) {
	ls := strings.Split(md, "\n")
	start := slices.Index(ls, "## Targets")
	if start < 0 {
		return md, false
	}
	last := -1
	for i := start + 1; i < len(ls) && !strings.HasPrefix(ls[i], "## "); i++ {
		other := idOf(ls[i])
		if other == "" {
			continue
		}
		if rank(other) > rank(id) {
			return strings.Join(slices.Insert(ls, i, row), "\n"), true
		}
		last = i
	}
	if last < 0 {
		return md, false
	}
	return strings.Join(slices.Insert(ls, last+1, row), "\n"), true
}

// line returns the first line of md that starts with prefix.
func line(md, prefix string) (string, bool) {
	for l := range strings.SplitSeq(md, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}

// laterRunPrefix starts an Environment row that names a later run.
const laterRunPrefix = "| later run: "

// dropSuperseded removes the Environment rows of earlier later runs whose
// every benchmark ids ran again: none of their rows is left in the report.
// The row of key (the same ids) stays, for replaceLine to update in place.
func dropSuperseded(md, key string, ids []string) string {
	ls := strings.Split(md, "\n")
	out := ls[:0]
	for _, l := range ls {
		rest, isRun := strings.CutPrefix(l, laterRunPrefix)
		named, _, _ := strings.Cut(rest, " |")
		if isRun && !strings.HasPrefix(l, key) && !slices.ContainsFunc(strings.Split(named, ", "), func(id string) bool { return !slices.Contains(ids, id) }) {
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// replaceLine replaces the first line of md that starts with prefix.
func replaceLine(md, prefix, with string) (string, bool) {
	ls := strings.Split(md, "\n")
	for i, l := range ls {
		if strings.HasPrefix(l, prefix) {
			ls[i] = with
			return strings.Join(ls, "\n"), true
		}
	}
	return md, false
}

// section returns the section of md whose heading line starts with
// heading, up to the next heading of its level or above.
func section(md, heading string) (string, bool) {
	i := strings.Index(md, "\n"+heading)
	if i < 0 {
		return "", false
	}
	s := md[i+1:]
	if end := nextHeading(s); end >= 0 {
		s = s[:end]
	}
	return strings.TrimRight(s, "\n") + "\n\n", true
}

// nextHeading is the index of the first "## " or "### " heading of s after
// its first line, or -1.
func nextHeading(s string) int {
	off := strings.IndexByte(s, '\n')
	if off < 0 {
		return -1
	}
	for off < len(s) {
		rest := s[off+1:]
		if strings.HasPrefix(rest, "## ") || strings.HasPrefix(rest, "### ") {
			return off + 1
		}
		n := strings.IndexByte(rest, '\n')
		if n < 0 {
			return -1
		}
		off += n + 1
	}
	return -1
}

// titles lists the "### " headings inside md's block (a "## " section).
func titles(md, block string) []string {
	_, s, ok := strings.Cut(md, "\n"+block+"\n")
	if !ok {
		return nil
	}
	if end := strings.Index(s, "\n## "); end >= 0 {
		s = s[:end]
	}
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if t, ok := strings.CutPrefix(l, "### "); ok {
			out = append(out, t)
		}
	}
	return out
}

// putSection replaces md's section under heading with sec, or adds it at the
// end of block (which it adds at the end of md when md has none).
func putSection(md, block, heading, sec string) string {
	if i := strings.Index(md, "\n"+heading); i >= 0 {
		s := md[i+1:]
		end := len(s)
		if n := nextHeading(s); n >= 0 {
			end = n
		}
		return md[:i+1] + sec + strings.TrimLeft(s[end:], "\n")
	}
	i := strings.Index(md, "\n"+block+"\n")
	if i < 0 {
		return strings.TrimRight(md, "\n") + "\n\n" + block + "\n\n" + sec
	}
	s := md[i+1:]
	end := len(s)
	if n := strings.Index(s, "\n## "); n >= 0 {
		end = n + 1
	}
	// Details: before the section of the first id that comes after this
	// one, else before the benchmarks outside the table of ids and the
	// packages that failed.
	if block == "## Details" {
		for _, h := range []string{"\n### Other benchmarks of the run\n", "\n### Packages that failed"} {
			if n := strings.Index(s[:end], h); n >= 0 && n+1 < end {
				end = n + 1
			}
		}
		if id := idOf(heading + "`"); id != "" {
			off := 0
			for l := range strings.SplitSeq(s[:end], "\n") {
				if other := idOf(l); other != "" && strings.HasPrefix(l, "### ") && rank(other) > rank(id) {
					end = off
					break
				}
				off += len(l) + 1
			}
		}
	}
	return md[:i+1] + strings.TrimRight(s[:end], "\n") + "\n\n" + sec + s[end:]
}
