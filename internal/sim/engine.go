// Package sim simulates an LLM inference engine (vLLM's V1 scheduler) in virtual
// time: iteration-level continuous batching under a token budget, chunked prefill,
// a paged KV cache with automatic prefix caching and preemption, and LoRA slots.
// The Engine owns no goroutines and reads no clock; whoever drives it (the HTTP
// front in wall time, the benchmark in virtual time) calls Step and honours the
// durations it returns.
package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Config describes one simulated model server.
type Config struct {
	GPU            string // h100, a100, l40s, a10g
	ModelSize      string // 8b, 32b, 70b
	TensorParallel int    // GPUs per replica; 0 means 1

	// MaxNumBatchedTokens is the token budget of one step and MaxNumSeqs the
	// running sequences at most; 0 takes vLLM's default for the GPU and usage
	// context (GPU.BatchDefaults: 8192 and 1024 on an H100, 2048 and 256 on the
	// others for the API server).
	MaxNumBatchedTokens int
	MaxNumSeqs          int
	// Offline takes the batch defaults of vLLM's LLM class (offline batch
	// inference, as benchmark_latency and benchmark_throughput run) instead of the
	// OpenAI API server's, which kvgate sim is.
	Offline              bool
	BlockSize            int     // tokens per KV block; 0 means 16
	GPUMemoryUtilization float64 // 0 means 0.9
	// MaxModelLen caps prompt + output tokens. 0 means the model's native length,
	// reduced to what the KV cache can hold as vLLM would require.
	MaxModelLen int
	// NumGPUBlocks overrides the KV capacity derived from memory (tests use it to
	// provoke exhaustion).
	NumGPUBlocks         int
	DisablePrefixCaching bool

	MaxLoRAs     int           // adapters resident at once; 0 means 1
	LoRALoadTime time.Duration // time to load an adapter into a slot; 0 means DefaultLoRALoadTime

	// OutputMedian is the median of the output length drawn when a request neither
	// ignores EOS nor is cut by max_tokens; 0 means 200 tokens.
	OutputMedian int
	Seed         uint64
}

// DefaultLoRALoadTime is the time to bring a rank-16 adapter from host memory into
// a GPU slot (vLLM loads synchronously inside the step that first needs it).
const DefaultLoRALoadTime = 25 * time.Millisecond

func (c Config) withDefaults(gpu GPU) Config {
	if c.TensorParallel == 0 {
		c.TensorParallel = 1
	}
	tokens, seqs := gpu.BatchDefaults(c.Offline)
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = tokens
	}
	if c.MaxNumSeqs == 0 {
		// vLLM caps a defaulted max_num_seqs at the token budget in force.
		c.MaxNumSeqs = min(seqs, c.MaxNumBatchedTokens)
	}
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.GPUMemoryUtilization == 0 {
		c.GPUMemoryUtilization = 0.9
	}
	if c.MaxLoRAs == 0 {
		c.MaxLoRAs = 1
	}
	if c.LoRALoadTime == 0 {
		c.LoRALoadTime = DefaultLoRALoadTime
	}
	if c.OutputMedian == 0 {
		c.OutputMedian = 200
	}
	return c
}

// Request is what a client asks of the engine, already tokenised.
type Request struct {
	PromptTokens int
	// BlockHashes are the chained hashes of the sequence's full blocks
	// (BlockHashes). Those of the prompt's full blocks are matched against the
	// prefix cache; any beyond them name the blocks the output fills (a replayed
	// conversation knows the answer its next turn quotes). Where they run out the
	// engine derives the output blocks' identities (Engine.SeqBlockHashes), as
	// vLLM V1 hashes every full block of prompt and output. Fewer hashes than the
	// prompt has full blocks (none, say) cache nothing past the last one given.
	BlockHashes []uint64
	MaxTokens   int // 0: up to the context length
	IgnoreEOS   bool
	// OutputTokens, when positive, fixes the output length (a replayed trace);
	// otherwise it is drawn from the engine's seeded distribution.
	OutputTokens int
	Adapter      string // LoRA adapter name, "" for the base model
	// Tag is the caller's, carried through untouched (a trace replay uses it to
	// find the request a finished sequence belongs to).
	Tag uint64
}

