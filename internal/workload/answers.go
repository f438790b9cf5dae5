package workload

import "slices"

// Answers gives, for each request of t, the segment under which a later turn of
// its session quotes its output, or a zero Segment when no request does. A later
// turn quotes request r when its prompt is r's prompt, then a segment of
// r.OutputTokens tokens (the answer), then more. A replay whose server caches
// output blocks, as vLLM V1 does, names the blocks r's output fills with
// BlockIDs(r.Prompt + answer): they are the leading blocks of the next turn's
// prompt, which then hits them.
func (t Trace) Answers() []Segment {
	out := make([]Segment, len(t))
	last := map[string]int{} // session → index of its latest request so far
	for j, r := range t {
		if r.Session == "" {
			continue
		}
		if i, ok := last[r.Session]; ok {
			p := t[i].Prompt
			if len(r.Prompt) > len(p)+1 && slices.Equal(r.Prompt[:len(p)], p) && r.Prompt[len(p)].Tokens == t[i].OutputTokens {
				out[i] = r.Prompt[len(p)]
			}
		}
		last[r.Session] = j
	}
	return out
}
