package v1alpha1

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// Decimal is a number as a document writes it (0.01, 1e-2, or quoted "0.01"),
// kept as its text: the API holds no floating-point field, whose value would
// change in a round trip through the API server.
//
// +kubebuilder:validation:Type=number
type Decimal string

// UnmarshalJSON reads a JSON number or a string holding one.
func (d *Decimal) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	}
	if _, err := Decimal(s).Float64(); err != nil {
		return err
	}
	*d = Decimal(s)
	return nil
}

// MarshalJSON writes the number, unquoted.
func (d Decimal) MarshalJSON() ([]byte, error) {
	if d == "" {
		return []byte("null"), nil
	}
	f, err := d.Float64()
	if err != nil {
		return nil, err
	}
	return []byte(strconv.FormatFloat(f, 'g', -1, 64)), nil
}

// Float64 is the number; 0 for the empty Decimal.
func (d Decimal) Float64() (float64, error) {
	if d == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(string(d), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("%q is not a number", string(d))
	}
	return f, nil
}
