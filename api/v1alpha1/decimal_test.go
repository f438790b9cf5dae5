package v1alpha1

import (
	"encoding/json"
	"testing"
)

func TestDecimalJSON(t *testing.T) {
	for _, tc := range []struct {
		in, out string // out "" : refused
		want    float64
	}{
		{`{"scale":0.01}`, `{"scale":0.01}`, 0.01},
		{`{"scale":"0.01"}`, `{"scale":0.01}`, 0.01},
		{`{"scale":1e-3}`, `{"scale":0.001}`, 0.001},
		{`{"scale":2}`, `{"scale":2}`, 2},
		{`{"scale":null}`, `{}`, 0},
		{`{}`, `{}`, 0},
		{`{"scale":"lots"}`, "", 0},
		{`{"scale":"NaN"}`, "", 0},
		{`{"scale":"Inf"}`, "", 0},
		{`{"scale":true}`, "", 0},
	} {
		var v struct {
			Scale Decimal `json:"scale,omitempty"`
		}
		err := json.Unmarshal([]byte(tc.in), &v)
		if tc.out == "" {
			if err == nil {
				t.Errorf("%s: accepted as %q", tc.in, v.Scale)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		f, err := v.Scale.Float64()
		out, merr := json.Marshal(v)
		if err != nil || merr != nil || f != tc.want || string(out) != tc.out {
			t.Errorf("%s: %v (%v), marshalled %s (%v)", tc.in, f, err, out, merr)
		}
	}
}
