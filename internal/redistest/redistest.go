// Package redistest starts real redis-server processes for tests: the binary
// from $KVGATE_REDIS_SERVER (make test sets it from hack/redis.sh), else
// redis-server on PATH; tests fail without one unless KVGATE_SKIP names redis.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/testenv"
)

// Server is a redis-server child process on a loopback port, for one test.
type Server struct {
	bin, dir string
	port     int

	mu   sync.Mutex
	cmd  *exec.Cmd
	out  *logtest.Buffer
	done chan struct{}
}

// redisBinary is $KVGATE_REDIS_SERVER, else redis-server on PATH; without
// either the test fails, unless KVGATE_SKIP names redis.
func redisBinary(t testing.TB) string {
	t.Helper()
	return testenv.Require(t, testenv.Redis)
}

// Start starts a redis-server on a free loopback port, waits until it
// answers PING, and kills it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{bin: redisBinary(t), dir: t.TempDir()}
	var err error
	for range 3 { // the free port may be taken between our close and redis's bind
		if s.port, err = freePort(); err != nil {
			t.Fatal(err)
		}
		if err = s.start(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	return s
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &logtest.Buffer{}
	cmd := exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--daemonize", "no")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.out, s.done = cmd, out, done

	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer func() { _ = c.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited: %s", s.port, out)
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("redis-server on port %d did not answer PING: %w\n%s", s.port, err, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kill stops the server (SIGKILL: no goodbye to the clients) and waits for it.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Restart starts a fresh, empty server on the same port.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}

// Client is a new go-redis client of the server: one per simulated replica,
// without retries inside go-redis, as kvgate global configures its own.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
