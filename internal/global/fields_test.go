package global

import "testing"

// TestLimitFields: a body's token limits and stream flag are read by their
// exact names, as the model server reads them; other spellings are unknown
// fields, and a limit of the wrong type is an error.
func TestLimitFields(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		max        int64
		stream     bool
		err        bool
	}{
		{"none", `{"model":"m"}`, 0, false, false},
		{"max_tokens and stream", `{"model":"m","max_tokens":64,"stream":true}`, 64, true, false},
		{"the largest limit", `{"max_tokens":8,"max_completion_tokens":32,"max_output_tokens":16}`, 32, false, false},
		{"other spellings are not the limits", `{"MAX_TOKENS":999999,"Max_Tokens":999999,"STREAM":true}`, 0, false, false},
		{"exact name beside another spelling", `{"MAX_TOKENS":999999,"max_tokens":4}`, 4, false, false},
		{"a limit that is not a number", `{"max_tokens":"many"}`, 0, false, true},
		{"a stream flag that is not a boolean", `{"stream":"yes"}`, 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := limitFields([]byte(tc.body))
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if tc.err {
				return
			}
			if got := maxOf(f.MaxTokens, f.MaxCompletionTokens, f.MaxOutputTokens); got != tc.max {
				t.Errorf("largest limit %d, want %d", got, tc.max)
			}
			if got := f.Stream != nil && *f.Stream; got != tc.stream {
				t.Errorf("stream %v, want %v", got, tc.stream)
			}
		})
	}
}
