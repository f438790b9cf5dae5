package proxy

import (
	"bytes"
	"errors"
	"io"
	"sync"
)

// ReplayBody lets a request body be sent again to another target without
// holding more of it than the retry buffer. The head (read while looking for
// the model) is always kept; the rest is recorded as the first attempt streams
// it, up to limit. Once more than that has streamed, the body can no longer be
// replayed and the request is not retried.
type ReplayBody struct {
	mu sync.Mutex
	// head is the part read while looking for the model, in the pieces it
	// was held in (not copied together: a late model's body is held once).
	head    [][]byte
	headLen int
	// whole is the complete body when it is held in memory. Attempts send it
	// from memory, which the transport writes in the same segment as the
	// request's headers; any other body makes it flush the headers first, and
	// the server wakes twice.
	whole    []byte
	rest     io.Reader
	recorded []byte
	limit    int64
	overflow bool
	// hold, when set, is reserved for the recording as it grows; restSize,
	// when known, sizes it in one step.
	hold     *Hold
	restSize int64
	current  *replayReader
	// clientErr is an error reading the client's body (too large, too slow,
	// gone): a failure caused by the client, which no other target can fix.
	clientErr error
}

var errDetached = errors.New("request body: a newer attempt took over")

// NewReplayBody is a body of head, already read, then rest, of which up to
// limit bytes are kept for replay.
func NewReplayBody(head []byte, rest io.Reader, limit int64) *ReplayBody {
	return NewReplayParts([][]byte{head}, rest, limit)
}

// NewReplayParts is NewReplayBody with a head held in several pieces, sent in
// order.
func NewReplayParts(head [][]byte, rest io.Reader, limit int64) *ReplayBody {
	n := 0
	for _, p := range head {
		n += len(p)
	}
	return &ReplayBody{head: head, headLen: n, rest: rest, limit: limit}
}

// SetHold makes the recording for replay reserve its memory from h as it
// grows; a reservation refused ends the recording (the body is then not
// retried) rather than the request. restSize is the length of the rest when
// known, else -1.
func (b *ReplayBody) SetHold(h *Hold, restSize int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hold, b.restSize = h, restSize
}

// WholeBody is a body held whole in memory: always replayable.
func WholeBody(b []byte) *ReplayBody {
	rb := &ReplayBody{}
	rb.SetWhole(b)
	return rb
}

// SetWhole makes b, the complete body, what every attempt sends. b must stay
// unchanged while a transport may read it.
func (b *ReplayBody) SetWhole(whole []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if whole == nil {
		whole = []byte{} // nil means "not held whole"
	}
	b.whole = whole
}

// SetEmpty says nothing follows the head: a body of ContentLength 0 is not
// read from the client at all.
func (b *ReplayBody) SetEmpty() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rest = nil
}

// size is the length to send for a client's ContentLength: that of the body
// held whole, else the client's.
func (b *ReplayBody) size(clientLen int64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.whole != nil {
		return int64(len(b.whole))
	}
	return clientLen
}

// Next starts an attempt's copy of the body, or reports that the body can no
// longer be sent whole (more of it streamed than the buffer keeps). The
// previous attempt's reader, which the transport may still be reading in
// another goroutine, is detached in the same step, so it cannot consume more
// of the body after the check.
func (b *ReplayBody) Next() (io.ReadCloser, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.current != nil {
		b.current.detached = true
	}
	if b.whole != nil {
		return io.NopCloser(bytes.NewReader(b.whole)), true
	}
	if b.overflow || b.clientErr != nil {
		return nil, false
	}
	b.current = &replayReader{b: b}
	return b.current, true
}

// CanReplay reports whether another attempt could still send the whole body,
// without starting one; Next makes the binding check.
func (b *ReplayBody) CanReplay() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.overflow && b.clientErr == nil
}

// Detach stops the current attempt's reader; the transport may still hold it
// after the request is over, and the head's buffer may go back to a pool.
func (b *ReplayBody) Detach() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.current != nil {
		b.current.detached = true
	}
}

// ClientError returns the error, if any, met reading the client's body.
func (b *ReplayBody) ClientError() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.clientErr
}

type replayReader struct {
	b        *ReplayBody
	off      int // offset into head+recorded
	part     int // the head's piece off is in, and where that piece begins
	partOff  int
	detached bool
	closed   bool
}

func (r *replayReader) Read(p []byte) (int, error) {
	b := r.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.detached || r.closed {
		return 0, errDetached
	}
	if r.off < b.headLen {
		for r.off-r.partOff >= len(b.head[r.part]) {
			r.partOff += len(b.head[r.part])
			r.part++
		}
		n := copy(p, b.head[r.part][r.off-r.partOff:])
		r.off += n
		return n, nil
	}
	if i := r.off - b.headLen; i < len(b.recorded) {
		n := copy(p, b.recorded[i:])
		r.off += n
		return n, nil
	}
	if b.rest == nil {
		return 0, io.EOF
	}
	// Read the next part of the client's body under the lock: only the current
	// attempt reads it, and recording must stay in order.
	n, err := b.rest.Read(p)
	if n > 0 && !b.overflow {
		b.record(p[:n])
	}
	r.off += n
	switch {
	case errors.Is(err, io.EOF):
		// Ended: later reads (the transport's check for bytes past the
		// length, a replay) must not touch the client's body again, which its
		// server closes once the answer starts; a read of it then fails and
		// the transport closes the upstream connection mid-answer.
		b.rest = nil
	case err != nil:
		b.clientErr = err
	}
	return n, err
}

// record keeps p for replay, growing the recording within the limit and the
// hold; past either the body can no longer be replayed.
func (b *ReplayBody) record(p []byte) {
	need := len(b.recorded) + len(p)
	if int64(need) > b.limit {
		b.stopRecording()
		return
	}
	if need > cap(b.recorded) {
		c := max(need, 2*cap(b.recorded), 32<<10)
		if b.restSize >= 0 && b.hold != nil && cap(b.recorded) == 0 {
			c = max(need, int(min(b.restSize, b.limit))) // the rest's length is known: one step
		}
		c = int(min(int64(c), b.limit))
		if b.hold != nil && !b.hold.Reserve(int64(c-cap(b.recorded))) {
			b.stopRecording()
			return
		}
		grown := make([]byte, len(b.recorded), c)
		copy(grown, b.recorded)
		b.recorded = grown
	}
	b.recorded = append(b.recorded, p...)
}

func (b *ReplayBody) stopRecording() {
	b.overflow = true
	if b.hold != nil {
		b.hold.Release(int64(cap(b.recorded)))
	}
	b.recorded = nil
}

func (r *replayReader) Close() error {
	r.b.mu.Lock()
	r.closed = true
	r.b.mu.Unlock()
	return nil
}
