package sim

import (
	"math"
	"testing"
)

// TestCalibration holds the simulator to every published figure it is calibrated
// against (docs/simulator.md): within ±25%.
func TestCalibration(t *testing.T) {
	rows, err := CalibrationTable()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		t.Run(r.Deployment.String()+" "+r.Figure, func(t *testing.T) {
			if r.Excluded != "" {
				t.Skip(r.Excluded)
			}
			if math.Abs(r.Deviation) > 0.25 {
				t.Errorf("simulated %.1f %s, published %.1f %s (%+.0f%%): outside ±25%%", r.Simulated, r.Unit, r.Published, r.Unit, r.Deviation*100)
			}
		})
	}
}

func TestProfileCoversEveryGPUAndSize(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range ProfileDeployments {
		row, err := Profile(d)
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		if row.TTFT4k <= row.TTFT1k || row.ITL64 <= row.ITL1 || row.KVBlocks <= 0 {
			t.Errorf("%s: implausible profile %+v", d, row)
		}
		seen[d.GPU] = true
		seen[d.ModelSize] = true
	}
	for _, name := range append(GPUNames(), ModelSizes()...) {
		if !seen[name] {
			t.Errorf("profile table misses %s", name)
		}
	}
}
