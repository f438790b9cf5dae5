package sim

// deque is the waiting queue: arrivals at the back, preempted and skipped
// sequences back at the front, both O(1) amortised.
type deque struct {
	items []*Seq
	head  int
}

func (d *deque) len() int { return len(d.items) - d.head }

func (d *deque) pushBack(s *Seq) { d.items = append(d.items, s) }

func (d *deque) pushFront(s *Seq) {
	if d.head == 0 {
		// Leave room in front proportional to the queue so repeated pushes stay cheap.
		gap := max(8, d.len())
		// Sized from the length, not the capacity: a capacity carried over would
		// compound each time the queue is compacted and refilled.
		grown := make([]*Seq, gap+len(d.items))
		copy(grown[gap:], d.items)
		d.items = grown
		d.head = gap
	}
	d.head--
	d.items[d.head] = s
}

func (d *deque) popFront() *Seq {
	s := d.items[d.head]
	d.items[d.head] = nil
	d.head++
	if d.head == len(d.items) {
		d.items = d.items[:0]
		d.head = 0
	} else if d.head > 1024 && d.head > len(d.items)/2 {
		n := copy(d.items, d.items[d.head:])
		clear(d.items[n:])
		d.items = d.items[:n]
		d.head = 0
	}
	return s
}

func (d *deque) remove(s *Seq) {
	for i := d.head; i < len(d.items); i++ {
		if d.items[i] == s {
			copy(d.items[i:], d.items[i+1:])
			d.items[len(d.items)-1] = nil
			d.items = d.items[:len(d.items)-1]
			return
		}
	}
}

func (d *deque) each(f func(*Seq)) {
	for _, s := range d.items[d.head:] {
		f(s)
	}
}
