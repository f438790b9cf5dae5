package peers

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
)

// A message is one replica's batch of events, as one stream entry:
//
//	"KVG" version(1) cluster(8, FNV-1a of the identity) replica(string)
//	instance(8, random per start) sent(varint, unix ns) flags(1: the loads
//	are all the sender's) count(uvarint) records...
//	decision: 'd' endpoint(string) capacity(uvarint) n(uvarint) hashes(8 bytes each)
//	load:     'l' endpoint(string) 8 uvarints (fleet.Load's fields, then in flight)
//	scrape:   's' endpoint(string) started(varint, unix ns, the sender's clock) flags(1: failed, 2: unreachable)
//	          error(string) dialect(string) metrics(uvarint length, JSON of engine.Metrics)
//	ejection: 'x' endpoint(string) until(varint, unix ns, the sender's clock)
//	answer:   'a' endpoint(string) kind(1: first token, 2: step) 5 float64s
//	          (own prompt tokens, prefill ahead, running, adapter loads, seconds)
//
// Strings are a uvarint length then bytes. A block's hashes go once per
// decision, not one message per block.
const (
	magic   = "KVG"
	version = 2

	kindDecision = 'd'
	kindLoad     = 'l'
	kindScrape   = 's'
	kindEjection = 'x'
	kindAnswer   = 'a'

	// maxMetrics bounds a scrape's metrics.
	maxMetrics = 64 << 10

	// maxString bounds an endpoint address or replica id; maxHashes a
	// decision's blocks; maxRecords a message's events.
	maxString  = 256
	maxHashes  = 1 << 14
	maxRecords = 1 << 16
)

// Decision is a routing decision that feeds the prefix index: the prompt's
// block hashes went to Endpoint, whose index holds at most Capacity blocks.
type Decision struct {
	Endpoint string
	Capacity int
	Hashes   []uint64
}

// Load is one replica's load on an endpoint past its last scrape, with its
// requests in flight there.
type Load struct {
	fleet.Load
	InFlight int
}

func (l Load) add(o Load) Load {
	return Load{Load: l.Add(o.Load), InFlight: l.InFlight + o.InFlight}
}

// message is a decoded stream entry.
type message struct {
	cluster  uint64
	replica  string
	instance uint64
	sent     int64
	// complete: the loads are every endpoint the sender has one on.
	complete  bool
	decisions []Decision
	loads     map[string]Load
	scrapes   map[string]fleet.Result
	ejections map[string]time.Time
	answers   []Answer
}

// Answer is what one answer of an endpoint taught its replica of the
// endpoint's speed (predictedLatency): a first token after Seconds with Own
// prompt tokens to prefill, Ahead queued and Running in the batch, Loads 1
// when its adapter had to be loaded; or a decode step of Seconds with
// Running in the batch.
type Answer struct {
	Endpoint                            string
	Step                                bool
	Own, Ahead, Running, Loads, Seconds float64
}

// identity is the hash messages carry of the cluster identity.
func identity(cluster string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(cluster))
	return h.Sum64()
}

var (
	errMalformed = errors.New("malformed message")
	errForeign   = errors.New("message of another cluster")
)

// encoder builds one message.
type encoder struct {
	buf   []byte
	count int
	head  int // where the count goes
}

func (e *encoder) reset(cluster uint64, replica string, instance uint64, sent int64, complete bool) {
	e.buf = append(e.buf[:0], magic...)
	e.buf = append(e.buf, version)
	e.buf = binary.LittleEndian.AppendUint64(e.buf, cluster)
	e.buf = appendString(e.buf, replica)
	e.buf = binary.LittleEndian.AppendUint64(e.buf, instance)
	e.buf = binary.AppendVarint(e.buf, sent)
	var flags byte
	if complete {
		flags = 1
	}
	e.buf = append(e.buf, flags)
	e.head, e.count = len(e.buf), 0
}

func (e *encoder) decision(d Decision) {
	e.buf = append(e.buf, kindDecision)
	e.buf = appendString(e.buf, d.Endpoint)
	e.buf = binary.AppendUvarint(e.buf, uint64(max(d.Capacity, 0)))
	n := min(len(d.Hashes), maxHashes)
	e.buf = binary.AppendUvarint(e.buf, uint64(n))
	for _, h := range d.Hashes[:n] {
		e.buf = binary.LittleEndian.AppendUint64(e.buf, h)
	}
	e.count++
}

func (e *encoder) load(addr string, l Load) {
	e.buf = append(e.buf, kindLoad)
	e.buf = appendString(e.buf, addr)
	for _, v := range [...]int{l.Queued, l.Started, l.Blocks, l.StartedBefore, l.Completed, l.PrefillTokens, l.PrefillWork, l.InFlight} {
		e.buf = binary.AppendUvarint(e.buf, uint64(max(v, 0)))
	}
	e.count++
}

func (e *encoder) scrape(addr string, r fleet.Result) {
	e.buf = append(e.buf, kindScrape)
	e.buf = appendString(e.buf, addr)
	e.buf = binary.AppendVarint(e.buf, r.Started.UnixNano())
	var flags byte
	if r.Err != "" {
		flags |= 1
	}
	if r.Unreachable {
		flags |= 2
	}
	e.buf = append(e.buf, flags)
	e.buf = appendString(e.buf, r.Err)
	e.buf = appendString(e.buf, string(r.Dialect))
	js, err := json.Marshal(r.Metrics)
	if err != nil || len(js) > maxMetrics {
		js = []byte("{}")
	}
	e.buf = binary.AppendUvarint(e.buf, uint64(len(js)))
	e.buf = append(e.buf, js...)
	e.count++
}

