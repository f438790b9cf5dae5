// Package prefix is the approximate prefix-cache index: a prompt is cut into
// fixed-size character blocks hashed in a chain, and each endpoint remembers the
// block hashes of the requests routed to it, so the picker can send a request to
// the endpoint most likely to hold its prefix in KV cache.
package prefix

import (
	"encoding/binary"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// Defaults: 64 characters are about 16 tokens, vLLM's block; at most 256 blocks are
// matched; an endpoint whose block count is unknown remembers 31,250 blocks.
const (
	DefaultBlockChars = 64
	DefaultMaxBlocks  = 256
	DefaultCapacity   = 31_250
)

// EntryBytes is the measured heap cost of one remembered block
// (BenchmarkIndexMemory), used to report the index's memory.
const EntryBytes = 77

// Seed derives the chain's seed from what separates caches: the model and the
// LoRA adapter.
func Seed(model, adapter string) uint64 {
	return xxhash.Sum64String(model + "\x00" + adapter)
}

// Hashes appends to dst the chained hashes of the full blocks of text, at most
// maxBlocks: h_i = xxh64(h_{i-1} ‖ block_i), h_{-1} = seed.
func Hashes(dst []uint64, text []byte, blockChars, maxBlocks int, seed uint64) []uint64 {
	n := min(len(text)/blockChars, maxBlocks)
	var d xxhash.Digest
	var prev [8]byte
	h := seed
	for i := range n {
		d.Reset()
		binary.LittleEndian.PutUint64(prev[:], h)
		_, _ = d.Write(prev[:])
		_, _ = d.Write(text[i*blockChars : (i+1)*blockChars])
		h = d.Sum64()
		dst = append(dst, h)
	}
	return dst
}

// Index remembers, per endpoint, the block hashes routed to it, each endpoint in an
// LRU bounded by its KV-cache size in blocks. A reverse map from block to the
// endpoints holding it makes a match cost one lookup per matched block, however
// many endpoints there are.
type Index struct {
	mu sync.RWMutex
	// holders maps a block hash to the first endpoints holding it (id+1, 0 when
	// empty), pointer-free so the collector skips it; more holds the rest for the
	// few blocks (widely shared system prompts) that more endpoints hold.
	holders map[uint64]holderSet
	more    map[uint64][]int32
	byAddr  map[string]*member
	byID    []*member // nil where an id is free
	free    []int32
	scratch sync.Pool // []int32 by id: candidate position + 1
}

type member struct {
	id    int32
	lru   *blockLRU
	evict func(uint64) // drops this member from a block's holders
}

// New returns an empty index.
func New() *Index {
	return &Index{holders: map[uint64]holderSet{}, more: map[uint64][]int32{}, byAddr: map[string]*member{}}
}

// holderSet holds up to four endpoint ids inline, packed to the front; a full set
// may have more in Index.more.
type holderSet [4]int32

func (s holderSet) full() bool { return s[len(s)-1] != 0 }

// each calls f with every endpoint id holding h.
func (x *Index) each(h uint64, f func(int32)) {
	hs, ok := x.holders[h]
	if !ok {
		return
	}
	for _, v := range hs {
		if v != 0 {
			f(v - 1)
		}
	}
	if hs.full() {
		for _, id := range x.more[h] {
			f(id)
		}
	}
}

// hold adds id to the holders of h.
func (x *Index) hold(h uint64, id int32) {
	hs := x.holders[h]
	if i := slices.Index(hs[:], 0); i >= 0 {
		hs[i] = id + 1
		x.holders[h] = hs
		return
	}
	x.more[h] = append(x.more[h], id)
}

// Match sets out[i] to how many leading blocks of hashes addrs[i] is believed to
// hold. out must be as long as addrs.
func (x *Index) Match(hashes []uint64, addrs []string, out []int) {
	clear(out)
	if len(hashes) == 0 {
		return
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	pos := x.positions(addrs)
	defer x.scratch.Put(pos)
	// out[c] == i means candidate c held blocks 0..i-1; a holder of block i extends
	// its run only if it held every earlier one.
	p := *pos
	for i, h := range hashes {
		hs, ok := x.holders[h]
		if !ok {
			return
		}
		grew := false
		for _, v := range hs {
			if v != 0 {
				if c := p[v-1] - 1; c >= 0 && out[c] == i {
					out[c]++
					grew = true
				}
			}
		}
		if hs.full() {
			for _, id := range x.more[h] {
				if c := p[id] - 1; c >= 0 && out[c] == i {
					out[c]++
					grew = true
				}
			}
		}
		if !grew {
			return
		}
	}
}

// positions maps member ids to 1 + the candidate's index in addrs; the caller
// holds the read lock and returns the slice to the pool.
func (x *Index) positions(addrs []string) *[]int32 {
	p, _ := x.scratch.Get().(*[]int32)
	if p == nil {
		p = new([]int32)
	}
	if cap(*p) < len(x.byID) {
		*p = make([]int32, len(x.byID))
	}
	*p = (*p)[:len(x.byID)]
	clear(*p)
	for i, a := range addrs {
		if m := x.byAddr[a]; m != nil {
			(*p)[m.id] = int32(i + 1)
		}
	}
	return p
}

// Record notes that a request with these block hashes was routed to addr, whose
// KV cache holds capacity blocks (0: DefaultCapacity). A changed capacity resizes
// the endpoint's memory.
func (x *Index) Record(addr string, hashes []uint64, capacity int) {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	m := x.byAddr[addr]
	if m == nil {
		m = x.add(addr, capacity)
	} else if capacity != m.lru.cap {
		m.lru.resize(capacity, m.evict)
	}
	// Tail first: a model server evicts a sequence's last blocks first, and the
	// head of a prompt is what other requests share.
	for _, h := range slices.Backward(hashes) {
		if m.lru.touch(h) {
			continue
		}
		// Held before the LRU may evict: a block evicted by its own insertion (a
		// capacity below the prompt) is dropped again consistently.
		x.hold(h, m.id)
		m.lru.add(h, m.evict)
	}
}

func (x *Index) add(addr string, capacity int) *member {
	m := &member{}
	if n := len(x.free); n > 0 {
		m.id = x.free[n-1]
		x.free = x.free[:n-1]
		x.byID[m.id] = m
	} else {
		m.id = int32(len(x.byID))
		x.byID = append(x.byID, m)
	}
	m.lru = newBlockLRU(capacity)
	m.evict = func(h uint64) { x.drop(h, m.id) }
	x.byAddr[addr] = m
	return m
}

// drop removes id from the holders of h; the caller holds the lock.
func (x *Index) drop(h uint64, id int32) {
	hs, ok := x.holders[h]
	if !ok {
		return
	}
	more := x.more[h]
	if i := slices.Index(hs[:], id+1); i >= 0 {
		// Keep the inline set packed, refilled from the overflow.
		copy(hs[i:], hs[i+1:])
		hs[len(hs)-1] = 0
		if n := len(more); n > 0 {
			hs[len(hs)-1], more = more[n-1]+1, more[:n-1]
		}
	} else if i := slices.Index(more, id); i >= 0 {
		more = slices.Delete(more, i, i+1)
	}
	if len(more) == 0 {
		delete(x.more, h)
	} else {
		x.more[h] = more
	}
	if hs[0] == 0 {
		delete(x.holders, h)
	} else {
		x.holders[h] = hs
	}
}

// Forget drops an endpoint that left the pool, with everything it held.
func (x *Index) Forget(addr string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	m := x.byAddr[addr]
	if m == nil {
		return
	}
	m.lru.each(func(h uint64) { x.drop(h, m.id) })
	delete(x.byAddr, addr)
	x.byID[m.id] = nil
	x.free = append(x.free, m.id)
}

// Entries is the number of block hashes held across endpoints.
func (x *Index) Entries() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := 0
	for _, m := range x.byAddr {
		n += m.lru.len()
	}
	return n
}

// EntriesOf is the number of block hashes held for one endpoint.
func (x *Index) EntriesOf(addr string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if m := x.byAddr[addr]; m != nil {
		return m.lru.len()
	}
	return 0
}
