package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// uploadThenRead sends a request whose body of size bytes goes out in pieces with
// a pause between, over a raw TCP connection, and reads the answer only once
// all of it is sent, as clients that write the whole request first do
// (Python's requests, many scripts). It returns the status line read, or the
// error that stopped it.
func uploadThenRead(t *testing.T, host, head string, body []byte, chunked bool) (string, error) {
	t.Helper()
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := fmt.Fprint(conn, head); err != nil {
		return "", err
	}
	const piece = 16 << 10
	for len(body) > 0 {
		n := min(piece, len(body))
		var werr error
		if chunked {
			_, werr = fmt.Fprintf(conn, "%x\r\n%s\r\n", n, body[:n])
		} else {
			_, werr = conn.Write(body[:n])
		}
		if werr != nil {
			return "", fmt.Errorf("writing the body: %w", werr)
		}
		body = body[n:]
		time.Sleep(15 * time.Millisecond)
	}
	if chunked {
		if _, err := fmt.Fprint(conn, "0\r\n\r\n"); err != nil {
			return "", fmt.Errorf("writing the body's end: %w", err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", fmt.Errorf("reading the answer: %w", err)
	}
	_ = resp.Body.Close()
	return resp.Status, nil
}

// TestRefusedWhileUploading: a client still sending its body when kvgate
// refuses the request (413 by Content-Length or as the body streams, 503
// when the bodies held are over budget) reads the refusal once it has sent
// the rest, rather than a connection reset: the body is read and dropped, for
// a bounded time, after the answer.
func TestRefusedWhileUploading(t *testing.T) {
	addr := gatedServer(t, closedGate())
	cfg := gatewayConfig(scheduler("p", "m", addr))
	limit, budget := int64(256<<10), int64(1<<20)
	cfg.Spec.BBR.MaxRequestBodyBytes = &limit
	cfg.Spec.Gateway.MaxBufferedBytes = &budget
	_, base := startGateway(t, cfg)
	host := strings.TrimPrefix(base, "http://")
	big := []byte(lateModel(1 << 20))
	small := []byte(lateModel(200 << 10))
	req := func(extra string) string {
		return "POST /v1/chat/completions HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\n" + extra + "\r\n"
	}
	for _, tc := range []struct {
		name    string
		head    string
		body    []byte
		chunked bool
		want    string
	}{
		{"413 by Content-Length", req(fmt.Sprintf("Content-Length: %d\r\n", len(big))), big, false, "413"},
		{"413 as a chunked body streams", req("Transfer-Encoding: chunked\r\n"), big, true, "413"},
		{"served, the same way", req(fmt.Sprintf("Content-Length: %d\r\n", len(small))), small, false, "200"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, err := uploadThenRead(t, host, tc.head, tc.body, tc.chunked)
			if err != nil || !strings.HasPrefix(status, tc.want) {
				t.Fatalf("status %q, %v; want %s", status, err, tc.want)
			}
		})
	}

	// Over the budget for bodies: a larger limit, the same budget.
	limit = 8 << 20
	cfg.Spec.BBR.MaxRequestBodyBytes = &limit
	_, base = startGateway(t, cfg)
	over := []byte(lateModel(3 << 20))
	status, err := uploadThenRead(t, strings.TrimPrefix(base, "http://"), req(fmt.Sprintf("Content-Length: %d\r\n", len(over))), over, false)
	if err != nil || !strings.HasPrefix(status, "503") {
		t.Fatalf("over budget: status %q, %v; want 503", status, err)
	}
}

// TestLingerBounded: a refused client that stops sending is not waited for
// past lingerIdle: it reads the refusal, then the connection closes.
func TestLingerBounded(t *testing.T) {
	addr := gatedServer(t, closedGate())
	cfg := gatewayConfig(scheduler("p", "m", addr))
	limit := int64(64 << 10)
	cfg.Spec.BBR.MaxRequestBodyBytes = &limit
	_, base := startGateway(t, cfg)
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(lingerIdle + 5*time.Second))
	start := time.Now()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvgate\r\nContent-Length: %d\r\n\r\n%s", 1<<20, strings.Repeat("x", 100<<10))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("%v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 {
		t.Fatalf("after the answer: %q, %v; want the connection closed", rest, err)
	}
	if took := time.Since(start); took < lingerIdle-time.Second || took > lingerIdle+2*time.Second {
		t.Errorf("closed after %v, want about lingerIdle (%v)", took, lingerIdle)
	}
}
