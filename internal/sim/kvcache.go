package sim

import (
	"encoding/binary"
	"maps"
	"slices"

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
//
// Every write goes through a setter so that a trial (Engine.FirstTokenIfSubmitted)
// can journal it and undo the lot afterwards.
type kvCache struct {
	refs   []int32
	hash   []uint64
	hashed []bool
	// Evictable blocks (refs == 0) form a doubly linked list, oldest first. Blocks
	// that were never hashed are kept apart in plain, whose order does not matter;
	// its capacity is the number of blocks, so appending never moves it.
	prev, next []int32
	head, tail int32
	evictable  int
	plain      []int32
	cached     map[uint64]int32

	// journal, while set, records in undo how to revert every write.
	journal bool
	undo    []kvUndo
	// The scalars as the journal began.
	head0, tail0 int32
	evictable0   int
	plainLen0    int
}

// kvUndo reverts one write: the old value v of element i of the array op names,
// or for the hash index, the entry for hash v (block i) to put back or drop.
type kvUndo struct {
	op uint8
	i  int32
	v  uint64
}

const (
	undoRefs uint8 = iota
	undoHash
	undoHashed
	undoPrev
	undoNext
	undoPlain
	undoCachedPut // an entry was deleted: put it back
	undoCachedDel // an entry was added: delete it
)

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

// clone is a deep copy, without a journal.
func (c *kvCache) clone() *kvCache {
	d := &kvCache{
		refs:      slices.Clone(c.refs),
		hash:      slices.Clone(c.hash),
		hashed:    slices.Clone(c.hashed),
		prev:      slices.Clone(c.prev),
		next:      slices.Clone(c.next),
		head:      c.head,
		tail:      c.tail,
		evictable: c.evictable,
		plain:     make([]int32, len(c.plain), cap(c.plain)),
		cached:    maps.Clone(c.cached),
	}
	copy(d.plain, c.plain)
	return d
}

// begin starts journaling writes.
func (c *kvCache) begin() {
	c.journal = true
	c.undo = c.undo[:0]
	c.head0, c.tail0, c.evictable0, c.plainLen0 = c.head, c.tail, c.evictable, len(c.plain)
}

// rollback undoes every write since begin and stops journaling.
func (c *kvCache) rollback() {
	for k := len(c.undo) - 1; k >= 0; k-- {
		u := c.undo[k]
		switch u.op {
		case undoRefs:
			c.refs[u.i] = int32(u.v)
		case undoHash:
			c.hash[u.i] = u.v
		case undoHashed:
			c.hashed[u.i] = u.v != 0
		case undoPrev:
			c.prev[u.i] = int32(u.v)
		case undoNext:
			c.next[u.i] = int32(u.v)
		case undoPlain:
			c.plain[:cap(c.plain)][u.i] = int32(u.v)
		case undoCachedPut:
			c.cached[u.v] = u.i
		case undoCachedDel:
			delete(c.cached, u.v)
		}
	}
	c.head, c.tail, c.evictable = c.head0, c.tail0, c.evictable0
	c.plain = c.plain[:c.plainLen0]
	c.journal = false
	c.undo = c.undo[:0]
}

func (c *kvCache) log(op uint8, i int32, old uint64) {
	c.undo = append(c.undo, kvUndo{op, i, old})
}

func (c *kvCache) setRefs(b, v int32) {
	if c.journal {
		c.log(undoRefs, b, uint64(c.refs[b]))
	}
	c.refs[b] = v
}

func (c *kvCache) setHashed(b int32, h uint64, hashed bool) {
	if c.journal {
		c.log(undoHash, b, c.hash[b])
		old := uint64(0)
		if c.hashed[b] {
			old = 1
		}
		c.log(undoHashed, b, old)
	}
	c.hash[b], c.hashed[b] = h, hashed
}

func (c *kvCache) setPrev(b, v int32) {
	if c.journal {
		c.log(undoPrev, b, uint64(c.prev[b]))
	}
	c.prev[b] = v
}

func (c *kvCache) setNext(b, v int32) {
	if c.journal {
		c.log(undoNext, b, uint64(c.next[b]))
	}
	c.next[b] = v
}

func (c *kvCache) pushPlain(b int32) {
	n := len(c.plain)
	if c.journal && n < c.plainLen0 {
		// Only slots the journal's start had in use need their value back.
		c.log(undoPlain, int32(n), uint64(c.plain[:n+1][n]))
	}
	c.plain = append(c.plain, b)
}

func (c *kvCache) cache(h uint64, b int32) {
	if c.journal {
		c.log(undoCachedDel, b, h)
	}
	c.cached[h] = b
}

func (c *kvCache) uncache(h uint64) {
	if c.journal {
		c.log(undoCachedPut, c.cached[h], h)
	}
	delete(c.cached, h)
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
		c.setRefs(b, 1)
		return b, true
	}
	if c.head == none {
		return 0, false
	}
	b := c.head
	c.unlink(b)
	c.uncache(c.hash[b])
	c.setHashed(b, c.hash[b], false)
	c.setRefs(b, 1)
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
	c.setRefs(b, c.refs[b]+1)
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
	c.setHashed(b, h, true)
	c.cache(h, b)
}

// release drops one reference to each block. Blocks are released last-first so that
// the tail of a sequence is evicted before its (more shareable) head.
func (c *kvCache) release(blocks []int32) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		c.setRefs(b, c.refs[b]-1)
		if c.refs[b] > 0 {
			continue
		}
		if c.hashed[b] {
			c.pushTail(b)
		} else {
			c.pushPlain(b)
		}
	}
}

func (c *kvCache) pushTail(b int32) {
	c.setPrev(b, c.tail)
	c.setNext(b, none)
	if c.tail != none {
		c.setNext(c.tail, b)
	} else {
		c.head = b
	}
	c.tail = b
	c.evictable++
}

func (c *kvCache) unlink(b int32) {
	if p := c.prev[b]; p != none {
		c.setNext(p, c.next[b])
	} else {
		c.head = c.next[b]
	}
	if n := c.next[b]; n != none {
		c.setPrev(n, c.prev[b])
	} else {
		c.tail = c.prev[b]
	}
	c.evictable--
}
