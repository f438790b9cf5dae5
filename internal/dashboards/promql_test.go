package dashboards

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

const (
	dashboardPath = "../../deploy/grafana/kvgate.json"
	rulesPath     = "../../deploy/prometheus/kvgate-rules.yaml"
)

// targetLabels are added by Prometheus (the Kubernetes service discovery, the
// Prometheus Operator) to every series of a target; kvgate does not export them.
var targetLabels = []string{"namespace", "pod", "job", "instance", "container", "service"}

// query is one PromQL expression and where it came from.
type query struct {
	where string
	expr  string
	// label is the label a template variable's label_values() lists, if any.
	label string
	// record is the series a recording rule writes.
	record string
}

// panelQueries returns every target expression of the dashboard's panels (rows'
// nested panels included) and every variable's query.
func panelQueries(raw []byte) ([]query, error) {
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	var qs []query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				qs = append(qs, query{where: fmt.Sprintf("panel %q target %s", p.Title, t.RefID), expr: t.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		// Grafana keeps a variable's query as a string or, from its query
		// editor, as an object with the string in "query".
		var s string
		if json.Unmarshal(v.Query, &s) != nil {
			var o struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &o); err != nil {
				return nil, fmt.Errorf("variable %s: %w", v.Name, err)
			}
			s = o.Query
		}
		q, err := labelValues(s)
		if err != nil {
			return nil, fmt.Errorf("variable %s: %w", v.Name, err)
		}
		q.where = "variable " + v.Name
		qs = append(qs, q)
	}
	return qs, nil
}

type panel struct {
	Title   string `json:"title"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

var labelValuesRE = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// labelValues reads Grafana's label_values(selector, label) into the selector
// (as an expression) and the label.
func labelValues(s string) (query, error) {
	m := labelValuesRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return query{}, fmt.Errorf("%q is not label_values(selector, label)", s)
	}
	return query{expr: m[1], label: m[2]}, nil
}

// ruleQueries parses a rules file as Prometheus does (promtool check rules:
// fields, durations, names, templates, expressions) and returns its expressions.
func ruleQueries(raw []byte) ([]query, error) {
	groups, errs := rulefmt.Parse(raw, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		return nil, fmt.Errorf("rules: %w", errs[0])
	}
	var qs []query
	for _, g := range groups.Groups {
		for i, r := range g.Rules {
			name := cmpOr(r.Alert, r.Record)
			qs = append(qs, query{where: fmt.Sprintf("group %s rule %d (%s)", g.Name, i, name), expr: r.Expr, record: r.Record})
		}
	}
	return qs, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

var promql = parser.NewParser(parser.Options{})

// grafanaVar is a dashboard variable or one of Grafana's built-in ones.
var grafanaVar = regexp.MustCompile(`\$\{?(\w+)\}?`)

// substitute replaces Grafana's variables with what Grafana would send: a
// duration for the interval ones, a regular expression for the others (they
// are multi-value, used with =~).
func substitute(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		switch strings.Trim(v, "${}") {
		case "__rate_interval", "__interval", "__range":
			return "1m"
		default:
			return ".*"
		}
	})
}

// exports are the metric families a live kvgate exposes: family name → label
// name → values seen. A histogram's family carries its le values.
type exports map[string]map[string]map[string]bool

// check parses q and returns what in it kvgate does not export: metric names,
// label names in matchers and groupings, le bounds that are no bucket's.
func (ex exports) check(q query) []error {
	e, err := promql.ParseExpr(substitute(q.expr))
	if err != nil {
		return []error{fmt.Errorf("%s: %w", q.where, err)}
	}
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{q.where}, args...)...))
	}
	parser.Inspect(e, func(n parser.Node, path []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			names := selectorNames(n)
			if len(names) == 0 {
				fail("selector %s names no metric", n)
			}
			for _, name := range names {
				ls, ok := ex.family(name)
				if !ok {
					fail("metric %s is not exported by kvgate", name)
					continue
				}
				for _, m := range n.LabelMatchers {
					if m.Name == model.MetricNameLabel {
						continue
					}
					if !hasLabel(ls, m.Name) {
						fail("metric %s has no label %s", name, m.Name)
						continue
					}
					if m.Name == model.BucketLabel && !matchesAny(m, ls[m.Name]) {
						fail("%s matches no bucket bound of %s", m, name)
					}
				}
				if q.label != "" && !hasLabel(ls, q.label) {
					fail("metric %s has no label %s", name, q.label)
				}
			}
		case *parser.AggregateExpr:
			if n.Without {
				break
			}
			for _, l := range n.Grouping {
				if !ex.anyHas(n.Expr, l) {
					fail("%s groups by %s, which none of its metrics has", n.Op, l)
				}
			}
		}
		return nil
	})
	return errs
}

// selectorNames returns the metric names a selector picks: its name, or the
// alternatives of a __name__ matcher (equal, or a regular expression of
// plain names separated by |).
func selectorNames(vs *parser.VectorSelector) []string {
	if vs.Name != "" {
		return []string{vs.Name}
	}
	for _, m := range vs.LabelMatchers {
		if m.Name != model.MetricNameLabel {
			continue
		}
		switch m.Type {
		case labels.MatchEqual:
			return []string{m.Value}
		case labels.MatchRegexp:
			return strings.Split(m.Value, "|")
		}
	}
	return nil
}

// family finds the labels of a series name: a family's own, or a histogram's
// _bucket (with le), _sum and _count.
func (ex exports) family(name string) (map[string]map[string]bool, bool) {
	if ls, ok := ex[name]; ok {
		return ls, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		ls, ok := ex[base]
		if !ok || ls[model.BucketLabel] == nil {
			return nil, false
		}
		if suffix == "_bucket" {
			return ls, true
		}
		out := map[string]map[string]bool{}
		for k, v := range ls {
			if k != model.BucketLabel {
				out[k] = v
			}
		}
		return out, true
	}
	return nil, false
}

// addRecorded adds the series the recording rules write, with the labels their
// aggregations keep, so that the alerts over them are checked too.
func (ex exports) addRecorded(qs []query) error {
	for _, q := range qs {
		if q.record == "" {
			continue
		}
		e, err := promql.ParseExpr(q.expr)
		if err != nil {
			return fmt.Errorf("%s: %w", q.where, err)
		}
		ls := map[string]map[string]bool{}
		parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
			if a, ok := n.(*parser.AggregateExpr); ok && !a.Without {
				for _, l := range a.Grouping {
					ls[l] = map[string]bool{}
				}
			}
			return nil
		})
		ex[q.record] = ls
	}
	return nil
}

func hasLabel(ls map[string]map[string]bool, l string) bool {
	return ls[l] != nil || slices.Contains(targetLabels, l)
}

// anyHas reports whether some metric selected under n carries label l.
func (ex exports) anyHas(n parser.Node, l string) bool {
	found := false
	parser.Inspect(n, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			for _, name := range selectorNames(vs) {
				if ls, ok := ex.family(name); ok && hasLabel(ls, l) {
					found = true
				}
			}
		}
		return nil
	})
	return found
}

func matchesAny(m *labels.Matcher, values map[string]bool) bool {
	for v := range values {
		if m.Matches(v) {
			return true
		}
	}
	return false
}

func readFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}
