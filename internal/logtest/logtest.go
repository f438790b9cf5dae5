// Package logtest captures output written from several goroutines — a
// logger's, a child process's — for a test to read while it is written.
package logtest

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe to write and read concurrently.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
