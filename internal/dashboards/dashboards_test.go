package dashboards

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestQueriesNameExportedMetrics parses every PromQL expression of the
// dashboard and the rules with Prometheus' parser and checks each metric,
// label and bucket bound it names against what a live kvgate exports.
func TestQueriesNameExportedMetrics(t *testing.T) {
	l := startLive(t)
	ex := l.exports(t)

	dash, err := readFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	panels, err := panelQueries(dash)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := readFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	alerts, err := ruleQueries(rules)
	if err != nil {
		t.Fatal(err)
	}
	if err := ex.addRecorded(alerts); err != nil {
		t.Fatal(err)
	}
	// Floors, so that a reader that silently finds nothing cannot pass.
	if len(panels) < 40 || len(alerts) < 10 {
		t.Fatalf("read %d dashboard and %d rule expressions; the files have more", len(panels), len(alerts))
	}
	for _, set := range []struct {
		name    string
		queries []query
	}{{"dashboard", panels}, {"rules", alerts}} {
		t.Run(set.name, func(t *testing.T) {
			for _, q := range set.queries {
				for _, err := range ex.check(q) {
					t.Error(err)
				}
			}
		})
	}

	// The checker itself, on the same exports: each of these must be caught.
	for _, tc := range []struct {
		name, expr, want string
	}{
		{"unknown metric", `rate(kvgate_request_total[$__rate_interval])`, "kvgate_request_total is not exported"},
		{"unknown label in a matcher", `kvgate_endpoint_healthy{pool="x"}`, "has no label pool"},
		{"unknown label in a grouping", `sum by (member) (rate(kvgate_requests_total[5m]))`, "groups by member"},
		{"a histogram's bucket of a counter", `kvgate_requests_total_bucket`, "not exported"},
		{"le that is no bucket bound", `kvgate_time_to_first_token_seconds_bucket{le="0.75"}`, "matches no bucket bound"},
		{"a __name__ alternative that does not exist", `{__name__=~"kvgate_requests_total|kvgate_nope"}`, "kvgate_nope is not exported"},
		{"does not parse", `sum by (scheduler (rate(kvgate_requests_total[5m]))`, "unexpected"},
	} {
		t.Run("catches/"+tc.name, func(t *testing.T) {
			err := errors.Join(ex.check(query{where: "test", expr: tc.expr})...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("check(%s) = %v, want an error with %q", tc.expr, err, tc.want)
			}
		})
	}
	t.Run("passes/a query that is right", func(t *testing.T) {
		q := query{where: "test", expr: `sum by (namespace, scheduler, code) (rate(kvgate_requests_total{pod=~"$pod"}[$__rate_interval]))`}
		if err := errors.Join(ex.check(q)...); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRulesFileChecks reads rules files as promtool check rules does: a file
// Prometheus would refuse fails here too.
func TestRulesFileChecks(t *testing.T) {
	for _, tc := range []struct {
		name, rules, want string
	}{
		{"ok", `
groups:
  - name: g
    rules:
      - alert: A
        expr: up == 0
        for: 5m
        labels: {severity: warning}
        annotations: {summary: "{{ $labels.instance }} is down"}`, ""},
		{"a for that is no duration", `
groups:
  - name: g
    rules:
      - alert: A
        expr: up == 0
        for: five minutes`, "not a valid duration"},
		{"no expr", `
groups:
  - name: g
    rules:
      - alert: A`, "field 'expr' must be set"},
		{"neither alert nor record", `
groups:
  - name: g
    rules:
      - expr: up`, "one of 'record' or 'alert' must be set"},
		{"an expression that does not parse", `
groups:
  - name: g
    rules:
      - record: r
        expr: sum(up`, "unclosed"},
		{"a template that does not parse", `
groups:
  - name: g
    rules:
      - alert: A
        expr: up == 0
        annotations: {summary: "{{ $labels.instance "}`, "template"},
		{"an unknown field", `
groups:
  - name: g
    rules:
      - alert: A
        expr: up == 0
        severity: page`, "not found"},
		{"a group twice", `
groups:
  - name: g
    rules: [{record: r, expr: up}]
  - name: g
    rules: [{record: r, expr: up}]`, "repeated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qs, err := ruleQueries([]byte(tc.rules))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "" && len(qs) != 1:
				t.Fatalf("read %d expressions, want 1", len(qs))
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestDashboardShape checks what Grafana needs to import the dashboard anywhere:
// a data source variable every query uses, unique panel ids, and a layout on
// Grafana's 24-column grid.
func TestDashboardShape(t *testing.T) {
	raw, err := readFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID           string `json:"uid"`
		SchemaVersion int    `json:"schemaVersion"`
		Templating    struct {
			List []struct {
				Name, Type string
				Query      any
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID         int    `json:"id"`
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource *struct {
				Type, UID string
			} `json:"datasource"`
			GridPos struct{ X, Y, W, H int } `json:"gridPos"`
			Targets []struct {
				Datasource *struct{ UID string } `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.SchemaVersion < 39 {
		t.Errorf("uid %q, schemaVersion %d: want a uid and a current schema (39 or later)", d.UID, d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	for name, typ := range map[string]string{"datasource": "datasource", "namespace": "query", "pod": "query", "scheduler": "query"} {
		if vars[name] != typ {
			t.Errorf("variable %s is of type %q, want %q", name, vars[name], typ)
		}
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		t.Run(p.Title, func(t *testing.T) {
			if ids[p.ID] {
				t.Errorf("id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if g := p.GridPos; g.X < 0 || g.W <= 0 || g.X+g.W > 24 || g.H <= 0 {
				t.Errorf("gridPos %+v is off the 24-column grid", g)
			}
			if p.Type == "row" {
				return
			}
			if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
				t.Fatalf("datasource %+v with %d targets: want prometheus ${datasource}", p.Datasource, len(p.Targets))
			}
			for _, tg := range p.Targets {
				if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
					t.Errorf("a target's datasource is %+v, not ${datasource}", tg.Datasource)
				}
			}
		})
	}
}
