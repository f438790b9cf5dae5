package v1alpha1

import "time"

// The accessors below return a field's value or its default, so that code reading a
// configuration never repeats the defaults.

// MaxBodyBytes is the body limit.
func (b BBRSpec) MaxBodyBytes() int64 {
	if b.MaxRequestBodyBytes != nil {
		return *b.MaxRequestBodyBytes
	}
	return DefaultMaxRequestBodyBytes
}

// Port is the model servers' port.
func (s SchedulerSpec) Port() int {
	if s.TargetPort != 0 {
		return int(s.TargetPort)
	}
	return DefaultTargetPort
}

// H2C says whether the model servers speak HTTP/2 without TLS.
func (s SchedulerSpec) H2C() bool { return s.AppProtocol == AppProtocolH2C }

// Timeout is the route timeout, 0 for none.
func (s SchedulerSpec) Timeout() time.Duration {
	if s.RouteTimeout != nil {
		return s.RouteTimeout.Duration
	}
	return 0
}

// PickerName is the picker, "kvgate" when unset.
func (s SchedulerSpec) PickerName() string {
	if s.Picker != "" {
		return s.Picker
	}
	return "kvgate"
}

// Attempts is how many endpoints a request may try.
func (g GatewaySpec) Attempts() int {
	if g.MaxAttempts != nil {
		return int(*g.MaxAttempts)
	}
	return DefaultMaxAttempts
}

// InFlightLimit is the per-endpoint saturation point, 0 for none.
func (g GatewaySpec) InFlightLimit() int {
	if g.MaxInFlightPerEndpoint != nil {
		return int(*g.MaxInFlightPerEndpoint)
	}
	return 0
}

// QueueWait is how long a request waits for a saturated pool.
func (g GatewaySpec) QueueWait() time.Duration {
	if g.QueueTimeout != nil {
		return g.QueueTimeout.Duration
	}
	return DefaultQueueTimeout
}

// Connect bounds dialling.
func (g GatewaySpec) Connect() time.Duration {
	if g.ConnectTimeout != nil {
		return g.ConnectTimeout.Duration
	}
	return DefaultConnectTimeout
}

// HeaderTimeout bounds the wait for response headers, 0 for none.
func (g GatewaySpec) HeaderTimeout() time.Duration {
	if g.ResponseHeaderTimeout != nil {
		return g.ResponseHeaderTimeout.Duration
	}
	return 0
}

// RetryBuffer is how much of a body is kept for replay.
func (g GatewaySpec) RetryBuffer() int64 {
	if g.RetryBufferBytes != nil {
		return *g.RetryBufferBytes
	}
	return DefaultRetryBufferBytes
}
