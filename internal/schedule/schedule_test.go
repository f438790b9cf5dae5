package schedule

import (
	"maps"
	"testing"

	"github.com/kvgate/kvgate/api/v1alpha1"
)

func addrs(d Decision) []string {
	out := make([]string, len(d.Ranked))
	for i, c := range d.Ranked {
		out[i] = c.Address
	}
	return out
}

func TestLeastRequest(t *testing.T) {
	p, _ := New("least-request", 1)
	for _, tc := range []struct {
		name  string
		eps   []Endpoint
		first string
		last  string
	}{
		{"fewest first", []Endpoint{{Address: "a", InFlight: 5}, {Address: "b", InFlight: 1}, {Address: "c", InFlight: 3}}, "b", "a"},
		{"single", []Endpoint{{Address: "a", InFlight: 9}}, "a", "a"},
		{"zero load wins", []Endpoint{{Address: "a", InFlight: 0}, {Address: "b", InFlight: 2}}, "a", "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := p.Pick(Request{}, tc.eps)
			got := addrs(d)
			if got[0] != tc.first || got[len(got)-1] != tc.last {
				t.Fatalf("ranked %v", got)
			}
			for _, c := range d.Ranked {
				if c.Score < 0 || c.Score > 1 {
					t.Errorf("score %v outside [0,1]", c.Score)
				}
			}
		})
	}
	// Ties are broken at random: over many picks every tied endpoint leads.
	seen := map[string]bool{}
	for range 200 {
		seen[p.Pick(Request{}, []Endpoint{{Address: "a", InFlight: 1}, {Address: "b", InFlight: 1}, {Address: "c", InFlight: 1}}).Ranked[0].Address] = true
	}
	if len(seen) != 3 {
		t.Errorf("tie-break led with only %v", seen)
	}
}

func TestRoundRobin(t *testing.T) {
	p, _ := New("round-robin", 0)
	eps := []Endpoint{{Address: "a", InFlight: 0}, {Address: "b", InFlight: 0}, {Address: "c", InFlight: 0}}
	var firsts []string
	for range 6 {
		d := p.Pick(Request{}, eps)
		if len(d.Ranked) != 3 {
			t.Fatal("fallbacks missing")
		}
		firsts = append(firsts, d.Ranked[0].Address)
	}
	if got := firsts; got[0] != "a" || got[1] != "b" || got[2] != "c" || got[3] != "a" {
		t.Fatalf("order %v", got)
	}
	if d := p.Pick(Request{}, nil); len(d.Ranked) != 0 {
		t.Error("empty pool ranked something")
	}
}

func TestRandom(t *testing.T) {
	p, _ := New("random", 3)
	count := map[string]int{}
	for range 3000 {
		count[p.Pick(Request{}, []Endpoint{{Address: "a", InFlight: 0}, {Address: "b", InFlight: 0}, {Address: "c", InFlight: 0}}).Ranked[0].Address]++
	}
	for _, a := range []string{"a", "b", "c"} {
		if count[a] < 800 || count[a] > 1200 {
			t.Errorf("%s first %d times of 3000", a, count[a])
		}
	}
}

func TestUnknownPicker(t *testing.T) {
	if _, err := New("best", 0); err == nil {
		t.Fatal("unknown picker accepted")
	}
}

func TestProfile(t *testing.T) {
	spec := func(name v1alpha1.ProfileName) Weights {
		p, ok := lookupProfile(name)
		if !ok {
			t.Fatalf("no profile %q", name)
		}
		return p.Profile.Weights
	}
	for _, tc := range []struct {
		name    string
		want    Weights
		wantErr bool
	}{
		{"gie-default", GIEDefault, false},
		{"", spec(DefaultProfile), false},
		{"kvgate", spec(DefaultProfile), false},
		{"batch", spec(v1alpha1.ProfileBatch), false},
		{"fastest", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := LookupProfile(tc.name)
			got := p.Weights
			if (err != nil) != tc.wantErr || !maps.Equal(got, tc.want) {
				t.Fatalf("got %v %v", got, err)
			}
			if got != nil {
				got["queue"] = 99 // a copy: the built-in profile stays
				if p, _ := LookupProfile(tc.name); p.Weights["queue"] == 99 {
					t.Fatal("Profile returned the shared map")
				}
			}
		})
	}
}

func TestPowerOfTwo(t *testing.T) {
	p, err := New("power-of-two", 5)
	if err != nil {
		t.Fatal(err)
	}
	eps := []Endpoint{{Address: "a", InFlight: 0}, {Address: "b", InFlight: 10}, {Address: "c", InFlight: 10}}
	first := map[string]int{}
	for range 3000 {
		d := p.Pick(Request{}, eps)
		if len(d.Ranked) != 2 || d.Ranked[0].Address == d.Ranked[1].Address {
			t.Fatalf("ranked %+v", d.Ranked)
		}
		first[d.Ranked[0].Address]++
	}
	// a wins whenever it is sampled: 2 of the 3 pairs.
	if first["a"] < 1800 || first["a"] > 2200 || first["b"] == 0 || first["c"] == 0 {
		t.Fatalf("first picks %v", first)
	}
	for _, n := range []int{0, 1} {
		if d := p.Pick(Request{}, eps[:n]); len(d.Ranked) != n {
			t.Errorf("%d endpoints ranked %d", n, len(d.Ranked))
		}
	}
}
