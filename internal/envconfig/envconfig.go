// Package envconfig reads configuration from environment variables and fails
// with an error that names the variable, so a misconfigured service stops at
// start-up instead of misbehaving later. Each service declares its own config
// struct (documented fields, defaults, Validate) and fills it with a Reader.
package envconfig

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Reader collects values and errors; check Err once after reading all fields.
type Reader struct {
	lookup func(string) (string, bool)
	errs   []error
}

// New reads from the process environment.
func New() *Reader { return &Reader{lookup: os.LookupEnv} }

// FromMap reads from m, for tests.
func FromMap(m map[string]string) *Reader {
	return &Reader{lookup: func(k string) (string, bool) { v, ok := m[k]; return v, ok }}
}

// Err returns every problem found, each naming its variable.
func (r *Reader) Err() error { return errors.Join(r.errs...) }

// Lookup returns a variable as the environment holds it, for checks that
// read a family of variables (the OpenTelemetry SDK's OTEL_*) themselves.
func (r *Reader) Lookup(name string) (string, bool) { return r.lookup(name) }

// Record adds a problem found by such a check; Err reports it.
func (r *Reader) Record(err error) { r.errs = append(r.errs, err) }

func (r *Reader) fail(name, val string, err error) {
	r.errs = append(r.errs, fmt.Errorf("%s=%q: %w", name, val, err))
}

// String returns the variable's value, or def when unset or empty.
func (r *Reader) String(name, def string) string {
	if v, ok := r.lookup(name); ok && strings.TrimSpace(v) != "" {
		return strings.TrimSpace(v)
	}
	return def
}

// Required returns the variable's value and records an error when it is unset.
func (r *Reader) Required(name string) string {
	v := r.String(name, "")
	if v == "" {
		r.errs = append(r.errs, fmt.Errorf("%s: required but not set", name))
	}
	return v
}

// Int returns the variable as an integer, or def.
func (r *Reader) Int(name string, def int) int {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		r.fail(name, v, errors.New("not an integer"))
		return def
	}
	return n
}

// Float returns the variable as a float, or def.
func (r *Reader) Float(name string, def float64) float64 {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		r.fail(name, v, errors.New("not a number"))
		return def
	}
	return f
}

// Duration returns the variable as a Go duration ("250ms", "5s"), or def.
func (r *Reader) Duration(name string, def time.Duration) time.Duration {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		r.fail(name, v, errors.New(`not a duration (examples: "500ms", "5s", "2m")`))
		return def
	}
	return d
}

// Bool returns the variable as a boolean, or def.
func (r *Reader) Bool(name string, def bool) bool {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.fail(name, v, errors.New("not a boolean (true/false)"))
		return def
	}
	return b
}

// Check records err against name when err is not nil; Validate methods use it
// to keep the variable's name in the message.
func Check(name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", name, err)
}
