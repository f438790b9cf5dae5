package engine

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/api/v1alpha1"
)

// MapFor is the metric map a scheduler's engineType and metrics configure:
// nil, which detects a built-in map, for neither; with engineType custom, the
// map metrics gives; with a built-in engineType, its map with the signals
// metrics sets in place of its own.
func MapFor(engineType string, mm *v1alpha1.MetricMap) (*Map, error) {
	d := Dialect(engineType)
	base := Builtin(d)
	switch {
	case d == "" && mm == nil:
		return nil, nil
	case d == "":
		return nil, errors.New("metrics: " + v1alpha1.MsgMetricsEngine)
	case d == Custom && mm == nil:
		return nil, errors.New(v1alpha1.MsgCustomMetrics)
	case d != Custom && base == nil:
		return nil, fmt.Errorf("unknown engine type %q", d)
	case mm == nil:
		return base, nil
	}
	spec, err := specOf(mm)
	if err != nil {
		return nil, err
	}
	if d == Custom {
		return NewMap(Custom, spec)
	}
	return base.Override(spec)
}

// specOf translates the API's map; fields it leaves out stay zero.
func specOf(mm *v1alpha1.MetricMap) (MapSpec, error) {
	var spec MapSpec
	var errs []error
	src := func(what string, s *v1alpha1.MetricSource, label string) Source {
		if s == nil {
			return Source{}
		}
		scale, err := s.Scale.Float64()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: scale: %w", what, err))
		}
		return Source{Names: []string{s.Name}, Match: s.Labels, Scale: scale, Label: label}
	}
	spec.Queue = src("queue", mm.Queue, "")
	spec.Running = src("running", mm.Running, "")
	spec.KVUsage = src("kvUsage", mm.KVUsage, "")
	spec.KVUsed = src("kvUsed", mm.KVUsed, "")
	spec.KVTotal = src("kvTotal", mm.KVTotal, "")
	if b := mm.BlockSize; b != nil {
		spec.BlockSize = src("blockSize", &b.MetricSource, b.Label)
	}
	if b := mm.NumBlocks; b != nil {
		spec.NumBlocks = src("numBlocks", &b.MetricSource, b.Label)
	}
	if l := mm.LoRA; l != nil {
		spec.LoRA = LoRASource{Name: l.Name, Match: l.Labels, Running: l.RunningLabel, Waiting: l.WaitingLabel, Max: l.MaxLabel}
	}
	return spec, errors.Join(errs...)
}
