package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Time        time.Time
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string // of build-output events
	FailedBuild string // of a package's fail event: the ImportPath whose build failed
}

// Run is what one or more `go test -json` streams say about the benchmarks.
type Run struct {
	Start time.Time // the first event's time
	// Env holds the per-package header lines (goos, goarch, cpu) and what the
	// benchmarks' logs state about the environment (go, GOMAXPROCS, fsync,
	// PostgreSQL), first seen wins.
	Env map[string]string
	// Benchmarks by package path and top-level function, in order of
	// appearance.
	Benchmarks []*BenchRun
	// Failed packages that ran no benchmark (a build failure, a panic in
	// TestMain), with the tail of their output.
	Failed map[string][]string
	byKey  map[string]*BenchRun
}

// BenchRun is one top-level benchmark function of one package.
type BenchRun struct {
	Package, Func string
	// Status is pass (a result line), fail or skip; "" when it started but
	// never ended (the test binary timed out or crashed).
	Status  string
	Results []Result
	// Log are the benchmark's and its sub-benchmarks' output lines other
	// than framework lines and result lines (b.Logf, failures, skips).
	Log []string
}

// Result is one benchmark result line.
type Result struct {
	Name    string // the full name without the -GOMAXPROCS suffix, e.g. BenchmarkR1_Recovery/publishThenCrash=0
	Procs   int
	N       int
	Metrics []Metric
}

// Metric is one value unit pair of a result line.
type Metric struct {
	Value float64
	Unit  string
}

// Sub is the sub-benchmark part of the result's name ("" for a top-level
// result).
func (r Result) Sub() string {
	_, sub, _ := strings.Cut(r.Name, "/")
	return sub
}

