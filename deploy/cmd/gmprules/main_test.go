package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// Paths from this package's directory (deploy/cmd/gmprules).
const (
	alertsFile     = "../../compose/prometheus/alerts.yml"
	prometheusFile = "../../compose/prometheus/prometheus.yml"
	rulesFile      = "../../k8s/components/managed-prometheus/rules.yaml"
)

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCommittedRulesAreCurrent: the committed Rules file is what the
// generator writes from today's alerts.yml, so GKE alerts on what compose
// alerts on.
func TestCommittedRulesAreCurrent(t *testing.T) {
	t.Parallel()
	want, err := Render(read(t, alertsFile), read(t, prometheusFile))
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, rulesFile); !bytes.Equal(got, want) {
		t.Errorf("%s is stale: run `make k8s-rules` (cd deploy && go run ./cmd/gmprules)", rulesFile)
	}
}

// TestRenderKeepsEveryRuleAndSetsTheInterval: each rule arrives unchanged,
// and a group without an interval gets prometheus.yml's evaluation_interval.
func TestRenderKeepsEveryRuleAndSetsTheInterval(t *testing.T) {
	t.Parallel()
	in := []byte(`groups:
  - name: g
    rules:
      - alert: A
        # why
        expr: up == 0
        for: 1m
        labels: {severity: critical}
        annotations: {summary: "{{ $labels.job }} down"}
  - name: h
    interval: 1m
    rules:
      - record: job:up:sum
        expr: sum by (job) (up)
`)
	out, err := Render(in, []byte("global:\n  evaluation_interval: 20s\n"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Spec       struct {
			Groups []struct {
				Name     string           `yaml:"name"`
				Interval string           `yaml:"interval"`
				Rules    []map[string]any `yaml:"rules"`
			} `yaml:"groups"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(out, &rules); err != nil {
		t.Fatal(err)
	}
	if rules.APIVersion != "monitoring.googleapis.com/v1" || rules.Kind != "Rules" {
		t.Errorf("got %s %s", rules.APIVersion, rules.Kind)
	}
	g := rules.Spec.Groups
	if len(g) != 2 || g[0].Interval != "20s" || g[1].Interval != "1m" {
		t.Fatalf("groups %+v, want intervals 20s (default) and 1m (own)", g)
	}
	if g[0].Rules[0]["alert"] != "A" || g[0].Rules[0]["for"] != "1m" || g[1].Rules[0]["record"] != "job:up:sum" {
		t.Errorf("rules changed: %+v", g)
	}
	if !strings.Contains(string(out), "# why") {
		t.Error("a rule's comment was dropped")
	}
}

// TestRenderRefusesWhatRulesCannotHold: a field the Rules object lacks stops
// the generator rather than vanishing from the alerts.
func TestRenderRefusesWhatRulesCannotHold(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]string{
		"group field": "groups:\n  - name: g\n    limit: 5\n    rules: []\n",
		"rule field":  "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        keep_firing_for: 5m\n",
		"top field":   "groups: []\nnamespace: x\n",
	} {
		if _, err := Render([]byte(in), nil); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
