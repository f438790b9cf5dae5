package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Write writes dir/results.json (the results as an indented JSON array),
// dir/report.md, and for each scenario with results its plots under dir/plots:
// <scenario>-ttft-cdf.svg and, when the run is long enough for windows of
// minPerWindow requests, <scenario>-ttft-over-time.svg. It creates dir and
// dir/plots. The numbers are written before the plots so that a plot that cannot
// be drawn does not cost the run its results.
func Write(dir string, scenarios []Scenario, results []Result, header string) error {
	return WriteDoc(dir, scenarios, results, Doc{Header: header})
}

// WriteDoc is Write with what the report says besides the results (MarkdownDoc).
// The plots draw one line per policy, a drawn policy's median draw.
func WriteDoc(dir string, scenarios []Scenario, results []Result, doc Doc) error {
	if err := os.MkdirAll(filepath.Join(dir, "plots"), 0o755); err != nil {
		return fmt.Errorf("create report directory: %w", err)
	}
	if results == nil {
		results = []Result{} // an empty run is [], not null
	}
	js, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	md := MarkdownDoc(scenarios, results, doc)
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(md), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	for _, s := range sections(scenarios, results) {
		if len(s.results) == 0 {
			continue
		}
		plotted := s.plotted()
		cdf, overTime := plotPaths(s.Name)
		if err := cdfPlot(s.Name, plotted).save(filepath.Join(dir, filepath.FromSlash(cdf))); err != nil {
			return err
		}
		path := filepath.Join(dir, filepath.FromSlash(overTime))
		if arrivalWindows(plotted) == nil {
			// report.md does not link it; one left from an earlier run would mislead.
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove stale plot: %w", err)
			}
			continue
		}
		if err := overTimePlot(s.Name, plotted).save(path); err != nil {
			return err
		}
	}
	return nil
}

// plotPaths are a scenario's plots relative to the report's directory, as
// report.md links them.
func plotPaths(scenario string) (cdf, overTime string) {
	name := fileName(scenario)
	return "plots/" + name + "-ttft-cdf.svg", "plots/" + name + "-ttft-over-time.svg"
}

// fileName keeps a scenario name that is safe in a path and a Markdown link, and
// replaces anything else: the name comes from the command line.
func fileName(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
	if strings.Trim(s, ".") == "" {
		return "scenario" + s // "", "." and ".." are not file names
	}
	return s
}
