package simserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

// Handler serves the model server's HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/completions", s.handleCompletions)
	mux.HandleFunc("/v1/chat/completions", s.handleChat)
	mux.HandleFunc("/v1/models", s.handleModels)
	mux.HandleFunc("/v1/load_lora_adapter", s.handleLoadLoRA)
	mux.HandleFunc("/v1/unload_lora_adapter", s.handleUnloadLoRA)
	mux.HandleFunc("/health", s.handleHealth)
	metrics := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		s.scrapes.Add(1)
		if code := s.Faults().MetricsErrorStatus; code != 0 {
			http.Error(w, "metrics exporter failing (fault injected)", code)
			return
		}
		metrics.ServeHTTP(w, r)
	})
	mux.HandleFunc("/admin/faults", s.handleFaults)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		openai.WriteError(w, http.StatusNotFound, openai.TypeNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// job is a parsed generation request.
type job struct {
	chat         bool
	model        string // as the client named it
	adapter      string
	promptTokens []uint32
	maxTokens    int
	ignoreEOS    bool
	stream       bool
	includeUsage bool
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var req openai.CompletionRequest
	if !allowPOST(w, r) || !s.applyRequestFaults(w, r) || !s.readJSON(w, r, &req) {
		return
	}
	if err := req.Validate(); err != nil {
		openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, err.Error())
		return
	}
	p, err := openai.ParsePrompt(req.Prompt)
	if err != nil {
		openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, err.Error())
		return
	}
	j := job{model: req.Model, ignoreEOS: req.IgnoreEOS, stream: req.Stream, maxTokens: 16}
	if req.MaxTokens != nil {
		j.maxTokens = *req.MaxTokens
	}
	j.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if p.IsIDs {
		j.promptTokens = make([]uint32, len(p.Tokens))
		for i, t := range p.Tokens {
			if t < 0 || t > math.MaxUint32 {
				openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, fmt.Sprintf("token id %d at prompt[%d] is out of range", t, i))
				return
			}
			j.promptTokens[i] = uint32(t)
		}
	} else {
		j.promptTokens = tokenizer.Encode(nil, p.Text)
	}
	s.generate(w, r, j)
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	var req openai.ChatRequest
	if !allowPOST(w, r) || !s.applyRequestFaults(w, r) || !s.readJSON(w, r, &req) {
		return
	}
	if err := req.Validate(); err != nil {
		openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, err.Error())
		return
	}
	prompt, err := chatTemplate(req.Messages)
	if err != nil {
		openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, err.Error())
		return
	}
	j := job{chat: true, model: req.Model, ignoreEOS: req.IgnoreEOS, stream: req.Stream, promptTokens: tokenizer.Encode(nil, prompt)}
	switch {
	case req.MaxCompletionTokens != nil:
		j.maxTokens = *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		j.maxTokens = *req.MaxTokens
	}
	j.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	s.generate(w, r, j)
}

// chatTemplate renders messages the way Llama 3's template does, so that prompt
// length and shared prefixes behave as on a real server.
func chatTemplate(msgs []openai.ChatMessage) (string, error) {
	var b strings.Builder
	b.WriteString("<|begin_of_text|>")
	for i, m := range msgs {
		text, err := m.ContentText()
		if err != nil {
			return "", fmt.Errorf("messages[%d]: %w", i, err)
		}
		b.WriteString("<|start_header_id|>")
		b.WriteString(m.Role)
		b.WriteString("<|end_header_id|>\n\n")
		b.WriteString(text)
		b.WriteString("<|eot_id|>")
	}
	b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	return b.String(), nil
}

func allowPOST(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodPost {
		return true
	}
	w.Header().Set("Allow", http.MethodPost)
	openai.WriteError(w, http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "method "+r.Method+" not allowed; use POST")
	return false
}

// readJSON reads a body of bounded size into v, answering errors itself.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			openai.WriteError(w, http.StatusRequestEntityTooLarge, openai.TypeInvalidRequest,
				fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit))
			return false
		}
		openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, "reading body: "+err.Error())
		return false
	}
	if err := json.Unmarshal(body, v); err != nil {
		openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, "malformed JSON body: "+jsonError(err))
		return false
	}
	return true
}

// jsonError says where a body went wrong in terms of the request, not of Go types.
func jsonError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field '%s' must be %s, got %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
	}
	return err.Error()
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int64", "float64":
		return "a number"
	case "bool":
		return "a boolean"
	case "string":
		return "a string"
	case "slice":
		return "an array"
	default:
		return "an object"
	}
}

