//go:build !linux && !darwin

package serving

import "net"

// limitUnsent does nothing where TCP_NOTSENT_LOWAT is not known: a client
// that stops reading is dropped once the send buffer is full as well.
func limitUnsent(net.Conn) {}
