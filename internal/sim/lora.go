package sim

import (
	"maps"
	"slices"
)

// loraSlots models vLLM's GPU LoRA slots: at most max adapters are resident, an
// adapter in use by a running sequence cannot be evicted, an idle one is evicted
// least recently used first when another needs its slot.
type loraSlots struct {
	max   int
	order []string       // resident adapters, least recently used first
	users map[string]int // running sequences per resident adapter
}

func newLoRASlots(max int) *loraSlots {
	return &loraSlots{max: max, users: map[string]int{}}
}

// acquire takes a slot for adapter on behalf of a sequence about to run. load says
// the adapter had to be brought in (the step pays the load time) and evicted names
// the idle adapter it displaced, if any; ok is false when every slot is held by an
// adapter with running sequences.
func (l *loraSlots) acquire(adapter string) (load bool, evicted string, ok bool) {
	if adapter == "" {
		return false, "", true
	}
	if i := slices.Index(l.order, adapter); i >= 0 {
		l.touch(i)
		l.users[adapter]++
		return false, "", true
	}
	if len(l.order) >= l.max {
		victim := -1
		for i, a := range l.order {
			if l.users[a] == 0 {
				victim = i
				break
			}
		}
		if victim < 0 {
			return false, "", false
		}
		evicted = l.order[victim]
		delete(l.users, evicted)
		l.order = slices.Delete(l.order, victim, victim+1)
	}
	l.order = append(l.order, adapter)
	l.users[adapter] = 1
	return true, evicted, true
}

// restore puts back, as least recently used, an adapter that acquire displaced for a
// sequence that then could not start.
func (l *loraSlots) restore(adapter string) {
	if adapter == "" || len(l.order) >= l.max || slices.Contains(l.order, adapter) {
		return
	}
	l.order = slices.Insert(l.order, 0, adapter)
	l.users[adapter] = 0
}

// release returns the slot use of a sequence that stopped running.
func (l *loraSlots) release(adapter string) {
	if adapter == "" {
		return
	}
	if l.users[adapter] > 0 {
		l.users[adapter]--
	}
}

// evict drops an adapter that was loaded for a sequence that then could not start.
func (l *loraSlots) evict(adapter string) {
	if i := slices.Index(l.order, adapter); i >= 0 && l.users[adapter] == 0 {
		delete(l.users, adapter)
		l.order = slices.Delete(l.order, i, i+1)
	}
}

func (l *loraSlots) touch(i int) {
	a := l.order[i]
	copy(l.order[i:], l.order[i+1:])
	l.order[len(l.order)-1] = a
}

func (l *loraSlots) resident() []string { return slices.Clone(l.order) }

// running lists the adapters with running sequences, sorted, so that the same
// state always reads the same.
func (l *loraSlots) running() []string {
	var out []string
	for _, a := range l.order {
		if l.users[a] > 0 {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

// clone is a deep copy.
func (l *loraSlots) clone() *loraSlots {
	return &loraSlots{max: l.max, order: slices.Clone(l.order), users: maps.Clone(l.users)}
}

// saveTo copies the slots' state into d, reusing d's storage.
func (l *loraSlots) saveTo(d *loraSlots) {
	d.max = l.max
	d.order = append(d.order[:0], l.order...)
	if d.users == nil {
		d.users = map[string]int{}
	}
	clear(d.users)
	maps.Copy(d.users, l.users)
}