// FinishReason says why a sequence ended.
type FinishReason string

// Finish reasons, as vLLM reports them.
const (
	FinishStop   FinishReason = "stop"
	FinishLength FinishReason = "length"
	FinishAbort  FinishReason = "abort"
)

// ErrContextLength is returned by Submit when prompt and output cannot fit.
var ErrContextLength = errors.New("context length exceeded")

// Seq is one request inside the engine. Its fields are read by the driver between
// steps; only the engine writes them.
type Seq struct {
	ID  uint64
	Req Request

	Target       int // output tokens this sequence will produce
	Generated    int // output tokens produced so far
	CachedTokens int // prompt tokens served from the prefix cache at first admission
	Preemptions  int
	Finish       FinishReason // empty while running

	Arrival    time.Duration
	FirstToken time.Duration // 0 until the first token
	Done       time.Duration

	computed int     // tokens whose KV is in the cache
	blocks   []int32 // KV blocks held, in order
	// derived are the identities of full blocks past Req.BlockHashes, derived as
	// they are needed (blockHash); never rewritten once appended.
	derived  []uint64
	admitted bool // has ever been admitted (cached tokens counted)
	running  bool
	// scheduled is the number of tokens computed in the current step.
	scheduled int
	priorCtx  int
	// trial is the number of the last trial that saved this sequence (clone.go).
	trial uint64
}

// tokens is the context this sequence must have computed to sample its next token.
func (s *Seq) tokens() int { return s.Req.PromptTokens + s.Generated }

// Stats are the engine's monotonic counters, as vLLM exports them.
type Stats struct {
	PromptTokens      int64
	GenerationTokens  int64
	PrefixQueries     int64 // prompt tokens looked up in the prefix cache
	PrefixHits        int64 // of which found
	Preemptions       int64
	LoRALoads         int64
	FinishedByReason  map[FinishReason]int64
	Steps             int64
	BusyTime          time.Duration
	PrefillTokensDone int64
}

// StepResult describes one executed step.
type StepResult struct {
	Start, End time.Duration
	// Emitted are the sequences that produced a token in this step (including those
	// that finished with it). The slice is reused by the next Step.
	Emitted []*Seq
	// Finished are the sequences that ended in this step; also reused.
	Finished []*Seq
	Work     StepWork
	Idle     bool // nothing could run: the engine has no work
}

// Engine is one simulated model server in virtual time.
type Engine struct {
	cfg    Config
	hw     Hardware
	cost   CostModel
	maxLen int
	kv     *kvCache
	lora   *loraSlots
	pcg    *rand.PCG // rng's source, whose state Clone and trials copy
	rng    *rand.Rand

	now    time.Duration
	nextID uint64
	// slowdown multiplies every step's time from now on (SetSlowdown); 0 is 1.
	slowdown float64
	waiting  deque
	running  []*Seq
	stats    Stats

	emitted, finished []*Seq
	tr                trial // FirstTokenIfSubmitted's journal (clone.go)
}

