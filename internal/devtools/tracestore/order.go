package tracestore

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Order is the answer of GET /v1/orders/{id}: the order's spans in tree order.
type Order struct {
	OrderID string    `json:"order_id"`
	Stored  int       `json:"stored"`
	Traces  int       `json:"traces"`
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	Spans   []Span    `json:"spans"`
}

// attrEventID is the link attribute naming the message or inbox record a
// batch span handled (pkg/pubsub, pkg/inbox).
const attrEventID = "event_id"

// attrOutboxEventID is the outbox dispatch span's event id (outbox.TraceDispatchers).
const attrOutboxEventID = "outbox.event_id"

// Order returns the spans of order id (see the package doc for which).
func (s *Store) Order(id string) Order {
	all := s.snapshot()
	out := Order{OrderID: id, Stored: len(all), Spans: []Span{}}
	if id == "" {
		return out
	}
	byKey := make(map[string]int, len(all))
	children := map[string][]int{}
	type inbound struct {
		from int
		link Link
	}
	linkedFrom := map[string][]inbound{}
	for i, sp := range all {
		byKey[sp.Key()] = i
	}
	for i, sp := range all {
		if sp.ParentSpanID != "" {
			children[sp.TraceID+"/"+sp.ParentSpanID] = append(children[sp.TraceID+"/"+sp.ParentSpanID], i)
		}
		for _, l := range sp.Links {
			linkedFrom[l.key()] = append(linkedFrom[l.key()], inbound{i, l})
		}
	}
	parentOf := func(i int) (int, bool) {
		if all[i].ParentSpanID == "" {
			return 0, false
		}
		p, ok := byKey[all[i].TraceID+"/"+all[i].ParentSpanID]
		return p, ok
	}

	seed := map[int]bool{}
	events := map[string]bool{}
	for i, sp := range all {
		for _, v := range sp.Attributes {
			if v == id {
				seed[i] = true
				if e := sp.Attributes[attrOutboxEventID]; e != "" {
					events[e] = true
				}
				break
			}
		}
	}
	// owned: a seed or a span under one, so everything linking to it
	// handled this order's record.
	owned := func(i int) bool {
		for n := 0; n < 100; n++ {
			if seed[i] {
				return true
			}
			p, ok := parentOf(i)
			if !ok {
				return false
			}
			i = p
		}
		return false
	}
	chain := map[int]bool{}
	for i := range seed {
		chain[i] = true
	}
	// Shown: the chain and everything under it.
	var shown map[int]bool
	var under func(i int)
	under = func(i int) {
		if shown[i] {
			return
		}
		shown[i] = true
		for _, c := range children[all[i].Key()] {
			under(c)
		}
	}
	// Grow to a fixed point: a link accepted late (its event id learned
	// from another hop) can admit spans an earlier pass refused. Records
	// are often written by a child of a chain span (an INSERT under a
	// batch), so inbound links are looked for on every shown span; the
	// backward steps (parent, single link) only from the chain itself.
	for changed := true; changed; {
		changed = false
		add := func(i int) {
			if !chain[i] {
				chain[i], changed = true, true
			}
		}
		shown = map[int]bool{}
		for i := range chain {
			under(i)
		}
		for i := range chain {
			if p, ok := parentOf(i); ok {
				add(p)
			}
			if ls := all[i].Links; len(ls) == 1 {
				if t, ok := byKey[ls[0].key()]; ok {
					add(t)
				}
				if e := ls[0].Attributes[attrEventID]; e != "" && !events[e] {
					events[e], changed = true, true
				}
			}
		}
		for i := range shown {
			for _, in := range linkedFrom[all[i].Key()] {
				if chain[in.from] {
					continue
				}
				e := in.link.Attributes[attrEventID]
				if owned(i) || (e != "" && events[e]) {
					add(in.from)
					if e != "" {
						events[e] = true
					}
				}
			}
		}
	}
	shown = map[int]bool{}
	for i := range chain {
		under(i)
	}

	// The tree: a span hangs under its parent, else under the first span it
	// links to that is shown (an asynchronous hop), else it is a root.
	kids := map[int][]int{}
	var roots []int
	via := map[int]string{}
	for i := range shown {
		if p, ok := parentOf(i); ok && shown[p] {
			kids[p] = append(kids[p], i)
			via[i] = "child"
			continue
		}
		linked := false
		for _, l := range all[i].Links {
			if t, ok := byKey[l.key()]; ok && shown[t] && t != i {
				kids[t] = append(kids[t], i)
				via[i], linked = "link", true
				break
			}
		}
		if !linked {
			roots = append(roots, i)
		}
	}
	byStart := func(a, b int) int {
		if c := all[a].Start.Compare(all[b].Start); c != 0 {
			return c
		}
		return strings.Compare(all[a].Key(), all[b].Key())
	}
	traces := map[string]bool{}
	visited := map[int]bool{}
	var walk func(i, depth int, parent string)
	walk = func(i, depth int, parent string) {
		if visited[i] {
			return
		}
		visited[i] = true
		sp := all[i]
		sp.Depth, sp.TreeParent, sp.Via = depth, parent, via[i]
		out.Spans = append(out.Spans, sp)
		traces[sp.TraceID] = true
		if out.Start.IsZero() || sp.Start.Before(out.Start) {
			out.Start = sp.Start
		}
		if sp.End.After(out.End) {
			out.End = sp.End
		}
		k := kids[i]
		slices.SortFunc(k, byStart)
		for _, c := range k {
			walk(c, depth+1, sp.Key())
		}
	}
	slices.SortFunc(roots, byStart)
	for _, r := range roots {
		walk(r, 0, "")
	}
	// Spans only reachable through a cycle of links (corrupt input) are
	// roots of their own rather than lost.
	var rest []int
	for i := range shown {
		if !visited[i] {
			rest = append(rest, i)
		}
	}
	slices.SortFunc(rest, byStart)
	for _, r := range rest {
		via[r] = ""
		walk(r, 0, "")
	}
	out.Traces = len(traces)
	return out
}

