package sim

import (
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"time"
)

// Clone returns a deep copy of the engine: queues and running sequences (new Seq
// values, so the clone's sequences are not the ones the caller holds), the KV
// cache with its prefix index and eviction order, LoRA slots, the output-length
// generator's state, the clock and the counters. Stepping either never changes
// the other, and both go on to do exactly the same given the same calls. The
// request slices the sequences carry (Request.BlockHashes) are shared: the engine
// never writes them.
//
// A clone costs a copy of the whole KV cache (its size in blocks × 25 bytes and
// the prefix index). To ask one question of an engine's future, FirstTokenIfSubmitted
// is cheaper: it runs on the engine itself and undoes what it did.
func (e *Engine) Clone() *Engine {
	if e.tr.active {
		panic("sim: Clone during a trial")
	}
	c := *e
	c.kv = e.kv.clone()
	c.lora = e.lora.clone()
	pcg := *e.pcg
	c.pcg = &pcg
	c.rng = rand.New(c.pcg)
	c.stats.FinishedByReason = maps.Clone(e.stats.FinishedByReason)
	c.running = make([]*Seq, len(e.running), cap(e.running))
	for i, s := range e.running {
		c.running[i] = s.clone()
	}
	c.waiting = deque{items: make([]*Seq, 0, e.waiting.len())}
	e.waiting.each(func(s *Seq) { c.waiting.pushBack(s.clone()) })
	c.emitted, c.finished = nil, nil
	c.tr = trial{}
	return &c
}

// clone copies a sequence the engine holds. Its derived block identities are
// shared up to their length: the engine only ever appends to them, and the
// clipped copy appends elsewhere.
func (s *Seq) clone() *Seq {
	c := *s
	c.blocks = slices.Clone(s.blocks)
	c.derived = slices.Clip(s.derived)
	return &c
}

// errNoFirstToken would mean a submitted request can never be served; the
// engine's admission rules make it unreachable.
var errNoFirstToken = errors.New("sim: the engine went idle before the request's first token")

// FirstTokenIfSubmitted is the time to first token req would get if it arrived at
// at and nothing else arrived after it: what Fleet.Run would see routing req to
// this engine at that time (an idle engine first moves its clock to at; an
// engine mid-step takes the request when the step ends). The engine is left
// exactly as it was, though the question is answered by running it: every write
// is journaled and undone, which costs in proportion to the steps simulated
// rather than a copy of the engine (Clone). Fleet.Run's route and callbacks may
// call it (they run between steps; a StepResult already returned stays intact);
// nothing may call it concurrently with another method.
func (e *Engine) FirstTokenIfSubmitted(req Request, at time.Duration) (time.Duration, error) {
	e.begin()
	defer e.rollback()
	if !e.Busy() {
		e.AdvanceTo(at)
	}
	s, err := e.SubmitAt(req, at)
	if err != nil {
		return 0, err
	}
	for s.Generated == 0 {
		if !e.Busy() {
			return 0, errNoFirstToken
		}
		e.Step()
	}
	return s.FirstToken - s.Arrival, nil
}

// trial is the journal of FirstTokenIfSubmitted: the engine's state as the trial
// began, saved whole where it is small (clock, counters, queues, LoRA slots) and
// write by write where it is large (the KV cache, sequences as they are first
// touched). Its buffers are kept from one trial to the next.
type trial struct {
	active     bool
	n          uint64 // the trial's number, marking the sequences it saved
	now        time.Duration
	nextID     uint64
	pcg        rand.PCG
	stats      Stats
	finished   []reasonCount
	running    []*Seq
	waiting    []*Seq
	lora       loraSlots
	seqs       []savedSeq
	blocks     []int32 // the saved sequences' blocks, end to end
	scratch    [2][]*Seq
	emitted    []*Seq
	finishedTo []*Seq
}

type reasonCount struct {
	reason FinishReason
	n      int64
}

// savedSeq is a sequence as it was before the trial first changed it; its blocks
// are blocks[from:to] of the trial.
type savedSeq struct {
	s        *Seq
	v        Seq
	from, to int
}

// begin starts a trial.
func (e *Engine) begin() {
	t := &e.tr
	if t.active {
		panic("sim: nested trial")
	}
	t.active = true
	t.n++
	t.now, t.nextID, t.pcg, t.stats = e.now, e.nextID, *e.pcg, e.stats
	t.finished = t.finished[:0]
	for r, n := range e.stats.FinishedByReason {
		t.finished = append(t.finished, reasonCount{r, n})
	}
	t.running = append(t.running[:0], e.running...)
	t.waiting = t.waiting[:0]
	e.waiting.each(func(s *Seq) { t.waiting = append(t.waiting, s) })
	e.lora.saveTo(&t.lora)
	t.seqs, t.blocks = t.seqs[:0], t.blocks[:0]
	// A step's results stay readable across a trial: the trial steps into
	// scratch of its own.
	t.emitted, t.finishedTo = e.emitted, e.finished
	e.emitted, e.finished = t.scratch[0][:0], t.scratch[1][:0]
	e.kv.begin()
}

// touch saves s before the trial first changes it. Outside a trial it does
// nothing.
func (e *Engine) touch(s *Seq) {
	t := &e.tr
	if !t.active || s.trial == t.n {
		return
	}
	s.trial = t.n
	from := len(t.blocks)
	t.blocks = append(t.blocks, s.blocks...)
	t.seqs = append(t.seqs, savedSeq{s: s, v: *s, from: from, to: len(t.blocks)})
}

// rollback ends the trial, putting the engine back as begin found it.
func (e *Engine) rollback() {
	t := &e.tr
	e.kv.rollback()
	for i := len(t.seqs) - 1; i >= 0; i-- {
		sv := &t.seqs[i]
		blocks := append(sv.s.blocks[:0], t.blocks[sv.from:sv.to]...)
		*sv.s = sv.v
		sv.s.blocks = blocks
	}
	clear(t.seqs) // drop the references the buffer would keep alive
	e.now, e.nextID, *e.pcg, e.stats = t.now, t.nextID, t.pcg, t.stats
	clear(e.stats.FinishedByReason)
	for _, rc := range t.finished {
		e.stats.FinishedByReason[rc.reason] = rc.n
	}
	// Slices are restored by length; what the trial left past their ends (the
	// trial's own sequence, at most one per slot) is never read and is
	// overwritten by the next use, so it is not worth clearing.
	e.running = append(e.running[:0], t.running...)
	e.waiting.items = append(e.waiting.items[:0], t.waiting...)
	e.waiting.head = 0
	t.lora.saveTo(e.lora)
	t.scratch[0], t.scratch[1] = e.emitted[:0], e.finished[:0]
	e.emitted, e.finished = t.emitted, t.finishedTo
	t.emitted, t.finishedTo = nil, nil
	t.active = false
}