// New builds an engine, or says why the deployment is impossible.
func New(cfg Config) (*Engine, error) {
	gpu, err := LookupGPU(cfg.GPU)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults(gpu)
	model, err := LookupModel(cfg.ModelSize)
	if err != nil {
		return nil, err
	}
	if cfg.TensorParallel < 1 || cfg.TensorParallel > 8 || cfg.TensorParallel&(cfg.TensorParallel-1) != 0 {
		return nil, fmt.Errorf("tensor parallel degree %d: must be 1, 2, 4 or 8", cfg.TensorParallel)
	}
	if cfg.MaxNumBatchedTokens < 1 || cfg.MaxNumSeqs < 1 || cfg.BlockSize < 1 || cfg.MaxLoRAs < 0 {
		return nil, fmt.Errorf("max_num_batched_tokens, max_num_seqs and block size must be positive")
	}
	if cfg.GPUMemoryUtilization <= 0 || cfg.GPUMemoryUtilization > 1 {
		return nil, fmt.Errorf("gpu memory utilisation %.2f: must be in (0, 1]", cfg.GPUMemoryUtilization)
	}
	hw := Hardware{GPU: gpu, Model: model, TensorParallel: cfg.TensorParallel, GPUMemoryUtilization: cfg.GPUMemoryUtilization}
	capTokens, err := hw.KVCapacityTokens()
	if err != nil {
		return nil, err
	}
	blocks := capTokens / cfg.BlockSize
	if cfg.NumGPUBlocks > 0 {
		blocks = cfg.NumGPUBlocks
	}
	maxLen := cfg.MaxModelLen
	switch {
	case maxLen == 0:
		maxLen = min(model.MaxModelLen, blocks*cfg.BlockSize)
	case maxLen > blocks*cfg.BlockSize:
		return nil, fmt.Errorf("max model len %d is larger than the %d tokens the KV cache can hold on %d x %s: lower it or add GPUs",
			maxLen, blocks*cfg.BlockSize, cfg.TensorParallel, gpu.Name)
	}
	pcg := rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)
	return &Engine{
		cfg:    cfg,
		hw:     hw,
		cost:   NewCostModel(hw),
		maxLen: maxLen,
		kv:     newKVCache(blocks),
		lora:   newLoRASlots(cfg.MaxLoRAs),
		pcg:    pcg,
		rng:    rand.New(pcg),
		stats:  Stats{FinishedByReason: map[FinishReason]int64{}},
	}, nil
}

// Config returns the configuration with defaults applied.
func (e *Engine) Config() Config { return e.cfg }

// Hardware returns the deployment the engine models.
func (e *Engine) Hardware() Hardware { return e.hw }

// CostModel returns the step cost model.
func (e *Engine) CostModel() CostModel { return e.cost }

// MaxModelLen is the longest prompt + output the engine accepts.
func (e *Engine) MaxModelLen() int { return e.maxLen }

// NumBlocks is the KV cache size in blocks.
func (e *Engine) NumBlocks() int { return e.kv.total() }

// Now is the engine's virtual time.
func (e *Engine) Now() time.Duration { return e.now }

// SetSlowdown makes every later step take f times as long (f ≤ 1 restores the
// calibrated speed): a GPU throttled or shared with a noisy neighbour.
func (e *Engine) SetSlowdown(f float64) { e.slowdown = f }

// Busy reports whether the engine has work to step.
func (e *Engine) Busy() bool { return e.waiting.len() > 0 || len(e.running) > 0 }

// AdvanceTo moves virtual time forward to t while the engine is idle; time never
// goes backward.
func (e *Engine) AdvanceTo(t time.Duration) {
	if t > e.now {
		e.now = t
	}
}

// Submit queues a request arriving at the current virtual time.
func (e *Engine) Submit(req Request) (*Seq, error) { return e.SubmitAt(req, e.now) }

// SubmitAt queues a request that arrived at virtual time at, which may lie inside the
// step in progress (at < Now): the request waits for that step to end, and its
// latencies count from at.
func (e *Engine) SubmitAt(req Request, at time.Duration) (*Seq, error) {
	if req.PromptTokens < 1 {
		return nil, fmt.Errorf("prompt must contain at least one token")
	}
	if req.MaxTokens < 0 {
		return nil, fmt.Errorf("max_tokens must be at least 1, got %d", req.MaxTokens)
	}
	room := e.maxLen - req.PromptTokens
	if room < 1 || req.MaxTokens > room {
		return nil, fmt.Errorf("%w: this model's maximum context length is %d tokens, but you requested %d tokens (%d in the prompt, %d for the completion)",
			ErrContextLength, e.maxLen, req.PromptTokens+max(req.MaxTokens, 0), req.PromptTokens, req.MaxTokens)
	}
	limit := room
	if req.MaxTokens > 0 {
		limit = req.MaxTokens
	}
	target := limit
	switch {
	case req.OutputTokens > 0:
		target = min(req.OutputTokens, limit)
	case !req.IgnoreEOS:
		target = min(e.drawOutputLen(), limit)
	}
	e.nextID++
	s := &Seq{ID: e.nextID, Req: req, Target: target, Arrival: min(at, e.now)}
	e.waiting.pushBack(s)
	return s, nil
}