// Handler serves GET /v1/orders/{id}.
func (s *Store) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Order(r.PathValue("id")))
	})
	return mux
}

// Fetch asks the HTTP API at baseURL for the spans of order id.
func Fetch(ctx context.Context, baseURL, id string) (Order, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(baseURL, "/")+"/v1/orders/"+url.PathEscape(id), nil)
	if err != nil {
		return Order{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Order{}, fmt.Errorf("trace store at %s: %w", baseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return Order{}, fmt.Errorf("trace store at %s: %s: %s", baseURL, resp.Status, b)
	}
	var o Order
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil {
		return Order{}, fmt.Errorf("trace store at %s: %w", baseURL, err)
	}
	return o, nil
}

// WriteTree prints o as an indented tree: per span its start relative to the
// order's first span, its duration, service and name; "↳" marks an
// asynchronous hop (a span linked to the one above it, in another trace).
// Unless queries, database client spans (otelpgx: a db.system.name
// attribute) are left out and counted on the span above them.
func WriteTree(w io.Writer, o Order, queries bool) error {
	if len(o.Spans) == 0 {
		_, err := fmt.Fprintf(w, "no spans for order %s among the %d stored (spans reach the store within a second; unknown id, or older than the store keeps?)\n", o.OrderID, o.Stored)
		return err
	}
	byKey := make(map[string]Span, len(o.Spans))
	for _, sp := range o.Spans {
		byKey[sp.Key()] = sp
	}
	hidden := func(sp Span) bool { return !queries && isQuery(sp) }
	// shownAbove is the nearest ancestor in the tree that is printed.
	shownAbove := func(sp Span) (Span, bool) {
		for n := 0; n < len(o.Spans); n++ {
			p, ok := byKey[sp.TreeParent]
			if !ok {
				return Span{}, false
			}
			if !hidden(p) {
				return p, true
			}
			sp = p
		}
		return Span{}, false
	}
	counted := map[string]int{}
	for _, sp := range o.Spans {
		if hidden(sp) {
			if p, ok := shownAbove(sp); ok {
				counted[p.Key()]++
			}
		}
	}
	if _, err := fmt.Fprintf(w, "order %s: %d spans in %d traces, %v from the first start to the last end\n\n%10s %10s  %-14s %s\n",
		o.OrderID, len(o.Spans), o.Traces, o.End.Sub(o.Start).Round(time.Millisecond), "START", "DURATION", "SERVICE", "SPAN"); err != nil {
		return err
	}
	depth := map[string]int{}
	for _, sp := range o.Spans {
		if hidden(sp) {
			continue
		}
		d := 0
		if p, ok := shownAbove(sp); ok {
			d = depth[p.Key()] + 1
		}
		depth[sp.Key()] = d
		mark := ""
		if sp.Via == "link" {
			mark = "↳ "
		}
		line := fmt.Sprintf("%10s %10s  %-14s %s%s%s", "+"+fmtDur(sp.Start.Sub(o.Start)), fmtDur(sp.End.Sub(sp.Start)), sp.Service,
			strings.Repeat("  ", d), mark, sp.Name)
		if n := counted[sp.Key()]; n > 0 {
			line += fmt.Sprintf("  (%d db spans)", n)
		}
		if sp.Status == "ERROR" {
			line += "  ERROR " + sp.StatusMessage
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

// isQuery reports a database client span.
func isQuery(sp Span) bool {
	_, ok := sp.Attributes["db.system.name"]
	if !ok {
		_, ok = sp.Attributes["db.system"]
	}
	return ok
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.3fs", d.Seconds())
	default:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
}
