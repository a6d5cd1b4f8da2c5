package libenv

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
)

// checkOTLPEnv checks the variables the OTLP exporter and the trace SDK read
// from the process environment. They log a bad value and carry on without
// it (an unreadable CA file means the system roots and a TLS failure at
// every export, a header without "=" means no API key, an unknown sampler
// means always-on): here each one stops the start, naming its variable.
// The exporter still does its own reading; this only vets the values.
func checkOTLPEnv(lookup func(string) (string, bool)) error {
	get := func(name string) string {
		v, _ := lookup(name)
		return strings.TrimSpace(v)
	}
	var errs []error
	check := func(name string, f func(string) error) {
		if v := get(name); v != "" {
			if err := f(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
			}
		}
	}
	for _, p := range []string{"OTEL_EXPORTER_OTLP_", "OTEL_EXPORTER_OTLP_TRACES_"} {
		check(p+"ENDPOINT", checkEndpoint)
		check(p+"INSECURE", checkBool)
		check(p+"HEADERS", checkHeaders)
		check(p+"CERTIFICATE", checkCAFile)
		check(p+"TIMEOUT", checkMillis)
		check(p+"COMPRESSION", checkCompression)
		cert, key := get(p+"CLIENT_CERTIFICATE"), get(p+"CLIENT_KEY")
		if cert != "" || key != "" {
			if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
				errs = append(errs, fmt.Errorf("%sCLIENT_CERTIFICATE / %sCLIENT_KEY: %w", p, p, err))
			}
		}
	}
	check("OTEL_TRACES_EXPORTER", func(v string) error {
		if v != "otlp" && v != "none" {
			return errors.New("unsupported exporter (otlp, none)")
		}
		return nil
	})
	sampler := strings.ToLower(get("OTEL_TRACES_SAMPLER"))
	switch sampler {
	case "", "always_on", "always_off", "parentbased_always_on", "parentbased_always_off":
	case "traceidratio", "parentbased_traceidratio":
		check("OTEL_TRACES_SAMPLER_ARG", checkRatio)
	default:
		errs = append(errs, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: unsupported sampler (always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio)", sampler))
	}
	return errors.Join(errs...)
}

// checkEndpoint wants a URL with a scheme. The exporter reads a bare
// "host:port" as a URL of scheme "host" and so as TLS, and ignores an
// unparsable one for localhost:4317: both would send nothing, quietly.
func checkEndpoint(v string) error {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New(`want a URL: "http://host:port" (plain text) or "https://host:port" (TLS)`)
	}
	return nil
}

func checkBool(v string) error {
	if !strings.EqualFold(v, "true") && !strings.EqualFold(v, "false") {
		return errors.New("want true or false")
	}
	return nil
}

// checkHeaders follows the W3C Baggage-like format the exporter parses:
// key=value pairs separated by commas, values URL-encoded.
func checkHeaders(v string) error {
	for _, pair := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" || strings.ContainsFunc(k, func(r rune) bool { return !isTokenChar(r) }) {
			return errors.New(`want comma-separated key=value pairs ("api-key=secret,x-team=a")`)
		}
		if _, err := url.PathUnescape(val); err != nil {
			return fmt.Errorf("header %s: value not URL-encoded: %w", k, err)
		}
	}
	return nil
}

// isTokenChar reports an RFC 7230 token character, what a header name is made of.
func isTokenChar(r rune) bool {
	return r < 127 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r))
}

func checkCAFile(path string) error {
	pem, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return errors.New("no PEM certificate in the file")
	}
	return nil
}

// checkMillis: the specification's timeouts are integer milliseconds.
func checkMillis(v string) error {
	if n, err := strconv.Atoi(v); err != nil || n < 0 {
		return errors.New(`want a non-negative integer of milliseconds ("10000")`)
	}
	return nil
}

func checkCompression(v string) error {
	if v != "gzip" && v != "none" {
		return errors.New("want gzip or none")
	}
	return nil
}

func checkRatio(v string) error {
	if f, err := strconv.ParseFloat(v, 64); err != nil || f < 0 || f > 1 {
		return errors.New("want a ratio between 0 and 1")
	}
	return nil
}
