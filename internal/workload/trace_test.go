package workload

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, s := range []Spec{
		{Kind: SharedPrefix, Requests: 50},
		{Kind: MultiTurn, Sessions: 5, Turns: 4},
		{Kind: LoRAMix, Requests: 50},
		{Kind: Poisson, Requests: 50, Model: `odd "model" <name>`},
	} {
		t.Run(s.Kind, func(t *testing.T) {
			want := generate(t, s)
			got, err := Read(bytes.NewReader(jsonl(t, want)))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("read back a different trace")
			}
		})
	}
	if got, err := Read(strings.NewReader("")); err != nil || len(got) != 0 {
		t.Errorf("empty input: %v, %v", got, err)
	}
}

const ok = `{"t":1,"model":"m","prompt":[{"id":"a","tokens":3}],"output_tokens":2}`

func TestReadAccepts(t *testing.T) {
	long := ok[:len(ok)-1] + strings.Repeat(" ", MaxLine-len(ok)) + "}"
	for _, tc := range []struct {
		name, in string
		n        int
	}{
		{"blank lines", "\n" + ok + "\n  \n\t\n" + ok, 2},
		{"CRLF", ok + "\r\n" + ok + "\r\n", 2},
		{"equal times", ok + "\n" + ok, 2},
		{"all fields", `{"t":0,"model":"m","adapter":"x","prompt":[{"id":"a","tokens":3},{"id":"b","tokens":1}],"output_tokens":2,"session":"s","group":"g"}`, 1},
		{"a line of MaxLine bytes", long, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := Read(strings.NewReader(tc.in))
			if err != nil || len(tr) != tc.n {
				t.Fatalf("%d requests, %v; want %d", len(tr), err, tc.n)
			}
		})
	}
}

func TestReadRejects(t *testing.T) {
	extra := ok[:len(ok)-1] + `,"extra":1}`
	for _, tc := range []struct {
		name, in string
		want     string // the error's start
		about    string // and something it says
	}{
		{"unknown field", extra, "line 1: ", "extra"},
		{"unknown segment field", `{"t":1,"model":"m","prompt":[{"id":"a","tokens":3,"text":"x"}],"output_tokens":2}`, "line 1: ", "text"},
		{"line number counts blank lines", "\n\n" + extra, "line 3: ", "extra"},
		{"negative tokens", ok + "\n" + `{"t":1,"model":"m","prompt":[{"id":"a","tokens":-3}],"output_tokens":2}`, "line 2: ", "-3 tokens"},
		{"zero tokens", `{"t":1,"model":"m","prompt":[{"id":"a","tokens":0}],"output_tokens":2}`, "line 1: ", "0 tokens"},
		{"segment without id", `{"t":1,"model":"m","prompt":[{"tokens":3}],"output_tokens":2}`, "line 1: ", "no id"},
		{"empty model", `{"t":1,"model":"","prompt":[{"id":"a","tokens":3}],"output_tokens":2}`, "line 1: ", "no model"},
		{"no model", `{"t":1,"prompt":[{"id":"a","tokens":3}],"output_tokens":2}`, "line 1: ", "no model"},
		{"t decreasing", ok + "\n" + ok + "\n" + `{"t":0.5,"model":"m","prompt":[{"id":"a","tokens":3}],"output_tokens":2}`, "line 3: ", "before"},
		{"negative t", `{"t":-1,"model":"m","prompt":[{"id":"a","tokens":3}],"output_tokens":2}`, "line 1: ", "negative t"},
		{"no segments", `{"t":1,"model":"m","prompt":[],"output_tokens":2}`, "line 1: ", "no prompt"},
		{"no prompt", `{"t":1,"model":"m","output_tokens":2}`, "line 1: ", "no prompt"},
		{"negative output", `{"t":1,"model":"m","prompt":[{"id":"a","tokens":3}],"output_tokens":-2}`, "line 1: ", "output_tokens -2"},
		{"no output", `{"t":1,"model":"m","prompt":[{"id":"a","tokens":3}]}`, "line 1: ", "output_tokens 0"},
		{"wrong type", `{"t":"soon","model":"m","prompt":[{"id":"a","tokens":3}],"output_tokens":2}`, "line 1: ", "string"},
		{"truncated", ok + "\n" + `{"t":1,"model":`, "line 2: ", "unexpected EOF"},
		{"two on a line", ok + ok, "line 1: ", "data after"},
		{"not an object", ok + "\n[1]", "line 2: ", "cannot unmarshal"},
		{"too long", ok + "\n" + strings.Repeat(" ", MaxLine+1) + ok, "line 2: ", "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tc.in))
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.about) {
				t.Fatalf("error %v, want %q… about %q", err, tc.want, tc.about)
			}
		})
	}
}