// drawOutputLen draws from a log-normal around the configured median (σ = 0.8),
// the long-tailed shape of chat answer lengths.
func (e *Engine) drawOutputLen() int {
	n := float64(e.cfg.OutputMedian) * math.Exp(0.8*e.rng.NormFloat64())
	return max(1, int(n))
}

// Abort removes a sequence that the client gave up on, freeing its blocks.
func (e *Engine) Abort(s *Seq) {
	if s.Finish != "" {
		return
	}
	if s.running {
		for i, r := range e.running {
			if r == s {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
		e.lora.release(s.Req.Adapter)
		s.running = false
	} else {
		e.waiting.remove(s)
	}
	e.kv.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.Finish = FinishAbort
	s.Done = e.now
	e.stats.FinishedByReason[FinishAbort]++
}

// Step runs one iteration: schedule under the token budget, charge its duration
// from the cost model, advance virtual time and emit tokens.
func (e *Engine) Step() StepResult {
	e.emitted = e.emitted[:0]
	e.finished = e.finished[:0]
	if !e.Busy() {
		return StepResult{Start: e.now, End: e.now, Idle: true}
	}
	var work StepWork
	budget := e.cfg.MaxNumBatchedTokens
	var extra time.Duration
	preempted := false

	// Running sequences first, oldest first; make room by preempting the newest.
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		e.touch(s)
		n := min(s.tokens()-s.computed, budget)
		for !e.grow(s, n) {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				n = 0
				break
			}
		}
		if n == 0 {
			break
		}
		e.schedule(s, n, &work)
		budget -= n
	}

	// Then waiting ones, in arrival order, unless this step had to preempt.
	if !preempted {
		var skipped []*Seq
		for budget > 0 && len(e.running) < e.cfg.MaxNumSeqs && e.waiting.len() > 0 {
			s := e.waiting.popFront()
			e.touch(s)
			load, evicted, ok := e.lora.acquire(s.Req.Adapter)
			if !ok {
				skipped = append(skipped, s)
				// vLLM looks through the whole queue for a request whose adapter can
				// run; past a batch's worth of skips the simulation stops looking,
				// or a deep queue of blocked adapters costs it quadratic time.
				if len(skipped) >= e.cfg.MaxNumSeqs {
					break
				}
				continue
			}
			hits := e.matchPrefix(s)
			n := min(s.tokens()-s.computed, budget)
			if !e.grow(s, n) {
				// No room: undo the admission entirely, including the adapter slot.
				e.kv.release(s.blocks)
				s.blocks = s.blocks[:0]
				s.computed = 0
				e.lora.release(s.Req.Adapter)
				if load {
					e.lora.evict(s.Req.Adapter)
					e.lora.restore(evicted)
				}
				e.waiting.pushFront(s)
				break
			}
			if !s.admitted {
				// Counted once per request, as vLLM counts a lookup and its hits.
				s.admitted = true
				s.CachedTokens = hits
				e.stats.PrefixQueries += int64(s.Req.PromptTokens)
				e.stats.PrefixHits += int64(hits)
			}
			if load {
				extra += e.cfg.LoRALoadTime
				e.stats.LoRALoads++
			}
			s.running = true
			e.running = append(e.running, s)
			e.schedule(s, n, &work)
			budget -= n
		}
		for i := len(skipped) - 1; i >= 0; i-- {
			e.waiting.pushFront(skipped[i])
		}
	}

	start := e.now
	d := e.cost.StepTime(work) + extra
	if e.slowdown > 1 {
		d = time.Duration(float64(d) * e.slowdown)
	}
	e.now += d
	e.stats.Steps++
	e.stats.BusyTime += d
	e.finishStep()
	return StepResult{Start: start, End: e.now, Emitted: e.emitted, Finished: e.finished, Work: work}
}

