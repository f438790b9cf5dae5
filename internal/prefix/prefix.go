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
	"github.com/hashicorp/golang-lru/v2/simplelru"
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
const EntryBytes = 150

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
	mu      sync.RWMutex
	holders map[uint64][]int32 // block hash → ids of the endpoints holding it
	byAddr  map[string]*member
	byID    []*member // nil where an id is free
	free    []int32
	scratch sync.Pool // []int32 by id: candidate position + 1
}

type member struct {
	id  int32
	lru *simplelru.LRU[uint64, struct{}]
}

// New returns an empty index.
func New() *Index {
	return &Index{holders: map[uint64][]int32{}, byAddr: map[string]*member{}}
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
	for i, h := range hashes {
		grew := false
		for _, id := range x.holders[h] {
			if c := (*pos)[id] - 1; c >= 0 && out[c] == i {
				out[c]++
				grew = true
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
	} else {
		m.lru.Resize(capacity)
	}
	// Tail first: a model server evicts a sequence's last blocks first, and the
	// head of a prompt is what other requests share.
	for _, h := range slices.Backward(hashes) {
		if m.lru.Contains(h) {
			m.lru.Get(h)
			continue
		}
		m.lru.Add(h, struct{}{})
		x.holders[h] = append(x.holders[h], m.id)
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
	m.lru, _ = simplelru.NewLRU(capacity, func(h uint64, _ struct{}) { x.drop(h, m.id) })
	x.byAddr[addr] = m
	return m
}

// drop removes id from the holders of h; the caller holds the lock.
func (x *Index) drop(h uint64, id int32) {
	ids := x.holders[h]
	if i := slices.Index(ids, id); i >= 0 {
		ids = slices.Delete(ids, i, i+1)
	}
	if len(ids) == 0 {
		delete(x.holders, h)
	} else {
		x.holders[h] = ids
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
	for _, h := range m.lru.Keys() {
		x.drop(h, m.id)
	}
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
		n += m.lru.Len()
	}
	return n
}

// EntriesOf is the number of block hashes held for one endpoint.
func (x *Index) EntriesOf(addr string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if m := x.byAddr[addr]; m != nil {
		return m.lru.Len()
	}
	return 0
}

// Bytes estimates the index's heap size.
func (x *Index) Bytes() int { return x.Entries() * EntryBytes }
