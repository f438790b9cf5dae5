package sim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockSize is vLLM's KV block size in tokens.
const DefaultBlockSize = 16

// BlockHashes returns the chained hashes of the full blocks of tokens:
// h_i = xxh64(h_{i-1} ‖ ids of block i), with h_{-1} = seed. The seed carries what
// must separate caches (model, LoRA adapter), as vLLM's extra keys do.
func BlockHashes(dst []uint64, tokens []uint32, blockSize int, seed uint64) []uint64 {
	buf := make([]byte, 8+4*blockSize)
	parent := seed
	for start := 0; start+blockSize <= len(tokens); start += blockSize {
		binary.LittleEndian.PutUint64(buf, parent)
		for i, t := range tokens[start : start+blockSize] {
			binary.LittleEndian.PutUint32(buf[8+4*i:], t)
		}
		parent = xxhash.Sum64(buf)
		dst = append(dst, parent)
	}
	return dst
}

// derivedBlockHash names full block i of sequence seq (tag is the caller's) whose
// tokens the workload gave no identity, chained from the previous block's: unique
// to the sequence, since no two sequences generate the same tokens.
func derivedBlockHash(parent, seq, tag uint64, i int) uint64 {
	var buf [32]byte
	binary.LittleEndian.PutUint64(buf[0:], parent)
	binary.LittleEndian.PutUint64(buf[8:], seq)
	binary.LittleEndian.PutUint64(buf[16:], tag)
	binary.LittleEndian.PutUint64(buf[24:], uint64(i))
	return xxhash.Sum64(buf[:])
}

// HashSeed derives a block-hash seed from the names that separate prefix caches.
func HashSeed(model, adapter string) uint64 {
	return xxhash.Sum64String(model + "\x00" + adapter)
}

// kvCache is a paged KV cache with automatic prefix caching, as in vLLM: blocks are
// reference counted; a full block is registered under its chained hash; a
// block nobody references stays cached and becomes evictable in LRU order.
type kvCache struct {
	refs   []int32
	hash   []uint64
	hashed []bool
	// Evictable blocks (refs == 0) form a doubly linked list, oldest first. Blocks
	// that were never hashed are kept apart in plain, whose order does not matter.
	prev, next []int32
	head, tail int32
	evictable  int
	plain      []int32
	cached     map[uint64]int32
}

const none = -1

func newKVCache(blocks int) *kvCache {
	c := &kvCache{
		refs:   make([]int32, blocks),
		hash:   make([]uint64, blocks),
		hashed: make([]bool, blocks),
		prev:   make([]int32, blocks),
		next:   make([]int32, blocks),
		head:   none,
		tail:   none,
		plain:  make([]int32, blocks),
		cached: make(map[uint64]int32),
	}
	for i := range c.plain {
		c.plain[i] = int32(blocks - 1 - i)
	}
	return c
}

func (c *kvCache) total() int { return len(c.refs) }

// free counts blocks that can be handed out: never used, or cached but unreferenced.
func (c *kvCache) free() int { return len(c.plain) + c.evictable }

// usage is the share of blocks referenced by running sequences, vLLM's
// kv_cache_usage_perc: cached but unreferenced blocks count as free.
func (c *kvCache) usage() float64 { return 1 - float64(c.free())/float64(c.total()) }

// alloc hands out one block, preferring never-hashed ones so cached prefixes
// survive as long as possible, then evicting the least recently freed cached block.
func (c *kvCache) alloc() (int32, bool) {
	if n := len(c.plain); n > 0 {
		b := c.plain[n-1]
		c.plain = c.plain[:n-1]
		c.refs[b] = 1
		return b, true
	}
	if c.head == none {
		return 0, false
	}
	b := c.head
	c.unlink(b)
	delete(c.cached, c.hash[b])
	c.hashed[b] = false
	c.refs[b] = 1
	return b, true
}

// lookup returns the cached block holding hash h and takes a reference to it.
func (c *kvCache) lookup(h uint64) (int32, bool) {
	b, ok := c.cached[h]
	if !ok {
		return 0, false
	}
	if c.refs[b] == 0 {
		c.unlink(b)
	}
	c.refs[b]++
	return b, true
}

// contains reports whether h is cached, without touching LRU order.
func (c *kvCache) contains(h uint64) bool {
	_, ok := c.cached[h]
	return ok
}

// register records that block b holds the tokens whose chained hash is h. A hash
// already cached elsewhere keeps its first block; b then stays anonymous.
func (c *kvCache) register(b int32, h uint64) {
	if c.hashed[b] {
		return
	}
	if _, dup := c.cached[h]; dup {
		return
	}
	c.hash[b] = h
	c.hashed[b] = true
	c.cached[h] = b
}

// release drops one reference to each block. Blocks are released last-first so that
// the tail of a sequence is evicted before its (more shareable) head.
func (c *kvCache) release(blocks []int32) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		c.refs[b]--
		if c.refs[b] > 0 {
			continue
		}
		if c.hashed[b] {
			c.pushTail(b)
		} else {
			c.plain = append(c.plain, b)
		}
	}
}

func (c *kvCache) pushTail(b int32) {
	c.prev[b], c.next[b] = c.tail, none
	if c.tail != none {
		c.next[c.tail] = b
	} else {
		c.head = b
	}
	c.tail = b
	c.evictable++
}

func (c *kvCache) unlink(b int32) {
	if p := c.prev[b]; p != none {
		c.next[p] = c.next[b]
	} else {
		c.head = c.next[b]
	}
	if n := c.next[b]; n != none {
		c.prev[n] = c.prev[b]
	} else {
		c.tail = c.prev[b]
	}
	c.evictable--
}