// schedule records that n tokens of s are computed in this step.
func (e *Engine) schedule(s *Seq, n int, w *StepWork) {
	s.scheduled = n
	s.priorCtx = s.computed
	if s.tokens()-s.computed == 1 && s.Generated > 0 {
		w.DecodeSeqs++
		w.ContextTokens += int64(s.computed + 1)
		return
	}
	w.PrefillTokens += n
	w.AttnPairs += float64(n) * (float64(s.computed) + float64(n)/2)
}

// finishStep applies the step's computation: register the blocks it filled, emit a
// token for every sequence whose context is complete, retire finished ones.
func (e *Engine) finishStep() {
	kept := e.running[:0]
	for _, s := range e.running {
		n := s.scheduled
		if n == 0 {
			kept = append(kept, s)
			continue
		}
		s.scheduled = 0
		before := s.computed
		s.computed += n
		if s.tokens()-before > 1 || s.Generated == 0 {
			e.stats.PrefillTokensDone += int64(n)
		}
		if !e.cfg.DisablePrefixCaching {
			// Every block this step filled becomes cacheable, output blocks too.
			bs := e.cfg.BlockSize
			for b := before / bs; b < s.computed/bs; b++ {
				h, ok := e.blockHash(s, b)
				if !ok {
					break
				}
				e.kv.register(s.blocks[b], h)
			}
		}
		if s.computed < s.tokens() {
			kept = append(kept, s) // still prefilling
			continue
		}
		s.Generated++
		e.stats.GenerationTokens++
		if s.Generated == 1 && s.FirstToken == 0 {
			s.FirstToken = e.now
			e.stats.PromptTokens += int64(s.Req.PromptTokens)
		}
		e.emitted = append(e.emitted, s)
		if s.Generated < s.Target {
			kept = append(kept, s)
			continue
		}
		s.Finish = FinishStop
		if s.Target == s.Req.MaxTokens || s.Req.IgnoreEOS || s.Target == e.maxLen-s.Req.PromptTokens {
			s.Finish = FinishLength
		}
		s.Done = e.now
		s.running = false
		e.kv.release(s.blocks)
		s.blocks = s.blocks[:0]
		e.lora.release(s.Req.Adapter)
		e.stats.FinishedByReason[s.Finish]++
		e.finished = append(e.finished, s)
	}
	clear(e.running[len(kept):])
	e.running = kept
}

// matchPrefix gives a sequence that holds no blocks the longest run of cached full
// blocks of its context (the prompt, and the output so far for a preempted
// sequence), leaving at least one token to compute, and returns the number of
// tokens it covers.
func (e *Engine) matchPrefix(s *Seq) int {
	if e.cfg.DisablePrefixCaching || len(s.blocks) > 0 || s.computed > 0 {
		return 0
	}
	bs := e.cfg.BlockSize
	for i := 0; (i+1)*bs < s.tokens(); i++ {
		h, ok := e.blockHash(s, i)
		if !ok {
			break
		}
		b, ok := e.kv.lookup(h)
		if !ok {
			break
		}
		s.blocks = append(s.blocks, b)
	}
	s.computed = len(s.blocks) * bs
	return s.computed
}

// blockHash is the identity of full block i of s: the caller's while
// Req.BlockHashes lasts, then derived from the previous block's identity, the
// sequence and the block's index. ok is false past a prompt whose full blocks
// were not all named: the chain of identities is broken there.
func (e *Engine) blockHash(s *Seq, i int) (uint64, bool) {
	n := len(s.Req.BlockHashes)
	if i < n {
		return s.Req.BlockHashes[i], true
	}
	if n < s.Req.PromptTokens/e.cfg.BlockSize {
		return 0, false
	}
	for j := n + len(s.derived); j <= i; j++ {
		var parent uint64
		switch {
		case j > n:
			parent = s.derived[j-n-1]
		case n > 0:
			parent = s.Req.BlockHashes[n-1]
		}
		s.derived = append(s.derived, derivedBlockHash(parent, s.ID, s.Req.Tag, j))
	}
	return s.derived[i-n], true
}

