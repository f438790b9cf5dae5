//go:build linux || darwin

package serving

import (
	"net"

	"golang.org/x/sys/unix"
)

// limitUnsent caps the answer bytes the kernel holds for c beyond what the
// client's receive window takes (TCP_NOTSENT_LOWAT): a client that stops
// reading then blocks the gateway's writes, and clientWriteTimeout runs, once
// its own receive buffer is full, not after the megabytes the send buffer
// grows to as well. What is in flight is the congestion window's, not capped.
func limitUnsent(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, UnsentLimit)
	})
}
