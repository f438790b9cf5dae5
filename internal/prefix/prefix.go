// Package prefix is the approximate prefix-cache index: a prompt is cut into
// fixed-size character blocks hashed in a chain, and each endpoint remembers the
// block hashes of the requests routed to it, so the picker can send a request to
// the endpoint most likely to hold its prefix in KV cache.
package prefix

import (
	"encoding/binary"
	"sync"

	"github.com/cespare/xxhash/v2"
	lru "github.com/hashicorp/golang-lru/v2"
)

// Defaults: 64 characters are about 16 tokens, vLLM's block; at most 256 blocks are
// matched; an endpoint whose block count is unknown remembers 31,250 blocks.
const (
	DefaultBlockChars = 64
	DefaultMaxBlocks  = 256
	DefaultCapacity   = 31_250
)

// Seed derives the chain's seed from what separates caches: the model and the
// LoRA adapter.
func Seed(model, adapter string) uint64 {
	return xxhash.Sum64String(model + "\x00" + adapter)
}

// Hashes returns the chained hashes of the full blocks of text, at most maxBlocks:
// h_i = xxh64(h_{i-1} ‖ block_i), h_{-1} = seed.
func Hashes(text string, blockChars, maxBlocks int, seed uint64) []uint64 {
	n := min(len(text)/blockChars, maxBlocks)
	out := make([]uint64, 0, n)
	var d xxhash.Digest
	var prev [8]byte
	h := seed
	for i := range n {
		d.Reset()
		binary.LittleEndian.PutUint64(prev[:], h)
		_, _ = d.Write(prev[:])
		_, _ = d.WriteString(text[i*blockChars : (i+1)*blockChars])
		h = d.Sum64()
		out = append(out, h)
	}
	return out
}

// Index remembers, per endpoint, the block hashes routed to it, each endpoint in an
// LRU bounded by its KV-cache size in blocks.
type Index struct {
	mu  sync.Mutex
	per map[string]*lru.Cache[uint64, struct{}]
}

// New returns an empty index.
func New() *Index {
	return &Index{per: map[string]*lru.Cache[uint64, struct{}]{}}
}

// Match returns how many leading blocks of hashes the endpoint is believed to hold.
func (x *Index) Match(addr string, hashes []uint64) int {
	x.mu.Lock()
	c := x.per[addr]
	x.mu.Unlock()
	if c == nil {
		return 0
	}
	n := 0
	for _, h := range hashes {
		if !c.Contains(h) {
			break
		}
		n++
	}
	return n
}

// Record notes that a request with these block hashes was routed to addr, whose
// KV cache holds capacity blocks (0: DefaultCapacity). A changed capacity resizes
// the endpoint's memory.
func (x *Index) Record(addr string, hashes []uint64, capacity int) {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	x.mu.Lock()
	c := x.per[addr]
	if c == nil {
		c, _ = lru.New[uint64, struct{}](capacity)
		x.per[addr] = c
	}
	x.mu.Unlock()
	c.Resize(capacity)
	for _, h := range hashes {
		c.Add(h, struct{}{})
	}
}

// Forget drops an endpoint that left the pool.
func (x *Index) Forget(addr string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.per, addr)
}

// Entries is the number of block hashes held across endpoints; each costs about
// 100 bytes in the LRU.
func (x *Index) Entries() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := 0
	for _, c := range x.per {
		n += c.Len()
	}
	return n
}
