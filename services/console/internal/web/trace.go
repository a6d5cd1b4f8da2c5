package web

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"
)

// traceOrder is the part of the trace store's answer to
// GET /v1/orders/{id} the waterfall uses (internal/devtools/tracestore documents the
// whole). The console reads it over HTTP, as it reads /metrics: it does not
// link the store, which only `make run` has.
type traceOrder struct {
	Stored int         `json:"stored"`
	Traces int         `json:"traces"`
	Start  time.Time   `json:"start"`
	End    time.Time   `json:"end"`
	Spans  []traceSpan `json:"spans"`
}

type traceSpan struct {
	TraceID       string            `json:"trace_id"`
	SpanID        string            `json:"span_id"`
	Service       string            `json:"service"`
	Name          string            `json:"name"`
	Start         time.Time         `json:"start"`
	End           time.Time         `json:"end"`
	Status        string            `json:"status"`
	StatusMessage string            `json:"status_message"`
	Attributes    map[string]string `json:"attributes"`
	// The store's tree: spans come depth-first, siblings by start; a span
	// hangs under TreeParent ("<trace_id>/<span_id>") through its parent
	// span ("child") or, for an asynchronous hop, a link ("link").
	TreeParent string `json:"tree_parent"`
	Via        string `json:"via"`
}

func (s traceSpan) key() string { return s.TraceID + "/" + s.SpanID }

// query reports a database client span (otelpgx), folded into a count on
// the span above it as `make trace` does.
func (s traceSpan) query() bool {
	_, ok := s.Attributes["db.system.name"]
	if !ok {
		_, ok = s.Attributes["db.system"]
	}
	return ok
}

// barScale is the bars' coordinate range: the SVG's viewBox width. The
// Content-Security-Policy refuses inline style, so a bar is placed by SVG
// attributes rather than a computed CSS width.
const barScale = 1000

// maxIndent is the deepest indentation class (templates: .d0 … .d12);
// deeper spans stay at it, their depth still in the text.
const maxIndent = 12

// waterfallRow is one shown span.
type waterfallRow struct {
	Service, Name, Offset, Duration string
	Depth, Indent                   int
	Link, Failed                    bool
	Error                           string
	Queries                         int
	// BarX and BarWidth place the bar in 0…barScale.
	BarX, BarWidth int
}

// traceView is the trace section of an order's page.
type traceView struct {
	// Off: no trace store configured; the page says where to look instead.
	Off       bool
	Error     string
	Stored    int
	Spans     int // every span of the order, queries included
	Traces    int
	Queries   int
	Total     string
	Rows      []waterfallRow
	BarsScale int
}

// trace reads order id's spans from the trace store; a failure is the
// section's error, never the page's.
func (h *Handler) trace(ctx context.Context, id string) traceView {
	if h.cfg.TraceURL == "" {
		return traceView{Off: true}
	}
	if _, err := uuid.Parse(id); err != nil {
		return traceView{} // the page shows no order
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.RPCTimeout)
	defer cancel()
	o, err := fetchTrace(ctx, h.cfg.TraceURL, id)
	if err != nil {
		return traceView{Error: "trace store: " + err.Error()}
	}
	return waterfall(o)
}

func fetchTrace(ctx context.Context, base, id string) (traceOrder, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/v1/orders/"+url.PathEscape(id), nil)
	if err != nil {
		return traceOrder{}, err
	}
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		return traceOrder{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return traceOrder{}, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var o traceOrder
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil {
		return traceOrder{}, fmt.Errorf("unreadable answer: %w", err)
	}
	return o, nil
}

// waterfall turns the store's tree into rows: database spans left out and
// counted on the nearest shown span above them, depths recomputed over the
// shown spans only, bars relative to the order's first start.
func waterfall(o traceOrder) traceView {
	v := traceView{Stored: o.Stored, Spans: len(o.Spans), Traces: o.Traces, BarsScale: barScale,
		Total: spanDuration(o.End.Sub(o.Start))}
	byKey := make(map[string]traceSpan, len(o.Spans))
	for _, sp := range o.Spans {
		byKey[sp.key()] = sp
	}
	// shownAbove bounds its walk by the span count: a corrupt answer with a
	// cycle of tree parents ends instead of spinning.
	shownAbove := func(sp traceSpan) (string, bool) {
		for range o.Spans {
			p, ok := byKey[sp.TreeParent]
			if !ok {
				return "", false
			}
			if !p.query() {
				return p.key(), true
			}
			sp = p
		}
		return "", false
	}
	total := o.End.Sub(o.Start)
	rowOf := map[string]int{} // shown span -> index in v.Rows
	for _, sp := range o.Spans {
		above, hasAbove := shownAbove(sp)
		if sp.query() {
			v.Queries++
			if i, ok := rowOf[above]; hasAbove && ok {
				v.Rows[i].Queries++
			}
			continue
		}
		r := waterfallRow{Service: sp.Service, Name: sp.Name, Link: sp.Via == "link",
			Offset: "+" + spanDuration(sp.Start.Sub(o.Start)), Duration: spanDuration(sp.End.Sub(sp.Start))}
		if i, ok := rowOf[above]; hasAbove && ok {
			r.Depth = v.Rows[i].Depth + 1
		}
		r.Indent = min(r.Depth, maxIndent)
		if sp.Status == "ERROR" {
			r.Failed, r.Error = true, sp.StatusMessage
		}
		r.BarX, r.BarWidth = bar(sp.Start.Sub(o.Start), sp.End.Sub(sp.Start), total)
		rowOf[sp.key()] = len(v.Rows)
		v.Rows = append(v.Rows, r)
	}
	return v
}

// bar places a span of duration d starting at offset off in 0…barScale of
// total; at least 2 wide so that a span of microseconds still shows.
func bar(off, d, total time.Duration) (x, width int) {
	if total <= 0 {
		return 0, barScale
	}
	x = int(int64(off) * barScale / int64(total))
	width = int(int64(d) * barScale / int64(total))
	x = min(max(x, 0), barScale-2)
	width = min(max(width, 2), barScale-x)
	return x, width
}

// spanDuration is "12.3ms" or "1.204s", as `make trace` prints it.
func spanDuration(d time.Duration) string {
	if d >= time.Second {
		return fmt.Sprintf("%.3fs", d.Seconds())
	}
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}
