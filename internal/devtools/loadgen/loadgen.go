// Package loadgen drives the system through its public REST API only: it
// creates work orders (a fixed count, or open-loop at an offered rate for a
// duration), waits until each is invoiced or the wait times out, and measures
// create→invoiced latency from the orders' own timestamps (the server's, so
// polling cadence adds no error). `make demo`, the end-to-end test and
// benchmark B5 all use it.
package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// Config of one run.
type Config struct {
	// BaseURL of the work-order service's REST API. Required.
	BaseURL string
	// Count of orders to create. Used when Rate is 0. Default 100.
	Count int
	// Rate is the offered load in orders per second (open loop: creation does
	// not wait for earlier orders). 0 means closed loop: Count orders as fast
	// as Concurrency allows.
	Rate float64
	// Duration of an open-loop run. Default 10s.
	Duration time.Duration
	// Concurrency bounds in-flight create requests. Default 16.
	Concurrency int
	// MaxPositions per order; each order gets 1..MaxPositions. Default 20.
	MaxPositions int
	// Wait bounds the wait for every order to reach a final state after the
	// last create. Default 2m.
	Wait time.Duration
	// Progress receives a progress bar; nil for none.
	Progress io.Writer
	// HTTP is the client. Default: a client with a 10 s timeout.
	HTTP *http.Client
	// Seed makes order contents reproducible. Default 1.
	Seed uint64
	// CreateRetry bounds how long one order's creation is retried after an
	// answer that promises nothing was decided (HTTP 503 UNAVAILABLE, 409
	// key still in flight) or a failed connection (a replica restarting).
	// Every attempt carries the order's Idempotency-Key, so a retry never
	// creates a second order. Default 0: no retry.
	CreateRetry time.Duration
	// Stop, once closed, ends creation early (an open-loop run whose end
	// the caller decides, such as a chaos run's last fault); the orders
	// created so far are awaited as usual. Default nil: Duration or Count
	// ends it.
	Stop <-chan struct{}
}

