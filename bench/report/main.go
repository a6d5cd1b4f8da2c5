// Command report writes bench/report.md from the `go test -json` output of a
// benchmark run and the series the benchmarks wrote (LOSSLESS_BENCH_DATA):
// the environment, one row per benchmark id of docs/performance.md with its
// anchor, measured ratios, target and whether it was met (a benchmark
// absent from the output is listed as not run), each benchmark's metrics and
// log, a PNG per series file and a markdown table per table file
// (tableFiles). `make bench` runs it.
//
// It is a module of its own so that its plotting dependencies stay out of
// the go.mod a forking team keeps.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

type rawFiles []string

func (r *rawFiles) String() string     { return strings.Join(*r, ",") }
func (r *rawFiles) Set(v string) error { *r = append(*r, v); return nil }

func run(args []string) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	var raw rawFiles
	fs.Var(&raw, "raw", "`go test -json` output of the run (repeatable; a missing file is skipped with a warning)")
	data := fs.String("data", "", "directory of the benchmarks' CSV series (LOSSLESS_BENCH_DATA); empty: no plots")
	out := fs.String("out", "bench/report.md", "report to write")
	plots := fs.String("plots", "", "directory for the PNGs (default: plots/ next to -out)")
	commit := fs.String("commit", "", "commit of the run (default: git rev-parse --short HEAD, -dirty when the tree has changes besides the report, its plots, data and raw files)")
	merge := fs.String("merge", "", "an earlier report: write it with the rows, Details and series of the benchmarks this run ran replaced (Merge), its other plots kept")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(raw) == 0 {
		return errors.New("-raw is required")
	}
	r := &Run{}
	for _, name := range raw {
		f, err := os.Open(name)
		if errors.Is(err, os.ErrNotExist) && len(raw) > 1 {
			fmt.Fprintf(os.Stderr, "report: %s: not found, skipped\n", name)
			continue
		}
		if err != nil {
			return err
		}
		err = r.Parse(f)
		_ = f.Close() // read only
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if *commit == "" {
		*commit = gitCommit()
	}
	if *plots == "" {
		*plots = filepath.Join(filepath.Dir(*out), "plots")
	}
	ps, err := makePlots(*data, *plots, filepath.Dir(*out), *merge == "")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	var buf bytes.Buffer
	meta := Meta{Commit: *commit, GoVersion: runtime.Version()}
	if err := Render(&buf, r, meta, ps, readTables(*data)); err != nil {
		return err
	}
	if *merge != "" {
		earlier, err := os.ReadFile(*merge)
		if err != nil {
			return err
		}
		md, err := Merge(string(earlier), buf.String(), r, meta)
		if err != nil {
			return err
		}
		buf.Reset()
		buf.WriteString(strings.TrimRight(md, "\n") + "\n")
	}
	return os.WriteFile(*out, repoRelative(buf.Bytes(), gitRoot()), 0o644)
}

// repoRelative rewrites the absolute paths under root (the repository's
// directory) that the benchmarks log, such as their profiles' files, as
// paths from the repository root, and root itself as ".": the report is
// committed, and the directory it was written in on one machine is no part
// of it.
func repoRelative(md []byte, root string) []byte {
	root = strings.TrimSuffix(root, "/")
	if root == "" || !strings.HasPrefix(root, "/") {
		return md
	}
	md = bytes.ReplaceAll(md, []byte(root+"/"), nil)
	// The root alone, not a longer name that starts with it (/repo2).
	bare := regexp.MustCompile(regexp.QuoteMeta(root) + `([^A-Za-z0-9_.-]|$)`)
	return bare.ReplaceAll(md, []byte(".$1"))
}

// gitRoot is the top directory of the repository the report is written in;
// "" outside one.
func gitRoot() string {
	top, err := exec.CommandContext(context.Background(), "git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(top))
}

// makePlots draws every CSV of dataDir but the table files into plotDir;
// the PNG paths are relative to reportDir. A CSV that cannot be plotted is
// listed with the reason instead. clean removes plotDir's other PNGs first
// (a full run's report); a merge keeps them.
func makePlots(dataDir, plotDir, reportDir string, clean bool) ([]Plot, error) {
	if dataDir == "" {
		return nil, nil
	}
	csvs, err := filepath.Glob(filepath.Join(dataDir, "*.csv"))
	if err != nil {
		return nil, err
	}
	slices.Sort(csvs)
	// The plot directory is the report's own: last run's images go, so none
	// is left behind from a series this run did not write.
	old, err := filepath.Glob(filepath.Join(plotDir, "*.png"))
	if err != nil {
		return nil, err
	}
	if !clean {
		old = nil
	}
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return nil, err
		}
	}
	var out []Plot
	for _, c := range csvs {
		name := filepath.Base(c)
		if _, ok := tableFiles[name]; ok {
			continue
		}
		png := filepath.Join(plotDir, strings.TrimSuffix(name, ".csv")+".png")
		caption, err := plotSeries(c, png)
		if err != nil {
			out = append(out, Plot{CSV: name, Caption: "Not plotted: " + err.Error()})
			continue
		}
		rel, err := filepath.Rel(reportDir, png)
		if err != nil {
			rel = png
		}
		out = append(out, Plot{CSV: name, PNG: filepath.ToSlash(rel), Caption: caption})
	}
	return out, nil
}

func gitCommit() string {
	ctx := context.Background()
	head, err := exec.CommandContext(ctx, "git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	c := strings.TrimSpace(string(head))
	// The run's own outputs do not make it dirty: a benchmark merged into an
	// existing report rewrites them before this reads the tree.
	if st, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)",
		":(top,exclude)bench/report.md", ":(top,exclude)bench/data", ":(top,exclude)bench/plots", ":(top,exclude)bench/raw*.json").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += "-dirty"
	}
	return c
}