func (e *encoder) ejection(addr string, until time.Time) {
	e.buf = append(e.buf, kindEjection)
	e.buf = appendString(e.buf, addr)
	e.buf = binary.AppendVarint(e.buf, until.UnixNano())
	e.count++
}

func (e *encoder) answer(a Answer) {
	e.buf = append(e.buf, kindAnswer)
	e.buf = appendString(e.buf, a.Endpoint)
	kind := byte(1)
	if a.Step {
		kind = 2
	}
	e.buf = append(e.buf, kind)
	for _, v := range [...]float64{a.Own, a.Ahead, a.Running, a.Loads, a.Seconds} {
		e.buf = binary.LittleEndian.AppendUint64(e.buf, math.Float64bits(v))
	}
	e.count++
}

// bytes is the message, its record count in place.
func (e *encoder) bytes() []byte {
	out := make([]byte, 0, len(e.buf)+binary.MaxVarintLen64)
	out = append(out, e.buf[:e.head]...)
	out = binary.AppendUvarint(out, uint64(e.count))
	return append(out, e.buf[e.head:]...)
}

func appendString(b []byte, s string) []byte {
	if len(s) > maxString {
		s = s[:maxString]
	}
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decoder reads a message, failing on anything out of bounds: a peer's
// message never crashes a replica.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint(limit uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > limit {
		d.err = errMalformed
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.err = errMalformed
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) string() string { return string(d.take(int(d.uvarint(maxString)))) }

// maxCount bounds a load's counters: no fleet holds more (as engine's clamp).
const maxCount = 1 << 30

// decode parses a message of the cluster; a message of another is errForeign.
func decode(b []byte, cluster uint64) (message, error) {
	var m message
	if len(b) < len(magic)+1+8 || string(b[:len(magic)]) != magic || b[len(magic)] != version {
		return m, errMalformed
	}
	d := decoder{b: b[len(magic)+1:]}
	m.cluster = binary.LittleEndian.Uint64(d.take(8))
	if m.cluster != cluster {
		return m, errForeign
	}
	m.replica = d.string()
	if raw := d.take(8); d.err == nil {
		m.instance = binary.LittleEndian.Uint64(raw)
	}
	sent, n := binary.Varint(d.b)
	if d.err != nil || n <= 0 {
		return m, errMalformed
	}
	d.b, m.sent = d.b[n:], sent
	if flags := d.take(1); d.err == nil {
		m.complete = flags[0]&1 != 0
	}
	count := d.uvarint(maxRecords)
	for i := uint64(0); i < count && d.err == nil; i++ {
		kind := d.take(1)
		if d.err != nil {
			break
		}
		switch kind[0] {
		case kindDecision:
			dec := Decision{Endpoint: d.string(), Capacity: int(d.uvarint(maxCount))}
			n := int(d.uvarint(maxHashes))
			raw := d.take(8 * n)
			if d.err != nil {
				break
			}
			dec.Hashes = make([]uint64, n)
			for k := range dec.Hashes {
				dec.Hashes[k] = binary.LittleEndian.Uint64(raw[8*k:])
			}
			m.decisions = append(m.decisions, dec)
		case kindLoad:
			addr := d.string()
			var v [8]int
			for k := range v {
				v[k] = int(d.uvarint(maxCount))
			}
			if m.loads == nil {
				m.loads = map[string]Load{}
			}
			m.loads[addr] = Load{Load: fleet.Load{Queued: v[0], Started: v[1], Blocks: v[2], StartedBefore: v[3], Completed: v[4],
				PrefillTokens: v[5], PrefillWork: v[6]}, InFlight: v[7]}
		case kindScrape:
			addr := d.string()
			started, n := binary.Varint(d.b)
			if n <= 0 {
				d.err = errMalformed
				break
			}
			d.b = d.b[n:]
			flags := d.take(1)
			r := fleet.Result{Started: time.Unix(0, started), Err: d.string(), Dialect: engine.Dialect(d.string())}
			js := d.take(int(d.uvarint(maxMetrics)))
			if d.err != nil {
				break
			}
			if err := json.Unmarshal(js, &r.Metrics); err != nil {
				d.err = fmt.Errorf("%w: metrics: %w", errMalformed, err)
				break
			}
			if flags[0]&1 != 0 && r.Err == "" {
				r.Err = "scrape failed"
			}
			if flags[0]&1 == 0 {
				r.Err = ""
			}
			r.Unreachable = flags[0]&2 != 0
			if m.scrapes == nil {
				m.scrapes = map[string]fleet.Result{}
			}
			m.scrapes[addr] = r
		case kindEjection:
			addr := d.string()
			until, n := binary.Varint(d.b)
			if d.err != nil || n <= 0 {
				d.err = errMalformed
				break
			}
			d.b = d.b[n:]
			if m.ejections == nil {
				m.ejections = map[string]time.Time{}
			}
			m.ejections[addr] = time.Unix(0, until)
		case kindAnswer:
			a := Answer{Endpoint: d.string()}
			k := d.take(1)
			raw := d.take(5 * 8)
			if d.err != nil {
				break
			}
			a.Step = k[0] == 2
			var v [5]float64
			for i := range v {
				v[i] = math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:]))
				// A speed is learned from sane numbers only.
				if math.IsNaN(v[i]) || math.IsInf(v[i], 0) || v[i] < 0 || v[i] > 1e7 {
					d.err = errMalformed
				}
			}
			a.Own, a.Ahead, a.Running, a.Loads, a.Seconds = v[0], v[1], v[2], v[3], v[4]
			m.answers = append(m.answers, a)
		default:
			d.err = fmt.Errorf("%w: record kind %d", errMalformed, kind[0])
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = errMalformed
	}
	return m, d.err
}