// resolveModel maps the requested name to an adapter ("" for the base model).
func (s *Server) resolveModel(name string) (adapter string, ok bool) {
	if name == s.opts.ServedName {
		return "", true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok = s.adapters[name]
	return name, ok
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request, j job) {
	adapter, ok := s.resolveModel(j.model)
	if !ok {
		openai.WriteError(w, http.StatusNotFound, openai.TypeNotFound, fmt.Sprintf("The model `%s` does not exist.", j.model))
		return
	}
	j.adapter = adapter
	bs := s.opts.Engine.BlockSize
	if bs == 0 {
		bs = sim.DefaultBlockSize
	}
	req := sim.Request{
		PromptTokens: len(j.promptTokens),
		BlockHashes:  sim.BlockHashes(nil, j.promptTokens, bs, sim.HashSeed(s.opts.Model, adapter)),
		MaxTokens:    j.maxTokens,
		IgnoreEOS:    j.ignoreEOS,
		Adapter:      adapter,
	}
	if req.PromptTokens == 0 {
		openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, "the prompt is empty")
		return
	}
	st, err := s.submit(req)
	if errors.Is(err, errClosed) {
		openai.WriteError(w, http.StatusServiceUnavailable, openai.TypeServer, err.Error())
		return
	}
	if err != nil {
		openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, strings.TrimPrefix(err.Error(), sim.ErrContextLength.Error()+": "))
		return
	}
	defer s.release(st)
	cut := s.drawStreamCut(j.stream)
	out := newResponder(w, j, st.seq.ID, s.opts.Engine.Seed)
	sent := 0
	for {
		visible, done := s.progress(st)
		if j.stream && visible > sent {
			n := visible
			if cut > 0 && n >= cut {
				n = cut
			}
			if err := out.tokens(sent, n); err != nil {
				return // the client went away; release aborts the sequence
			}
			sent = n
			if cut > 0 && sent >= cut {
				// Fault: the server dies mid-stream. ErrAbortHandler makes net/http
				// drop the connection without finishing the chunked body.
				panic(http.ErrAbortHandler)
			}
		}
		if done {
			break
		}
		select {
		case <-st.notify:
		case <-r.Context().Done():
			return
		}
	}
	q := st.seq
	if q.Finish == sim.FinishAbort {
		// The server stopped under this request. Say so with a 503 while nothing was
		// sent; afterwards cut the stream so the client sees it truncated, not ended.
		if sent == 0 {
			openai.WriteError(w, http.StatusServiceUnavailable, openai.TypeServer, errClosed.Error())
			return
		}
		panic(http.ErrAbortHandler)
	}
	u := usage{Prompt: q.Req.PromptTokens, Completion: q.Generated, Cached: q.CachedTokens}
	if j.stream {
		_ = out.finish(string(q.Finish), u)
		return
	}
	out.whole(q.Generated, string(q.Finish), u)
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		openai.WriteError(w, http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "use GET")
		return
	}
	s.mu.Lock()
	maxLen := s.eng.MaxModelLen()
	names := make([]string, 0, len(s.adapters))
	paths := map[string]string{}
	for a, p := range s.adapters {
		names = append(names, a)
		paths[a] = p
	}
	s.mu.Unlock()
	slices.Sort(names)
	created := s.epoch.Unix()
	data := []openai.Model{{ID: s.opts.ServedName, Object: "model", Created: created, OwnedBy: "vllm", Root: s.opts.Model, MaxModelLen: maxLen}}
	for _, a := range names {
		data = append(data, openai.Model{ID: a, Object: "model", Created: created, OwnedBy: "vllm", Root: paths[a], Parent: &s.opts.ServedName, MaxModelLen: maxLen})
	}
	writeJSON(w, http.StatusOK, openai.Models(data))
}

func (s *Server) handleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	if !allowPOST(w, r) || !s.readJSON(w, r, &req) {
		return
	}
	if req.Name == "" || req.Path == "" {
		openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, "both 'lora_name' and 'lora_path' must be provided.")
		return
	}
	s.mu.Lock()
	_, exists := s.adapters[req.Name]
	if !exists {
		s.adapters[req.Name] = req.Path
	}
	s.mu.Unlock()
	if exists {
		openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, fmt.Sprintf("The lora adapter '%s' has already been loaded.", req.Name))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
}

func (s *Server) handleUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"lora_name"`
	}
	if !allowPOST(w, r) || !s.readJSON(w, r, &req) {
		return
	}
	s.mu.Lock()
	_, exists := s.adapters[req.Name]
	delete(s.adapters, req.Name)
	s.mu.Unlock()
	if !exists {
		openai.WriteError(w, http.StatusNotFound, openai.TypeNotFound, fmt.Sprintf("The lora adapter '%s' cannot be found.", req.Name))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.Name)
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusOK)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		openai.WriteError(w, http.StatusInternalServerError, openai.TypeServer, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// sleepCtx waits d or until ctx ends, reporting whether the full time passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
