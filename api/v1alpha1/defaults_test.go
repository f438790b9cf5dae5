package v1alpha1

import (
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDefaults(t *testing.T) {
	var empty SchedulerSpec
	var gw GatewaySpec
	var bbr BBRSpec
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"port", empty.Port(), DefaultTargetPort},
		{"picker", empty.PickerName(), "kvgate"},
		{"h2c", empty.H2C(), false},
		{"route timeout", empty.Timeout(), DefaultRouteTimeout},
		{"attempts", gw.Attempts(), DefaultMaxAttempts},
		{"in-flight limit", gw.InFlightLimit(), 0},
		{"queue wait", gw.QueueWait(), DefaultQueueTimeout},
		{"connect", gw.Connect(), DefaultConnectTimeout},
		{"header timeout", gw.HeaderTimeout(), DefaultHeaderTimeout},
		{"first byte", gw.FirstByte(), DefaultFirstByteTimeout},
		{"stream idle", gw.StreamIdle(), DefaultStreamIdleTimeout},
		{"client write", gw.ClientWrite(), DefaultClientWriteTimeout},
		{"retry buffer", gw.RetryBuffer(), int64(DefaultRetryBufferBytes)},
		{"body limit", bbr.MaxBodyBytes(), int64(DefaultMaxRequestBodyBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Fatalf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
	one, limit, buf := int32(1), int32(4), int64(10)
	d := metav1.Duration{Duration: 3 * time.Second}
	set := SchedulerSpec{TargetPort: ptr(int32(9000)), Picker: "random", AppProtocol: AppProtocolH2C, RouteTimeout: &d}
	gw = GatewaySpec{MaxAttempts: &one, MaxInFlightPerEndpoint: &limit, QueueTimeout: &d, ConnectTimeout: &d, ResponseHeaderTimeout: &d, RetryBufferBytes: &buf,
		FirstByteTimeout: &d, StreamIdleTimeout: &d, ClientWriteTimeout: &d}
	if set.Port() != 9000 || set.PickerName() != "random" || !set.H2C() || set.Timeout() != d.Duration {
		t.Errorf("scheduler accessors ignore set fields: %+v", set)
	}
	if gw.Attempts() != 1 || gw.InFlightLimit() != 4 || gw.QueueWait() != d.Duration || gw.Connect() != d.Duration || gw.HeaderTimeout() != d.Duration || gw.RetryBuffer() != 10 ||
		gw.FirstByte() != d.Duration || gw.StreamIdle() != d.Duration || gw.ClientWrite() != d.Duration {
		t.Errorf("gateway accessors ignore set fields: %+v", gw)
	}
}

// TestWeightsByName: ByName gives every field of Weights under the field's
// YAML key, so that a weight's scorer is the one its key names.
func TestWeightsByName(t *testing.T) {
	var w Weights
	v := reflect.ValueOf(&w).Elem()
	for i := range v.NumField() {
		n := int32(i + 1)
		v.Field(i).Set(reflect.ValueOf(&n))
	}
	by := w.ByName()
	if len(by) != v.NumField() {
		t.Errorf("ByName has %d names, Weights %d fields", len(by), v.NumField())
	}
	for i := range v.NumField() {
		key, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		t.Run(key, func(t *testing.T) {
			if got := by[ScorerName(key)]; got == nil || *got != int32(i+1) {
				t.Errorf("ByName()[%q] is not the field %s", key, v.Type().Field(i).Name)
			}
		})
	}
}

// TestStallBoundsBelowProxies: with the defaults, a stalled request ends with
// the gateway's own error before the 60 s of silence after which nginx
// (proxy_read_timeout) and AWS's load balancers (idle timeout) cut the
// client's connection: a silent stream, and a request whose every attempt
// waits out its first-byte bound.
func TestStallBoundsBelowProxies(t *testing.T) {
	const proxySilence = 60 * time.Second
	var gw GatewaySpec
	for _, tc := range []struct {
		name   string
		silent time.Duration
	}{
		{"stream idle", gw.StreamIdle()},
		{"every attempt waiting for its first byte", time.Duration(gw.Attempts()) * (gw.FirstByte() + gw.Connect())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.silent >= proxySilence {
				t.Errorf("the client waits %v in silence by default, not below a proxy's %v", tc.silent, proxySilence)
			}
		})
	}
}
