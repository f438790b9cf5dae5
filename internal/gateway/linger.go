package gateway

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// After an answer given before the request's body was read to its end (a
// refusal: 413, 429, 503, 401...), an HTTP/1.1 client may still be sending it.
// Closing then makes the kernel answer its next bytes with a reset, which
// discards the answer the client has not read yet: clients that write the
// whole request before reading (Python's requests, many scripts) see a
// broken connection instead of the status. So, as nginx's lingering close
// does, the rest of the body is read and dropped, within these bounds, after
// the answer went out; nginx's defaults for lingering_time and
// lingering_timeout.
const (
	lingerTime = 30 * time.Second // at most, in all
	lingerIdle = 5 * time.Second  // at most between two reads
	// lingerBytes bounds what is read and dropped: past it the connection
	// closes as before.
	lingerBytes = 1 << 30
)

// lingerBuffers are the buffers the dropped bytes are read into.
var lingerBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// countingBody counts the bytes the handler read of a request's body.
type countingBody struct {
	io.ReadCloser
	n int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n += int64(n)
	return n, err
}

// linger reads and drops what is left of an HTTP/1.x request's body once the
// handler has answered, within lingerTime, lingerIdle and lingerBytes. A body
// already read to its end costs one read. HTTP/2 needs none of this: a stream
// ends with its own reset, and the answer stands.
func linger(w http.ResponseWriter, r *http.Request, body *countingBody) {
	if r.ProtoMajor != 1 || r.Body == nil || r.Body == http.NoBody {
		return
	}
	// A client waiting for 100 Continue that got the answer instead sends no
	// body: there is nothing to wait for.
	if body.n == 0 && strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		return
	}
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return
	}
	bp := lingerBuffers.Get().(*[]byte)
	defer lingerBuffers.Put(bp)
	end := time.Now().Add(lingerTime)
	for read := int64(0); read < lingerBytes; {
		at := time.Now().Add(lingerIdle)
		if at.After(end) {
			at = end
		}
		if err := rc.SetReadDeadline(at); err != nil {
			return
		}
		n, err := body.Read(*bp)
		read += int64(n)
		if err != nil {
			return
		}
	}
}