// SeqBlockHashes appends to dst the identities of the full blocks of s's context
// so far (prompt and generated tokens), as the engine caches them: a driver that
// continues the conversation starts its next prompt's BlockHashes with them, and
// the next turn hits the blocks this one's answer filled. It stops at the last
// hash given when the request did not name all of its prompt's blocks.
func (e *Engine) SeqBlockHashes(s *Seq, dst []uint64) []uint64 {
	for i := range s.tokens() / e.cfg.BlockSize {
		h, ok := e.blockHash(s, i)
		if !ok {
			break
		}
		dst = append(dst, h)
	}
	return dst
}

// grow makes sure s holds blocks for computed+n tokens.
func (e *Engine) grow(s *Seq, n int) bool {
	need := (s.computed+n+e.cfg.BlockSize-1)/e.cfg.BlockSize - len(s.blocks)
	if need <= 0 {
		return true
	}
	if need > e.kv.free() {
		return false
	}
	for range need {
		b, _ := e.kv.alloc()
		s.blocks = append(s.blocks, b)
	}
	return true
}

// preempt frees a running sequence's blocks and puts it back at the head of the
// queue; it will recompute prompt and generated tokens (vLLM's recompute mode).
func (e *Engine) preempt(s *Seq) {
	e.touch(s)
	e.kv.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.computed = 0
	s.scheduled = 0
	s.running = false
	s.Preemptions++
	e.stats.Preemptions++
	e.lora.release(s.Req.Adapter)
	e.waiting.pushFront(s)
}

// Snapshot is the engine's state as its metrics endpoint shows it.
type Snapshot struct {
	Now             time.Duration
	Waiting         int
	Running         int
	KVUsage         float64
	NumBlocks       int
	BlockSize       int
	MaxLoRAs        int
	RunningAdapters []string
	WaitingAdapters []string
	Stats           Stats
}

// Gauges are the engine's instantaneous load, as a metrics scrape reads it.
type Gauges struct {
	Waiting, Running int
	KVUsage          float64
	// Adapters are filled only when withAdapters is asked for: listing them costs
	// allocations a scrape of an engine without LoRA need not pay.
	RunningAdapters, WaitingAdapters []string
}

// Gauges reads the engine's load without copying its counters.
func (e *Engine) Gauges(withAdapters bool) Gauges {
	g := Gauges{Waiting: e.waiting.len(), Running: len(e.running), KVUsage: e.kv.usage()}
	if withAdapters {
		g.RunningAdapters = e.lora.running()
		seen := map[string]bool{}
		e.waiting.each(func(s *Seq) {
			if a := s.Req.Adapter; a != "" && !seen[a] {
				seen[a] = true
				g.WaitingAdapters = append(g.WaitingAdapters, a)
			}
		})
		slices.Sort(g.WaitingAdapters)
	}
	return g
}

// Snapshot reads the engine's current state.
func (e *Engine) Snapshot() Snapshot {
	st := e.stats
	st.FinishedByReason = make(map[FinishReason]int64, len(e.stats.FinishedByReason))
	for k, v := range e.stats.FinishedByReason {
		st.FinishedByReason[k] = v
	}
	var wa []string
	waiting := map[string]bool{}
	e.waiting.each(func(s *Seq) {
		if a := s.Req.Adapter; a != "" && !waiting[a] {
			waiting[a] = true
			wa = append(wa, a)
		}
	})
	slices.Sort(wa)
	ra := e.lora.running()
	return Snapshot{
		Now: e.now, Waiting: e.waiting.len(), Running: len(e.running), KVUsage: e.kv.usage(),
		NumBlocks: e.kv.total(), BlockSize: e.cfg.BlockSize, MaxLoRAs: e.cfg.MaxLoRAs,
		RunningAdapters: ra, WaitingAdapters: wa, Stats: st,
	}
}

// ResidentAdapters lists the adapters currently loaded in GPU slots, most recently
// used last.
func (e *Engine) ResidentAdapters() []string { return e.lora.resident() }

// CachedPrefixTokens reports how many leading tokens of a prompt with these block
// hashes are in the prefix cache now, without changing the cache.
func (e *Engine) CachedPrefixTokens(hashes []uint64) int {
	n := 0
	for _, h := range hashes {
		if !e.kv.contains(h) {
			break
		}
		n++
	}
	return n * e.cfg.BlockSize
}
