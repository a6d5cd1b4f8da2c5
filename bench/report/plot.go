package main

import (
	"cmp"
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// series is a CSV file of a benchmark (docs/performance.md: a header row,
// one sample per row), its columns classified.
type series struct {
	header  []string
	rows    [][]string
	numeric []bool // every value of the column parses as a number
}

func readSeries(name string) (*series, error) {
	recs, err := readCSV(name)
	if err != nil {
		return nil, err
	}
	if len(recs) < 2 {
		return nil, errors.New("no samples")
	}
	s := &series{header: recs[0], rows: recs[1:], numeric: make([]bool, len(recs[0]))}
	for c, h := range s.header {
		if h == "round" && slices.Contains(s.header, "t_s") {
			continue // a time series per repetition: its number names a line, it is not a value
		}
		s.numeric[c] = true
		for _, r := range s.rows {
			if _, err := strconv.ParseFloat(r[c], 64); err != nil {
				s.numeric[c] = false
				break
			}
		}
	}
	return s, nil
}

func (s *series) col(name string) int { return slices.Index(s.header, name) }

// group lists the categorical columns other than "phase" (hop, service;
// round, side): the lines of a plot are drawn one per combination of their
// values.
func (s *series) group() []int {
	var out []int
	for c, h := range s.header {
		if !s.numeric[c] && h != "phase" {
			out = append(out, c)
		}
	}
	return out
}

// groupKey is row r's combination of the group's values.
func groupKey(r []string, g []int) string {
	vals := make([]string, len(g))
	for i, c := range g {
		vals[i] = r[c]
	}
	return strings.Join(vals, " ")
}

// xAxis is a column a series is drawn against, rather than a value of it.
type xAxis struct {
	col, label, against string
}

// xAxes are the x columns plotSeries knows, the first present wins: time,
// or the round-trip time B7 adds.
var xAxes = []xAxis{
	{"t_s", "t (s)", "over time"},
	{"rtt_ms", "added round-trip time (ms)", "against the added round-trip time"},
}

// xOf is the x column of s and its index, -1 when it has none.
func xOf(s *series) (xAxis, int) {
	for _, a := range xAxes {
		if c := s.col(a.col); c >= 0 && s.numeric[c] {
			return a, c
		}
	}
	return xAxis{}, -1
}

// plotSeries draws a CSV as a PNG: with an x column (xAxes: t_s, rtt_ms),
// each numeric column against it, one line per group (rate over time, RSS
// over time, latency against the added round trip); without one, the
// distribution (CDF) of each numeric column per group (latency per hop). It
// returns a caption.
func plotSeries(csvPath, pngPath string) (string, error) {
	s, err := readSeries(csvPath)
	if err != nil {
		return "", err
	}
	g := s.group()
	axis, t := xOf(s)
	single := len(valueColumns(s, t)) == 1
	key := func(r []string, col int) string {
		switch {
		case len(g) == 0:
			return s.header[col]
		case single:
			return groupKey(r, g)
		}
		return groupKey(r, g) + " " + s.header[col]
	}
	p := plot.New()
	p.Title.Text = strings.TrimSuffix(filepath.Base(csvPath), ".csv")
	// Bottom right: series start at zero and rarely run along it, and the
	// phase names take the top.
	p.Legend.YOffs = vg.Points(10)
	var lines []any
	var caption string
	if t >= 0 {
		byKey := map[string]plotter.XYs{}
		var order []string
		for _, r := range s.rows {
			x, _ := strconv.ParseFloat(r[t], 64)
			for c := range s.header {
				if c == t || !s.numeric[c] {
					continue
				}
				y, _ := strconv.ParseFloat(r[c], 64)
				k := key(r, c)
				if _, ok := byKey[k]; !ok {
					order = append(order, k)
				}
				byKey[k] = append(byKey[k], plotter.XY{X: x, Y: y})
			}
		}
		for _, k := range order {
			// A series over a setting (rtt_ms) may list it in any order.
			slices.SortStableFunc(byKey[k], func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
			lines = append(lines, k, thin(byKey[k], 2000))
		}
		p.X.Label.Text = axis.label
		p.Y.Label.Text = strings.Join(valueColumns(s, t), ", ")
		caption = fmt.Sprintf("%s %s, one line per %s.", p.Y.Label.Text, axis.against, groupName(s, g))
		// From zero, with headroom for the legend: the level matters, not
		// only the shape.
		highest := 0.0
		for _, xy := range byKey {
			for _, pt := range xy {
				highest = max(highest, pt.Y)
			}
		}
		p.Y.Min, p.Y.Max = 0, 1.3*highest
		if ph := s.col("phase"); ph >= 0 {
			spans := phases(s, t, ph)
			caption += " Phases (s): " + spanText(spans) + "."
			if err := markPhases(p, spans, 1.3*highest); err != nil {
				return "", err
			}
		}
	} else {
		byKey := map[string][]float64{}
		var order []string
		for _, r := range s.rows {
			for c := range s.header {
				if !s.numeric[c] {
					continue
				}
				v, _ := strconv.ParseFloat(r[c], 64)
				k := key(r, c)
				if _, ok := byKey[k]; !ok {
					order = append(order, k)
				}
				byKey[k] = append(byKey[k], v)
			}
		}
		if len(order) == 0 {
			return "", errors.New("no numeric column to plot")
		}
		lowest := math.Inf(1)
		highest := math.Inf(-1)
		var stats []string
		for _, k := range order {
			vs := byKey[k]
			slices.Sort(vs)
			lowest, highest = min(lowest, vs[0]), max(highest, vs[len(vs)-1])
			lines = append(lines, k, thin(cdf(vs), 2000))
			stats = append(stats, fmt.Sprintf("%s: n %d, p50 %s, p99 %s", k, len(vs), formatValue(quantile(vs, 0.5)), formatValue(quantile(vs, 0.99))))
		}
		if lowest > 0 && highest/lowest > 20 {
			p.X.Scale = plot.LogScale{}
			p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		}
		p.X.Label.Text = strings.Join(valueColumns(s, -1), ", ")
		p.Y.Label.Text = "fraction ≤ x"
		p.Y.Min, p.Y.Max = 0, 1
		caption = fmt.Sprintf("Cumulative distribution per %s. %s.", groupName(s, g), strings.Join(stats, "; "))
	}
	add := plotutil.AddLines
	if t >= 0 && axis.col != "t_s" {
		add = plotutil.AddLinePoints // a few settings, each a measurement
	}
	if err := add(p, lines...); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(pngPath), 0o755); err != nil {
		return "", err
	}
	return caption, p.Save(9*vg.Inch, 4.5*vg.Inch, pngPath)
}

func valueColumns(s *series, skip int) []string {
	var out []string
	for c, h := range s.header {
		if c != skip && s.numeric[c] {
			out = append(out, h)
		}
	}
	return out
}

func groupName(s *series, g []int) string {
	if len(g) == 0 {
		return "column"
	}
	names := make([]string, len(g))
	for i, c := range g {
		names[i] = s.header[c]
	}
	return strings.Join(names, " and ")
}

// phaseSpan is the first and last sample time of one phase.
type phaseSpan struct {
	name     string
	from, to float64
}

// phases lists each phase's span, in order of first appearance.
func phases(s *series, t, ph int) []phaseSpan {
	var out []phaseSpan
	at := map[string]int{}
	for _, r := range s.rows {
		x, _ := strconv.ParseFloat(r[t], 64)
		if i, ok := at[r[ph]]; ok {
			out[i].to = max(out[i].to, x)
			continue
		}
		at[r[ph]] = len(out)
		out = append(out, phaseSpan{r[ph], x, x})
	}
	return out
}

func spanText(spans []phaseSpan) string {
	var out []string
	for _, sp := range spans {
		out = append(out, fmt.Sprintf("%s %.1f–%.1f", sp.name, sp.from, sp.to))
	}
	return strings.Join(out, ", ")
}

// markPhases draws a grey vertical line where each phase begins, named at
// the top.
func markPhases(p *plot.Plot, spans []phaseSpan, top float64) error {
	var names plotter.XYLabels
	for _, sp := range spans {
		l, err := plotter.NewLine(plotter.XYs{{X: sp.from, Y: 0}, {X: sp.from, Y: top}})
		if err != nil {
			return err
		}
		l.Color = color.Gray{Y: 170}
		l.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(l)
		names.XYs = append(names.XYs, plotter.XY{X: sp.from, Y: 0.97 * top})
		names.Labels = append(names.Labels, " "+sp.name)
	}
	labels, err := plotter.NewLabels(names)
	if err != nil {
		return err
	}
	p.Add(labels)
	return nil
}

// cdf of sorted values: (v, fraction of samples ≤ v).
func cdf(sorted []float64) plotter.XYs {
	out := make(plotter.XYs, len(sorted))
	for i, v := range sorted {
		out[i] = plotter.XY{X: v, Y: float64(i+1) / float64(len(sorted))}
	}
	return out
}

func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// thin keeps at most n points, evenly spaced, always the last.
func thin(xy plotter.XYs, n int) plotter.XYs {
	if len(xy) <= n {
		return xy
	}
	out := make(plotter.XYs, 0, n+1)
	step := float64(len(xy)) / float64(n)
	for i := 0.0; int(i) < len(xy); i += step {
		out = append(out, xy[int(i)])
	}
	if out[len(out)-1] != xy[len(xy)-1] {
		out = append(out, xy[len(xy)-1])
	}
	return out
}