// Validate reports unusable settings.
func (c Config) Validate() error {
	if c.BaseURL == "" {
		return errors.New("loadgen: BaseURL is required")
	}
	if c.Rate < 0 || c.Count < 0 || c.Concurrency < 0 || c.MaxPositions < 0 || c.MaxPositions > 100000 || c.CreateRetry < 0 {
		return errors.New("loadgen: negative or out-of-range setting")
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Count == 0 {
		c.Count = 100
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Concurrency == 0 {
		c.Concurrency = 16
	}
	if c.MaxPositions == 0 {
		c.MaxPositions = 20
	}
	if c.Wait == 0 {
		c.Wait = 2 * time.Minute
	}
	if c.HTTP == nil {
		c.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
}

// Result of a run.
type Result struct {
	Created        int            `json:"created"`
	CreateErrors   int            `json:"create_errors"`
	ByStatus       map[string]int `json:"by_status"`
	Invoiced       int            `json:"invoiced"`
	LatencyP50     Millis         `json:"latency_p50_ms"`
	LatencyP95     Millis         `json:"latency_p95_ms"`
	LatencyP99     Millis         `json:"latency_p99_ms"`
	LatencyMax     Millis         `json:"latency_max_ms"`
	OfferedRate    float64        `json:"offered_rate_per_s"`
	AchievedRate   float64        `json:"achieved_create_rate_per_s"`
	InvoicedPerSec float64        `json:"invoiced_per_s"`
	Elapsed        Millis         `json:"elapsed_ms"`
	// NotInvoiced lists orders that did not reach INVOICED (id -> status).
	NotInvoiced map[string]string `json:"not_invoiced,omitempty"`
	// OrderIDs are all created orders, for callers that assert on them.
	OrderIDs []string `json:"-"`
	// Started is when each created order's creation began (client clock):
	// its slot in the offered load, before a full concurrency bound or
	// retries after 503s delayed it. Latency measured from it includes the
	// time the API made the client wait, which the order's history cannot.
	Started map[string]time.Time `json:"-"`
}

// Millis is a duration rendered in milliseconds in JSON.
type Millis time.Duration

// MarshalJSON renders milliseconds with microsecond precision.
func (m Millis) MarshalJSON() ([]byte, error) {
	return []byte(fmt.Sprintf("%.3f", float64(time.Duration(m).Microseconds())/1000)), nil
}

func (m Millis) String() string { return time.Duration(m).Round(time.Millisecond).String() }

// Run executes the load and waits for the outcome.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &client{base: cfg.BaseURL, http: cfg.HTTP}
	start := time.Now()
	ids, started, createErrs := create(ctx, c, cfg)
	createdIn := time.Since(start)
	res := &Result{Created: len(ids), CreateErrors: createErrs, OrderIDs: ids, Started: started, OfferedRate: cfg.Rate}
	if createdIn > 0 {
		res.AchievedRate = float64(len(ids)) / createdIn.Seconds()
	}
	final := waitFinal(ctx, c, cfg, ids)
	res.Elapsed = Millis(time.Since(start))
	res.ByStatus = map[string]int{}
	res.NotInvoiced = map[string]string{}
	var lat []time.Duration
	for id, o := range final {
		res.ByStatus[o.Status]++
		if o.Status == statusInvoiced {
			res.Invoiced++
			lat = append(lat, o.latency)
		} else {
			res.NotInvoiced[id] = o.Status
		}
	}
	slices.Sort(lat)
	res.LatencyP50, res.LatencyP95, res.LatencyP99 = Millis(pct(lat, 50)), Millis(pct(lat, 95)), Millis(pct(lat, 99))
	if len(lat) > 0 {
		res.LatencyMax = Millis(lat[len(lat)-1])
	}
	if e := time.Duration(res.Elapsed); e > 0 {
		res.InvoicedPerSec = float64(res.Invoiced) / e.Seconds()
	}
	return res, nil
}

const (
	statusInvoiced  = "WORK_ORDER_STATUS_INVOICED"
	statusCancelled = "WORK_ORDER_STATUS_CANCELLED"
)

func create(ctx context.Context, c *client, cfg Config) ([]string, map[string]time.Time, int) {
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	var mu sync.Mutex
	var ids []string
	started := map[string]time.Time{}
	var errs atomic.Int64
	sem := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	total := cfg.Count
	var tick <-chan time.Time
	if cfg.Rate > 0 {
		total = int(cfg.Rate * cfg.Duration.Seconds())
		t := time.NewTicker(time.Duration(float64(time.Second) / cfg.Rate))
		defer t.Stop()
		tick = t.C
	}
	bar := newBar(cfg.Progress, "created", total)
loop:
	for i := 0; i < total && ctx.Err() == nil; i++ {
		select {
		case <-cfg.Stop:
			break loop
		default:
		}
		if tick != nil {
			select {
			case <-tick:
			case <-cfg.Stop:
				break loop
			case <-ctx.Done():
				continue
			}
		}
		body := newOrder(rng, cfg.MaxPositions, i)
		key := uuid.NewString() // random, unlike the seeded contents: a key outlives the run
		begun := time.Now()
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			id, err := c.createRetrying(ctx, body, key, cfg.CreateRetry)
			if err != nil {
				errs.Add(1)
				return
			}
			mu.Lock()
			ids = append(ids, id)
			started[id] = begun
			bar.set(len(ids))
			mu.Unlock()
		}()
	}
	wg.Wait()
	bar.done()
	return ids, started, int(errs.Load())
}

type orderState struct {
	Status  string
	latency time.Duration
}

// waitFinal polls until every order is INVOICED or CANCELLED, or until
// cfg.Wait passes without reaching that.
func waitFinal(ctx context.Context, c *client, cfg Config, ids []string) map[string]orderState {
	final := make(map[string]orderState, len(ids))
	pending := slices.Clone(ids)
	deadline := time.Now().Add(cfg.Wait)
	bar := newBar(cfg.Progress, "invoiced", len(ids))
	for len(pending) > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		var next []string
		var mu sync.Mutex
		sem := make(chan struct{}, cfg.Concurrency)
		var wg sync.WaitGroup
		for _, id := range pending {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				st, lat, err := c.state(ctx, id)
				mu.Lock()
				defer mu.Unlock()
				if err == nil && (st == statusInvoiced || st == statusCancelled) {
					final[id] = orderState{Status: st, latency: lat}
					return
				}
				next = append(next, id)
			}()
		}
		wg.Wait()
		pending = next
		bar.set(len(final))
		if len(pending) > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	bar.done()
	for _, id := range pending {
		st, _, err := c.state(context.WithoutCancel(ctx), id)
		if err != nil {
			st = "UNKNOWN (" + err.Error() + ")"
		}
		final[id] = orderState{Status: st}
	}
	return final
}

