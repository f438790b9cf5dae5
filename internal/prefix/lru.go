package prefix

// blockLRU is a bounded set of block hashes evicting the least recently used.
// It holds no pointers — a map of integers and a slice of index-linked nodes —
// so the garbage collector never traces it: with a thousand endpoints of 30,000
// blocks each, golang-lru's linked list made every collection trace 14 million
// objects (2.4 s of CPU; TestIndexGC measures it).
type blockLRU struct {
	slot  map[uint64]int32 // hash → node
	nodes []lruNode
	free  []int32 // unused nodes
	head  int32   // most recent; -1 when empty
	tail  int32   // least recent; -1 when empty
	cap   int
}

type lruNode struct {
	hash       uint64
	prev, next int32 // toward head, toward tail; -1 at the ends
}

func newBlockLRU(capacity int) *blockLRU {
	return &blockLRU{slot: map[uint64]int32{}, head: -1, tail: -1, cap: capacity}
}

func (l *blockLRU) len() int { return len(l.slot) }

func (l *blockLRU) contains(h uint64) bool {
	_, ok := l.slot[h]
	return ok
}

// touch makes h the most recent; false when h is not held.
func (l *blockLRU) touch(h uint64) bool {
	i, ok := l.slot[h]
	if !ok {
		return false
	}
	l.unlink(i)
	l.pushHead(i)
	return true
}

// add inserts h as the most recent, evicting the least recent blocks beyond the
// capacity through evict.
func (l *blockLRU) add(h uint64, evict func(uint64)) {
	var i int32
	if n := len(l.free); n > 0 {
		i, l.free = l.free[n-1], l.free[:n-1]
	} else {
		i = int32(len(l.nodes))
		l.nodes = append(l.nodes, lruNode{})
	}
	l.nodes[i].hash = h
	l.slot[h] = i
	l.pushHead(i)
	l.shrink(evict)
}

// resize changes the capacity, evicting what no longer fits.
func (l *blockLRU) resize(capacity int, evict func(uint64)) {
	l.cap = capacity
	l.shrink(evict)
}

func (l *blockLRU) shrink(evict func(uint64)) {
	for len(l.slot) > l.cap && l.tail >= 0 {
		i := l.tail
		h := l.nodes[i].hash
		l.unlink(i)
		delete(l.slot, h)
		l.free = append(l.free, i)
		evict(h)
	}
}

// each calls f for every held hash, most recent first.
func (l *blockLRU) each(f func(uint64)) {
	for i := l.head; i >= 0; i = l.nodes[i].next {
		f(l.nodes[i].hash)
	}
}

func (l *blockLRU) pushHead(i int32) {
	n := &l.nodes[i]
	n.prev, n.next = -1, l.head
	if l.head >= 0 {
		l.nodes[l.head].prev = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}

func (l *blockLRU) unlink(i int32) {
	n := l.nodes[i]
	if n.prev >= 0 {
		l.nodes[n.prev].next = n.next
	} else {
		l.head = n.next
	}
	if n.next >= 0 {
		l.nodes[n.next].prev = n.prev
	} else {
		l.tail = n.prev
	}
}
