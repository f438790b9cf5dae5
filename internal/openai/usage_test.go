package openai

import "testing"

// TestUsageReader: usage is found in every response shape the gateways pass
// through, fed in pieces that cut lines and objects anywhere.
func TestUsageReader(t *testing.T) {
	for _, tc := range []struct {
		name               string
		sse                bool
		body               string
		prompt, completion int64
		seen               bool
		events             int64
	}{
		{"chat JSON", false, `{"id":"c","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}`, 12, 7, true, 0},
		{"chat stream with usage", true, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n", 3, 1, true, 2},
		{"chat stream without usage", true, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata:{\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n", 0, 0, false, 2},
		{"responses JSON", false, `{"id":"r","object":"response","output":[],"usage":{"input_tokens":30,"output_tokens":9,"total_tokens":39}}`, 30, 9, true, 0},
		{"responses stream", true, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":5,\"output_tokens\":2}}}\n\n", 5, 2, true, 2},
		{"not JSON", false, `<html>`, 0, 0, false, 0},
		{"JSON with spaces", false, "{\"id\": \"c\", \"usage\" : {\"prompt_tokens\": 4, \"completion_tokens\": 2}}", 4, 2, true, 0},
		{"pretty-printed JSON", false, "{\n  \"choices\": [],\n  \"usage\":\n  {\n    \"prompt_tokens\": 8,\n    \"completion_tokens\": 1\n  }\n}", 8, 1, true, 0},
		{"stream with spaces", true, "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 6, \"completion_tokens\": 3}}\n\ndata: [DONE]\n\n", 6, 3, true, 1},
		{"usage null", false, `{"id":"c","usage":null}`, 0, 0, false, 0},
		{"the word usage in content", true, "data: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\": none\"}}]}\n\ndata: [DONE]\n\n", 0, 0, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, piece := range []int{1, 7, 1 << 20} {
				u := NewUsageReader(tc.sse)
				for b := []byte(tc.body); len(b) > 0; {
					n := min(piece, len(b))
					u.Feed(b[:n])
					b = b[n:]
				}
				p, c, ok := u.Usage()
				if p != tc.prompt || c != tc.completion || ok != tc.seen || u.Events() != tc.events {
					t.Fatalf("pieces of %d: usage %d/%d seen %v, %d events; want %d/%d %v, %d", piece, p, c, ok, u.Events(), tc.prompt, tc.completion, tc.seen, tc.events)
				}
			}
		})
	}
}

// TestUsageReaderShape: a stream is whole once its terminator came, and an
// event whose data is neither JSON nor [DONE] is malformed, however the
// stream is cut into pieces.
func TestUsageReaderShape(t *testing.T) {
	ev := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
	for _, tc := range []struct {
		name      string
		body      string
		ended     bool
		malformed int64
	}{
		{"chat stream", ev + "data: [DONE]\n\n", true, 0},
		{"CRLF lines", "data: {\"a\":1}\r\n\r\ndata: [DONE]\r\n\r\n", true, 0},
		{"[DONE] without its blank line", ev + "data: [DONE]", true, 0},
		{"no terminator", ev + ev, false, 0},
		{"cut mid-event", ev + "data: {\"choices\":[", false, 1},
		{"not JSON", ev + "data: <html>oops</html>\n\n" + "data: [DONE]\n\n", true, 1},
		{"JSON over two data lines", "data: {\"a\":\ndata: 1}\n\ndata: [DONE]\n\n", true, 0},
		{"comments and other fields", ": keep-alive\n\nid: 7\nretry: 100\n" + ev + "data: [DONE]\n\n", true, 0},
		{"responses stream", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\"}\n\n", true, 0},
		{"responses stream cut", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\"}\n\n", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, piece := range []int{1, 7, 1 << 20} {
				u := NewUsageReader(true)
				for b := []byte(tc.body); len(b) > 0; {
					n := min(piece, len(b))
					u.Feed(b[:n])
					b = b[n:]
				}
				u.Finish()
				if u.Ended() != tc.ended || u.Malformed() != tc.malformed {
					t.Fatalf("pieces of %d: ended %v, malformed %d; want %v, %d", piece, u.Ended(), u.Malformed(), tc.ended, tc.malformed)
				}
			}
		})
	}
}