func newOrder(rng *rand.Rand, maxPositions, i int) []byte {
	order := map[string]any{
		"customer_id": fmt.Sprintf("customer-%03d", rng.IntN(500)),
		"description": fmt.Sprintf("load order %d", i),
		"positions":   1 + rng.IntN(maxPositions),
		"unit_price":  map[string]any{"currency_code": "EUR", "minor_units": 100 + rng.IntN(10000)},
	}
	b, _ := json.Marshal(order)
	return b
}

func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	if i < 1 {
		i = 1
	}
	return sorted[i-1]
}

type client struct {
	base string
	http *http.Client
}

// createRetrying creates one order, retrying for up to budget while the
// answer says nothing was decided yet.
func (c *client) createRetrying(ctx context.Context, body []byte, key string, budget time.Duration) (string, error) {
	deadline := time.Now().Add(budget)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		id, err := c.create(ctx, body, key)
		var st *statusError
		retryable := err != nil && (!errors.As(err, &st) || st.code == http.StatusServiceUnavailable || st.code == http.StatusConflict)
		if !retryable || time.Now().Add(wait).After(deadline) {
			return id, err
		}
		select {
		case <-ctx.Done():
			return "", err
		case <-time.After(wait):
		}
	}
}

func (c *client) create(ctx context.Context, body []byte, key string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/work-orders", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	var out struct {
		WorkOrder struct {
			ID string `json:"id"`
		} `json:"workOrder"`
	}
	if err := c.do(req, &out); err != nil {
		return "", err
	}
	if out.WorkOrder.ID == "" {
		return "", errors.New("create: response without an id")
	}
	return out.WorkOrder.ID, nil
}

// state returns the order's status and, once INVOICED, its create→invoiced
// latency: update_time − create_time, both the server's, written in the
// transactions of the create and of the INVOICED transition (INVOICED is
// final: nothing updates the order after it). One read of the order per
// poll: the history would cost the service a second query per poll for the
// same two timestamps.
func (c *client) state(ctx context.Context, id string) (string, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/work-orders/"+id, nil)
	if err != nil {
		return "", 0, err
	}
	var out struct {
		WorkOrder struct {
			Status     string    `json:"status"`
			CreateTime time.Time `json:"createTime"`
			UpdateTime time.Time `json:"updateTime"`
		} `json:"workOrder"`
	}
	if err := c.do(req, &out); err != nil {
		return "", 0, err
	}
	o := out.WorkOrder
	if o.Status == "" {
		return "", 0, errors.New("order without a status")
	}
	if o.Status == statusInvoiced {
		return o.Status, o.UpdateTime.Sub(o.CreateTime), nil
	}
	return o.Status, 0, nil
}

func (c *client) do(req *http.Request, out any) error {
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return &statusError{code: resp.StatusCode, msg: fmt.Sprintf("%s %s: HTTP %d: %s", req.Method, req.URL.Path, resp.StatusCode, bytes.TrimSpace(b))}
	}
	return json.Unmarshal(b, out)
}

// statusError is an HTTP answer other than 200.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string { return e.msg }

// bar is a one-line text progress bar.
type bar struct {
	w     io.Writer
	label string
	total int
	last  int
}

func newBar(w io.Writer, label string, total int) *bar {
	return &bar{w: w, label: label, total: total, last: -1}
}

func (b *bar) set(n int) {
	if b.w == nil || b.total == 0 || n == b.last {
		return
	}
	b.last = n
	const width = 40
	filled := n * width / b.total
	fmt.Fprintf(b.w, "\r%-9s [%s%s] %d/%d", b.label, bytes.Repeat([]byte("#"), filled), bytes.Repeat([]byte("."), width-filled), n, b.total)
}

func (b *bar) done() {
	if b.w != nil && b.total > 0 {
		fmt.Fprintln(b.w)
	}
}
