package deploytest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// panelQuery is one Prometheus query of a dashboard panel.
type panelQuery struct {
	Where string // "file: panel title"
	Expr  string
	DSUID string
}

type dashboardPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	GridPos *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr       string `json:"expr"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"` // collapsed rows
}

type dashboard struct {
	UID    string           `json:"uid"`
	Title  string           `json:"title"`
	Panels []dashboardPanel `json:"panels"`
}

func dashboardFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoPath(t, dashboardsDir), "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no dashboard in %s", dashboardsDir)
	}
	return files
}

func loadDashboard(t testing.TB, file string) dashboard {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return d
}

func walkPanels(ps []dashboardPanel, f func(dashboardPanel)) {
	for _, p := range ps {
		f(p)
		walkPanels(p.Panels, f)
	}
}

func dashboardQueries(t testing.TB) []panelQuery {
	t.Helper()
	var qs []panelQuery
	for _, file := range dashboardFiles(t) {
		walkPanels(loadDashboard(t, file).Panels, func(p dashboardPanel) {
			for _, tg := range p.Targets {
				q := panelQuery{Where: fmt.Sprintf("%s: %q", filepath.Base(file), p.Title), Expr: tg.Expr}
				if tg.Datasource != nil {
					q.DSUID = tg.Datasource.UID
				} else if p.Datasource != nil {
					q.DSUID = p.Datasource.UID
				}
				qs = append(qs, q)
			}
		})
	}
	return qs
}

func provisionedDatasources(t testing.TB) map[string]string {
	t.Helper()
	var cfg struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, datasourcesFile), &cfg); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, ds := range cfg.Datasources {
		out[ds.UID] = ds.Type
	}
	return out
}

// TestDashboardQueries: every panel query parses as PromQL, reads only
// metrics of the contract, and uses a provisioned Prometheus datasource.
func TestDashboardQueries(t *testing.T) {
	t.Parallel()
	contract := metricsContract(t)
	datasources := provisionedDatasources(t)
	qs := dashboardQueries(t)
	if len(qs) == 0 {
		t.Fatal("dashboards have no queries")
	}
	for _, q := range qs {
		if datasources[q.DSUID] != "prometheus" {
			t.Errorf("%s: datasource uid %q is not a provisioned Prometheus datasource", q.Where, q.DSUID)
		}
		expr, err := promqlParser().ParseExpr(grafanaMacros.Replace(q.Expr))
		if err != nil {
			t.Errorf("%s: %q: %v", q.Where, q.Expr, err)
			continue
		}
		for _, name := range metricNames(expr) {
			if _, ok := contractFamily(contract, name); !ok && !prometheusSynthesized[name] {
				t.Errorf("%s reads %s, which is not in %s", q.Where, name, metricsFile)
			}
		}
	}
}

// TestDashboardLayout: unique uid and panel ids, every panel placed, and the
// four views the dashboard exists for are present.
func TestDashboardLayout(t *testing.T) {
	t.Parallel()
	uids := map[string]bool{}
	for _, file := range dashboardFiles(t) {
		d := loadDashboard(t, file)
		if d.UID == "" || uids[d.UID] {
			t.Errorf("%s: missing or duplicate uid %q", file, d.UID)
		}
		uids[d.UID] = true
		ids := map[int]bool{}
		var titles []string
		walkPanels(d.Panels, func(p dashboardPanel) {
			if ids[p.ID] {
				t.Errorf("%s: panel id %d used twice", file, p.ID)
			}
			ids[p.ID] = true
			if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("%s: panel %q has no valid gridPos", file, p.Title)
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", file, p.Title)
			}
			titles = append(titles, strings.ToLower(p.Title))
		})
		if filepath.Base(file) == "lossless-overview.json" {
			for _, want := range []string{"orders by state", "oldest pending outbox event", "oldest open inbox entry", "parked inbox entries", "dead letters", "correlation latency"} {
				if !slices.Contains(titles, want) {
					t.Errorf("%s: no panel %q", file, want)
				}
			}
		}
	}
}

// TestCollectorPipelines: the collector's pipelines only use components the
// file defines, and it exports traces to a compose service.
func TestCollectorPipelines(t *testing.T) {
	t.Parallel()
	var cfg struct {
		Receivers  map[string]any `yaml:"receivers"`
		Processors map[string]any `yaml:"processors"`
		Exporters  map[string]struct {
			Endpoint string `yaml:"endpoint"`
		} `yaml:"exporters"`
		Extensions map[string]any `yaml:"extensions"`
		Service    struct {
			Extensions []string `yaml:"extensions"`
			Pipelines  map[string]struct {
				Receivers  []string `yaml:"receivers"`
				Processors []string `yaml:"processors"`
				Exporters  []string `yaml:"exporters"`
			} `yaml:"pipelines"`
		} `yaml:"service"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(readRepoFile(t, collectorFile))))
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	for _, e := range cfg.Service.Extensions {
		if _, ok := cfg.Extensions[e]; !ok {
			t.Errorf("service extension %q is not defined", e)
		}
	}
	if _, ok := cfg.Service.Pipelines["traces"]; !ok {
		t.Error("no traces pipeline")
	}
	p := loadProject(t, rootComposeFile)
	for name, pl := range cfg.Service.Pipelines {
		for _, r := range pl.Receivers {
			if _, ok := cfg.Receivers[r]; !ok {
				t.Errorf("pipeline %s: receiver %q is not defined", name, r)
			}
		}
		for _, pr := range pl.Processors {
			if _, ok := cfg.Processors[pr]; !ok {
				t.Errorf("pipeline %s: processor %q is not defined", name, pr)
			}
		}
		for _, e := range pl.Exporters {
			exp, ok := cfg.Exporters[e]
			if !ok {
				t.Errorf("pipeline %s: exporter %q is not defined", name, e)
				continue
			}
			host, _, _ := strings.Cut(exp.Endpoint, ":")
			if _, ok := p.Services[host]; !ok {
				t.Errorf("exporter %s sends to %q, not a compose service", e, exp.Endpoint)
			}
		}
	}
}