// resultLine matches a benchmark result line: name, optional -GOMAXPROCS,
// iterations, then value unit pairs.
var resultLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-(\d+))?\s+(\d+)\s+(\S.*)$`)

// envInLog picks environment facts out of benchmark logs.
var envInLog = []struct {
	key string
	re  *regexp.Regexp
}{
	{"go", regexp.MustCompile(`\bgo=(go\S+)`)},
	{"GOMAXPROCS", regexp.MustCompile(`\bGOMAXPROCS=(\d+)`)},
	{"fsync", regexp.MustCompile(`\bfsync=(on|off)\b`)},
	{"PostgreSQL", regexp.MustCompile(`\bPostgreSQL (\d+(?:\.\d+)*)`)},
	// internal/testkit/benchkit's PinServer and B2's queue tables' storage
	// parameters: the conditions of the benchmarks that drain for minutes.
	{"server settings", regexp.MustCompile(`server settings (pinned: .*)$`)},
	{"B2 tables", regexp.MustCompile(`B2 queue tables: (.*)$`)},
}

// Parse reads `go test -json` streams into r (call it once per stream).
func (r *Run) Parse(in io.Reader) error {
	if r.Env == nil {
		r.Env, r.Failed, r.byKey = map[string]string{}, map[string][]string{}, map[string]*BenchRun{}
	}
	partial := map[string]string{} // package+test -> an unterminated output line
	pkgOut := map[string][]string{}
	buildOut := map[string][]string{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// go test prints build errors of packages that never ran as
			// plain text ahead of the JSON; they are not events.
			continue
		}
		if r.Start.IsZero() && !e.Time.IsZero() {
			r.Start = e.Time
		}
		top, _, _ := strings.Cut(e.Test, "/")
		switch e.Action {
		case "build-output":
			buildOut[e.ImportPath] = append(buildOut[e.ImportPath], strings.TrimRight(e.Output, "\n"))
		case "output":
			k := e.Package + "\x00" + e.Test
			text := partial[k] + e.Output
			lines := strings.Split(text, "\n")
			partial[k] = lines[len(lines)-1]
			for _, l := range lines[:len(lines)-1] {
				if strings.HasPrefix(top, "Benchmark") {
					r.benchLine(r.bench(e.Package, top), l)
				} else if e.Test == "" {
					r.packageLine(e.Package, l)
					pkgOut[e.Package] = append(pkgOut[e.Package], l)
				}
			}
		case "pass", "fail", "skip":
			if e.Test == top && strings.HasPrefix(top, "Benchmark") {
				r.bench(e.Package, top).Status = e.Action
			}
			if e.Test == "" && e.Action == "fail" && !r.ranBenchmark(e.Package) {
				r.Failed[e.Package] = append(tail(buildOut[e.FailedBuild], 12), tail(pkgOut[e.Package], 8)...)
			}
		}
	}
	return sc.Err()
}

func (r *Run) ranBenchmark(pkg string) bool {
	for _, b := range r.Benchmarks {
		if b.Package == pkg {
			return true
		}
	}
	return false
}

func (r *Run) bench(pkg, fn string) *BenchRun {
	k := pkg + "\x00" + fn
	if b, ok := r.byKey[k]; ok {
		return b
	}
	b := &BenchRun{Package: pkg, Func: fn}
	r.byKey[k] = b
	r.Benchmarks = append(r.Benchmarks, b)
	return b
}

func (r *Run) packageLine(pkg, l string) {
	for _, key := range []string{"goos", "goarch", "cpu"} {
		if v, ok := strings.CutPrefix(l, key+": "); ok {
			r.setEnv(key, strings.TrimSpace(v))
		}
	}
}

func (r *Run) setEnv(key, v string) {
	if _, ok := r.Env[key]; !ok && v != "" {
		r.Env[key] = v
	}
}

func (r *Run) benchLine(b *BenchRun, l string) {
	trimmed := strings.TrimSpace(l)
	switch {
	case trimmed == "", strings.HasPrefix(trimmed, "=== "), strings.HasPrefix(trimmed, "Benchmark") && !strings.ContainsAny(trimmed, " \t"):
		return // framework lines: === RUN, the bare name printed before a run
	}
	if m := resultLine.FindStringSubmatch(l); m != nil {
		if res, ok := parseResult(m); ok {
			b.Results = append(b.Results, res)
			if b.Status == "" {
				b.Status = "pass" // test2json reports no pass event for a benchmark, only its result line
			}
			if res.Procs > 0 {
				r.setEnv("GOMAXPROCS", strconv.Itoa(res.Procs))
			}
			return
		}
	}
	for _, x := range envInLog {
		if m := x.re.FindStringSubmatch(l); m != nil {
			r.setEnv(x.key, m[1])
		}
	}
	b.Log = append(b.Log, l)
}

func parseResult(m []string) (Result, bool) {
	res := Result{Name: m[1]}
	if m[2] != "" {
		res.Procs, _ = strconv.Atoi(m[2])
	}
	res.N, _ = strconv.Atoi(m[3])
	f := strings.Fields(m[4])
	if len(f)%2 != 0 {
		return Result{}, false
	}
	for i := 0; i < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return Result{}, false
		}
		res.Metrics = append(res.Metrics, Metric{Value: v, Unit: f[i+1]})
	}
	return res, true
}

// Find returns the run of a benchmark function in a package given relative
// to the module ("bench/outbox"), or nil.
func (r *Run) Find(pkg, fn string) *BenchRun {
	for _, b := range r.Benchmarks {
		if b.Func == fn && (b.Package == pkg || strings.HasSuffix(b.Package, "/"+pkg)) {
			return b
		}
	}
	return nil
}

// FailedPackage returns the failure output of a package given relative to
// the module, if it failed without running a benchmark.
func (r *Run) FailedPackage(pkg string) ([]string, bool) {
	for p, out := range r.Failed {
		if p == pkg || strings.HasSuffix(p, "/"+pkg) {
			return out, true
		}
	}
	return nil, false
}

func tail(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}

// formatValue renders a metric value with as many digits as its size warrants.
func formatValue(v float64) string {
	a := v
	if a < 0 {
		a = -a
	}
	switch {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
