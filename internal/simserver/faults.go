package simserver

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
)

// Faults make a server misbehave on purpose, for reliability tests of whatever sits
// in front of it. They apply to the inference endpoints; /health and /metrics keep
// answering unless the server refuses connections altogether or MetricsErrorStatus
// is set.
type Faults struct {
	// ErrorRate is the share of requests answered at once with ErrorStatus
	// (default 500) and an OpenAI-shaped error body.
	ErrorRate   float64 `json:"errorRate,omitempty"`
	ErrorStatus int     `json:"errorStatus,omitempty"`
	// AddedLatency delays every request before it reaches the engine.
	AddedLatency Duration `json:"addedLatency,omitempty"`
	// HangRate is the share of requests that never get an answer; they end only
	// when the client gives up.
	HangRate float64 `json:"hangRate,omitempty"`
	// CloseMidStreamRate is the share of streaming requests whose connection is
	// dropped after CloseAfterTokens tokens (default 1).
	CloseMidStreamRate float64 `json:"closeMidStreamRate,omitempty"`
	CloseAfterTokens   int     `json:"closeAfterTokens,omitempty"`
	// RefuseConnections closes the listening socket and every open connection, as
	// a crashed pod would; clearing it listens again on the same address.
	RefuseConnections bool `json:"refuseConnections,omitempty"`
	// MetricsErrorStatus makes /metrics answer with this status while inference
	// goes on, as a broken metrics exporter would: a gateway sees the server's
	// metrics go stale.
	MetricsErrorStatus int `json:"metricsErrorStatus,omitempty"`
	// Slowdown makes every engine step take this many times as long (2: half
	// speed), as a throttled GPU or a noisy neighbour would; 0 or 1: none.
	Slowdown float64 `json:"slowdown,omitempty"`
}

func (f Faults) validate() error {
	for name, v := range map[string]float64{"errorRate": f.ErrorRate, "hangRate": f.HangRate, "closeMidStreamRate": f.CloseMidStreamRate} {
		if v < 0 || v > 1 {
			return fmt.Errorf("fault %s = %g: must be between 0 and 1", name, v)
		}
	}
	if f.ErrorStatus != 0 && (f.ErrorStatus < 400 || f.ErrorStatus > 599) {
		return fmt.Errorf("fault errorStatus = %d: must be a 4xx or 5xx status", f.ErrorStatus)
	}
	if f.MetricsErrorStatus != 0 && (f.MetricsErrorStatus < 400 || f.MetricsErrorStatus > 599) {
		return fmt.Errorf("fault metricsErrorStatus = %d: must be a 4xx or 5xx status", f.MetricsErrorStatus)
	}
	if f.Slowdown < 0 || f.Slowdown > 1000 {
		return fmt.Errorf("fault slowdown = %g: must be between 0 and 1000", f.Slowdown)
	}
	if f.AddedLatency < 0 || f.CloseAfterTokens < 0 {
		return fmt.Errorf("fault addedLatency and closeAfterTokens must not be negative")
	}
	return nil
}

// Duration is a time.Duration written as a Go duration string ("150ms") in JSON
// and YAML.
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string, or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var secs float64
		if err2 := json.Unmarshal(b, &secs); err2 != nil {
			return fmt.Errorf("duration must be a string like \"150ms\" or a number of seconds")
		}
		*d = Duration(secs * float64(time.Second))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Faults returns the faults in force.
func (s *Server) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// SetFaults replaces the faults in force.
func (s *Server) SetFaults(f Faults) error { return s.setFaults(f, nil) }

func (s *Server) setFaults(f Faults, spare net.Conn) error {
	if err := f.validate(); err != nil {
		return err
	}
	s.mu.Lock()
	s.faults = f
	s.eng.SetSlowdown(f.Slowdown)
	s.mu.Unlock()
	if err := s.setRefusing(f.RefuseConnections, spare); err != nil {
		return err
	}
	s.log.Info("faults set", "faults", f)
	return nil
}

// applyRequestFaults delays, hangs or fails a request as the faults say; it
// reports whether the request should go on.
func (s *Server) applyRequestFaults(w http.ResponseWriter, r *http.Request) bool {
	s.mu.Lock()
	f := s.faults
	hang := f.HangRate > 0 && s.rng.Float64() < f.HangRate
	fail := f.ErrorRate > 0 && s.rng.Float64() < f.ErrorRate
	s.mu.Unlock()
	if f.AddedLatency > 0 && !sleepCtx(r.Context(), time.Duration(f.AddedLatency)) {
		return false
	}
	if hang {
		// net/http notices the client leaving only once the body has been read.
		_, _ = io.Copy(io.Discard, http.MaxBytesReader(nil, r.Body, s.opts.MaxBodyBytes))
		<-r.Context().Done()
		return false
	}
	if fail {
		status := f.ErrorStatus
		if status == 0 {
			status = http.StatusInternalServerError
		}
		openai.WriteError(w, status, openai.TypeServer, fmt.Sprintf("injected fault: status %d", status))
		return false
	}
	return true
}

// drawStreamCut returns after how many tokens a stream is cut, or 0 for never.
func (s *Server) drawStreamCut(streaming bool) int {
	if !streaming {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.faults
	if f.CloseMidStreamRate == 0 || s.rng.Float64() >= f.CloseMidStreamRate {
		return 0
	}
	return max(1, f.CloseAfterTokens)
}

// handleFaults reads (GET) or replaces (PUT, POST) the server's faults as JSON.
func (s *Server) handleFaults(w http.ResponseWriter, r *http.Request) {
	serveFaults(w, r, s)
}

func serveFaults(w http.ResponseWriter, r *http.Request, s *Server) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodPut, http.MethodPost:
		var f Faults
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, "faults: "+err.Error())
			return
		}
		// The connection asking for refusal is spared and closed after the answer.
		spare, _ := r.Context().Value(connKey{}).(net.Conn)
		if err := s.setFaults(f, spare); err != nil {
			openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, err.Error())
			return
		}
		if f.RefuseConnections {
			w.Header().Set("Connection", "close")
		}
	default:
		w.Header().Set("Allow", "GET, PUT, POST")
		openai.WriteError(w, http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "use GET to read faults, PUT to set them")
		return
	}
	writeJSON(w, http.StatusOK, s.Faults())
}
