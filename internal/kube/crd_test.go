package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/config"
)

// crdCase is one document for TestCRDValidation.
type crdCase struct {
	name string
	spec map[string]any
	// field is the path kvgate's Validate names; "" for a document the API
	// server and kvgate both accept.
	field string
	// apiField is the path the API server names, when it is not field (a CEL
	// rule on a parent, a duplicate key of a list map).
	apiField string
	// msg is what the API server's message says besides the path: the bound,
	// or the rule's message.
	msg string
	// decode: kvgate cannot even decode the document (so there is no Validate
	// to run); the API server must refuse it all the more.
	decode bool
	// schemaOnly: the API server refuses it (naming field and msg) though
	// kvgate's Validate accepts it; see the list at TestCRDValidation.
	schemaOnly bool
}

// TestCRDValidation: kubectl apply refuses what kvgate would refuse. Each
// refused document is refused by the API server (the CRD's schema and its CEL
// rules), naming the field and the bound or rule, and by kvgate itself — its
// Validate, and `kvgate serve --config` reading the same document from a
// file; each accepted one, the bounds themselves mostly, is accepted by both.
//
// Left to kvgate alone (TestCRDKvgateOnly shows each):
//   - the same LoRA adapter in two schedulers: comparing every adapter with
//     every other, 100 schedulers of 50 adapters, exceeds the API server's
//     estimated cost budget for a rule many times over. The schema does refuse
//     an adapter repeated within one scheduler (loraAdapters is a set) and an
//     adapter that is any scheduler's modelName.
//   - the syntax of a modelSelector beyond "not empty": operators, values and
//     label keys are checked by the controller (metav1.LabelSelectorAsSelector;
//     Accepted=False), not by Validate; metav1.LabelSelector declares no
//     maxItems or maxLength, so CEL rules over it cannot fit the cost budget.
//   - the names of a metric map's label matchers (spec.schedulers[].metrics.*.labels):
//     a CEL rule over a map's keys, which the schema bounds in number but not
//     in length, exceeds the cost budget; the schema does bound their number.
//   - a poolRef naming an InferencePool that exists and has matchLabels: state
//     of the cluster, not of the document (a missing pool is an empty one:
//     Ready=False, InferencePoolNotFound).
//
// Refused by the schema though Validate accepts them (the schemaOnly cases):
//   - static endpoints beside a modelSelector or poolRef: in Kubernetes they
//     would be ignored, but Validate also checks the configuration the
//     controller resolves, which carries the selector and the pods' endpoints.
//   - "" for an enumerated field (unset to kvgate): a typed client never
//     sends it.
//   - a metric map's scale quoted ("0.01"): a file may quote it, the API
//     server stores a number.
func TestCRDValidation(t *testing.T) {
	k := startCluster(t)
	k.namespace(t, "crd")
	var cases []crdCase
	refuse := func(field string, v any, msg string) {
		cases = append(cases, crdCase{name: field + "=" + short(v), spec: setField(base(), field, v), field: field, msg: msg})
	}
	accept := func(field string, v any) {
		cases = append(cases, crdCase{name: field + "=" + short(v) + " accepted", spec: setField(base(), field, v)})
	}
	const (
		atLeast = "should be greater than or equal to "
		atMost  = "should be less than or equal to "
		match   = "should match"
		enum    = "Unsupported value"
	)

	// bbr
	refuse("spec.bbr.replicas", 2, v1alpha1.MsgReplicas)
	refuse("spec.bbr.maxRequestBodyBytes", 1023, atLeast+"1024")
	refuse("spec.bbr.maxRequestBodyBytes", 1<<30+1, atMost+"1073741824")
	accept("spec.bbr.maxRequestBodyBytes", 1024)
	accept("spec.bbr.maxRequestBodyBytes", 1<<30)

	// gateway
	refuse("spec.gateway.maxAttempts", 0, atLeast+"1")
	refuse("spec.gateway.maxAttempts", 11, atMost+"10")
	accept("spec.gateway.maxAttempts", 1)
	accept("spec.gateway.maxAttempts", 10)
	refuse("spec.gateway.maxInFlightPerEndpoint", -1, atLeast+"0")
	accept("spec.gateway.maxInFlightPerEndpoint", 0)
	refuse("spec.gateway.retryBufferBytes", -1, atLeast+"0")
	accept("spec.gateway.retryBufferBytes", 0)
	refuse("spec.gateway.queueTimeout", "61s", "must be between 0s and 1m")
	refuse("spec.gateway.queueTimeout", "-1s", match)
	accept("spec.gateway.queueTimeout", "0s")
	accept("spec.gateway.queueTimeout", "1m")
	refuse("spec.gateway.connectTimeout", "0s", "must be between 1ns and 1m")
	refuse("spec.gateway.connectTimeout", "1m0.000000001s", "must be between 1ns and 1m")
	accept("spec.gateway.connectTimeout", "1ns")
	accept("spec.gateway.connectTimeout", "60s")
	for _, f := range []string{"spec.gateway.responseHeaderTimeout", "spec.gateway.firstByteTimeout", "spec.gateway.streamIdleTimeout", "spec.gateway.clientWriteTimeout", "spec.schedulers[0].routeTimeout"} {
		refuse(f, "-1s", match) // the pattern has no sign
		accept(f, "0")
	}
	refuse("spec.gateway.outlierDetection.baseEjectionTime", "999ms", "must be between 1s and 1h")
	refuse("spec.gateway.outlierDetection.baseEjectionTime", "61m", "must be between 1s and 1h")
	accept("spec.gateway.outlierDetection.baseEjectionTime", "1s")
	accept("spec.gateway.outlierDetection.baseEjectionTime", "1h")
	refuse("spec.gateway.outlierDetection.consecutiveFailures", -1, atLeast+"0")
	accept("spec.gateway.outlierDetection.consecutiveFailures", 0)
	refuse("spec.gateway.outlierDetection.maxEjectionPercent", -1, atLeast+"0")
	refuse("spec.gateway.outlierDetection.maxEjectionPercent", 101, atMost+"100")
	accept("spec.gateway.outlierDetection.maxEjectionPercent", 0)
	accept("spec.gateway.outlierDetection.maxEjectionPercent", 100)
	refuse("spec.gateway.scrape.interval", "9ms", "must be between 10ms and 1m")
	refuse("spec.gateway.scrape.interval", "61s", "must be between 10ms and 1m")
	accept("spec.gateway.scrape.interval", "10ms")
	accept("spec.gateway.scrape.interval", "1m")
	refuse("spec.gateway.scrape.timeout", "0s", "must be between 1ns and 1m")
	refuse("spec.gateway.scrape.timeout", "61s", "must be between 1ns and 1m")
	accept("spec.gateway.scrape.timeout", "1m")
	refuse("spec.gateway.scrape.staleAfter", "49ms", "must be at least the scrape interval (default 50ms)") // below the default interval
	accept("spec.gateway.scrape.staleAfter", "50ms")
	cases = append(cases,
		crdCase{name: "staleAfter below interval", spec: setField(setField(base(), "spec.gateway.scrape.interval", "2s"), "spec.gateway.scrape.staleAfter", "1999ms"),
			field: "spec.gateway.scrape.staleAfter", msg: "must be at least the scrape interval"},
		crdCase{name: "staleAfter == interval accepted", spec: setField(setField(base(), "spec.gateway.scrape.interval", "2s"), "spec.gateway.scrape.staleAfter", "2s")})
	refuse("spec.gateway.scrape.unhealthyAfter", 0, atLeast+"1")
	accept("spec.gateway.scrape.unhealthyAfter", 1)

	// schedulers[0]
	refuse("spec.schedulers[0].replicas", 1, v1alpha1.MsgReplicas)
	refuse("spec.schedulers[0].name", "Llama_8B", match)
	refuse("spec.schedulers[0].modelName", "", "should be at least 1 chars long")
	refuse("spec.schedulers[0].targetPort", 65536, atMost+"65535")
	refuse("spec.schedulers[0].targetPort", 0, atLeast+"1") // 0 would be read as unset: the default port
	accept("spec.schedulers[0].targetPort", 1)
	accept("spec.schedulers[0].targetPort", 65535)
	refuse("spec.schedulers[0].appProtocol", "grpc", enum)
	refuse("spec.schedulers[0].engineType", "ollama", enum)
	accept("spec.schedulers[0].engineType", "tgi")
	accept("spec.schedulers[0].engineType", "llamacpp")
	refuse("spec.schedulers[0].picker", "best", enum)
	refuse("spec.schedulers[0].profile", "fast", enum)
	accept("spec.schedulers[0].appProtocol", "kubernetes.io/h2c")
	for _, w := range []string{"queue", "kvCache", "prefix", "loraAffinity", "runningRequests", "prefillQueue", "errorRate"} {
		refuse("spec.schedulers[0].weights."+w, -1, atLeast+"0")
		accept("spec.schedulers[0].weights."+w, 0)
	}
	refuse("spec.schedulers[0].saturation.queueDepth", 0, atLeast+"1")
	refuse("spec.schedulers[0].saturation.kvCachePercent", 0, atLeast+"1")
	refuse("spec.schedulers[0].saturation.kvCachePercent", 101, atMost+"100")
	accept("spec.schedulers[0].saturation.kvCachePercent", 100)
	refuse("spec.schedulers[0].prefix.blockChars", 7, atLeast+"8")
	refuse("spec.schedulers[0].prefix.blockChars", 4097, atMost+"4096")
	accept("spec.schedulers[0].prefix.blockChars", 8)
	accept("spec.schedulers[0].prefix.blockChars", 4096)
	refuse("spec.schedulers[0].prefix.maxBlocks", 0, atLeast+"1")
	refuse("spec.schedulers[0].prefix.maxBlocks", 4097, atMost+"4096")
	refuse("spec.schedulers[0].prefix.capacityBlocks", 0, atLeast+"1")
	refuse("spec.schedulers[0].modelSelector", map[string]any{}, v1alpha1.MsgEmptySelector)
	refuse("spec.schedulers[0].modelSelector", map[string]any{"matchLabels": map[string]any{}, "matchExpressions": []any{}}, v1alpha1.MsgEmptySelector)
	accept("spec.schedulers[0].modelSelector", map[string]any{"matchExpressions": []any{map[string]any{"key": "app", "operator": "Exists"}}})
	// An InferencePool's name: an object name, as long as its status
	// messages quote it.
	for _, ref := range []string{"Pool_1", strings.Repeat("p", 254), "-pool"} {
		cases = append(cases, crdCase{name: "poolRef=" + short(ref), spec: setField(setField(base(), "spec.schedulers[0].modelSelector", nil), "spec.schedulers[0].poolRef", ref),
			field: "spec.schedulers[0].poolRef", msg: "spec.schedulers[0].poolRef"})
	}
	cases = append(cases, crdCase{name: "poolRef=llama.pool-1 accepted", spec: setField(setField(base(), "spec.schedulers[0].modelSelector", nil), "spec.schedulers[0].poolRef", "llama.pool-1")})
	// Where a scheduler's endpoints come from: exactly one place.
	cases = append(cases, crdCase{name: "no endpoint source", spec: setField(base(), "spec.schedulers[0].modelSelector", nil), field: "spec.schedulers[0]", msg: v1alpha1.MsgEndpointSource})
	for _, tc := range []struct {
		name           string
		set            map[string]any
		ok, schemaOnly bool
	}{
		{"selector and poolRef", map[string]any{"poolRef": "pool"}, false, false},
		{"all three", map[string]any{"poolRef": "pool", "endpoints": []any{"h:80"}}, false, false},
		{"selector and endpoints", map[string]any{"endpoints": []any{"h:80"}}, false, true},
		{"poolRef and endpoints", map[string]any{"modelSelector": nil, "poolRef": "pool", "endpoints": []any{"h:80"}}, false, true},
		{"poolRef alone", map[string]any{"modelSelector": nil, "poolRef": "pool"}, true, false},
		{"endpoints alone", map[string]any{"modelSelector": nil, "endpoints": []any{"h:80"}}, true, false},
		{"selector with an empty poolRef and no endpoints", map[string]any{"poolRef": "", "endpoints": []any{}}, true, false},
	} {
		spec := base()
		for f, v := range tc.set {
			setField(spec, "spec.schedulers[0]."+f, v)
		}
		c := crdCase{name: tc.name, spec: spec, schemaOnly: tc.schemaOnly}
		if !tc.ok {
			c.field, c.msg = "spec.schedulers[0]", v1alpha1.MsgEndpointSource
		}
		cases = append(cases, c)
	}
	cases = append(cases,
		crdCase{name: "bbr without enabled accepted", spec: setField(base(), "spec.bbr", map[string]any{"maxRequestBodyBytes": 2048})},
		crdCase{name: "empty picker", spec: setField(base(), "spec.schedulers[0].picker", ""), field: "spec.schedulers[0].picker", msg: enum, schemaOnly: true})
	for _, ep := range []string{"h:0", "h:65536", ":80", "h", "a:b:80", "[::1]80", "h:+80"} {
		spec := setField(setField(base(), "spec.schedulers[0].modelSelector", nil), "spec.schedulers[0].endpoints", []any{"h:80", ep})
		cases = append(cases, crdCase{name: "endpoint " + ep, spec: spec, field: "spec.schedulers[0].endpoints[1]", msg: match})
	}
	cases = append(cases, crdCase{name: "endpoints at the bounds accepted",
		spec: setField(setField(base(), "spec.schedulers[0].modelSelector", nil), "spec.schedulers[0].endpoints", []any{"10.0.0.1:1", "[::1]:65535", "vllm-0.models.svc:8000"})})

	// Metric maps.
	custom := func(metrics map[string]any) map[string]any {
		return setField(setField(base(), "spec.schedulers[0].engineType", "custom"), "spec.schedulers[0].metrics", metrics)
	}
	metric := func(name string) map[string]any { return map[string]any{"name": name} }
	sixteen := map[string]any{}
	for i := range 17 {
		sixteen[fmt.Sprintf("l%d", i)] = "x"
	}
	const m0 = "spec.schedulers[0].metrics"
	cases = append(cases,
		crdCase{name: "custom map accepted", spec: custom(map[string]any{
			"queue":     map[string]any{"name": "myserver_requests", "labels": map[string]any{"state": "pending", "pool": ""}},
			"running":   map[string]any{"name": "myserver_requests", "labels": map[string]any{"state": "active"}},
			"kvUsage":   map[string]any{"name": "myserver:kv_percent", "scale": 0.01},
			"kvUsed":    metric("used"),
			"kvTotal":   map[string]any{"name": "total", "scale": 16},
			"blockSize": map[string]any{"name": "myserver_cache_info", "label": "block_size"},
			"numBlocks": metric("total"),
			"lora":      map[string]any{"name": "myserver_lora", "runningLabel": "running", "waitingLabel": "waiting", "maxLabel": "max_lora"},
		})},
		crdCase{name: "built-in map overridden accepted", spec: setField(setField(base(), "spec.schedulers[0].engineType", "tgi"), m0, map[string]any{"kvUsed": metric("a"), "kvTotal": metric("b")})},
		crdCase{name: "custom without a map", spec: custom(nil), field: m0, msg: v1alpha1.MsgCustomMetrics},
		crdCase{name: "custom with blocks alone", spec: custom(map[string]any{"numBlocks": metric("b")}), field: m0, msg: v1alpha1.MsgCustomMetrics},
		crdCase{name: "a map without an engineType", spec: setField(base(), m0, map[string]any{"queue": metric("q")}), field: m0, msg: v1alpha1.MsgMetricsEngine},
		crdCase{name: "kvUsed without kvTotal", spec: custom(map[string]any{"queue": metric("q"), "kvUsed": metric("u")}), field: m0, msg: v1alpha1.MsgKVUsedTotal},
		crdCase{name: "kvTotal alone", spec: custom(map[string]any{"kvTotal": metric("t")}), field: m0, msg: v1alpha1.MsgKVUsedTotal},
		crdCase{name: "metric name", spec: custom(map[string]any{"queue": metric("my-server.queue")}), field: m0 + ".queue.name", msg: match},
		crdCase{name: "metric name too long", spec: custom(map[string]any{"queue": metric(strings.Repeat("q", 257))}), field: m0 + ".queue.name", msg: "256"},
		crdCase{name: "metric without a name", spec: custom(map[string]any{"queue": metric("q"), "running": map[string]any{"labels": map[string]any{"a": "b"}}}),
			field: m0 + ".running.name", msg: "Required value"},
		crdCase{name: "17 label matchers", spec: custom(map[string]any{"queue": map[string]any{"name": "q", "labels": sixteen}}), field: m0 + ".queue.labels", msg: "16"},
		crdCase{name: "scale 0", spec: custom(map[string]any{"kvUsage": map[string]any{"name": "kv", "scale": 0}}), field: m0 + ".kvUsage.scale", msg: "should be greater than 0"},
		crdCase{name: "scale negative", spec: custom(map[string]any{"kvUsage": map[string]any{"name": "kv", "scale": -0.5}}), field: m0 + ".kvUsage.scale", msg: "should be greater than 0"},
		crdCase{name: "scale no number", spec: custom(map[string]any{"kvUsage": map[string]any{"name": "kv", "scale": "lots"}}), field: m0 + ".kvUsage.scale", decode: true},
		crdCase{name: "scale quoted", spec: custom(map[string]any{"kvUsage": map[string]any{"name": "kv", "scale": "0.01"}}), field: m0 + ".kvUsage.scale", msg: "number", schemaOnly: true},
		crdCase{name: "info label", spec: custom(map[string]any{"queue": metric("q"), "blockSize": map[string]any{"name": "i", "label": "block size"}}), field: m0 + ".blockSize.label", msg: match},
		crdCase{name: "lora without runningLabel", spec: custom(map[string]any{"queue": metric("q"), "lora": metric("l")}), field: m0 + ".lora.runningLabel", msg: "Required value"},
		crdCase{name: "lora label", spec: custom(map[string]any{"queue": metric("q"), "lora": map[string]any{"name": "l", "runningLabel": "r", "maxLabel": "max-lora"}}),
			field: m0 + ".lora.maxLabel", msg: match},
	)

	// LoRA adapters
	refuse("spec.schedulers[0].loraAdapters", []any{"x", ""}, "should be at least 1 chars long")
	cases[len(cases)-1].field = "spec.schedulers[0].loraAdapters[1]"
	refuse("spec.schedulers[0].loraAdapters", []any{"x", "x"}, `Duplicate value: "x"`)
	cases[len(cases)-1].field = "spec.schedulers[0].loraAdapters[1]"
	refuse("spec.schedulers[0].loraAdapters", []any{"m"}, "a loraAdapters entry must not be the modelName of a scheduler")
	cases[len(cases)-1].field, cases[len(cases)-1].apiField = "spec.schedulers[0].loraAdapters[0]", "spec.schedulers"
	many := make([]any, 51)
	for i := range many {
		many[i] = "a" + strconv.Itoa(i)
	}
	refuse("spec.schedulers[0].loraAdapters", many, "must have at most 50 items")
	accept("spec.schedulers[0].loraAdapters", many[:50])

	// Two schedulers.
	two := func(b map[string]any) map[string]any {
		spec := base()
		setField(spec, "spec.bbr.enabled", true)
		spec["schedulers"] = append(spec["schedulers"].([]any), b)
		return spec
	}
	sel := map[string]any{"matchLabels": map[string]any{"app": "y"}}
	cases = append(cases,
		crdCase{name: "two schedulers accepted", spec: two(map[string]any{"name": "b", "modelName": "n", "modelSelector": sel, "loraAdapters": []any{"n-sql"}})},
		crdCase{name: "bbr off with two schedulers", spec: setField(two(map[string]any{"name": "b", "modelName": "n", "modelSelector": sel}), "spec.bbr.enabled", false),
			field: "spec.bbr.enabled", apiField: "spec", msg: "bbr.enabled must be true when there is more than one scheduler"},
		crdCase{name: "duplicate scheduler name", spec: two(map[string]any{"name": "a", "modelName": "n", "modelSelector": sel}),
			field: "spec.schedulers[1].name", apiField: "spec.schedulers[1]", msg: "Duplicate value"},
		crdCase{name: "duplicate model", spec: two(map[string]any{"name": "b", "modelName": "m", "modelSelector": sel}),
			field: "spec.schedulers[1].modelName", apiField: "spec", msg: "modelName must be unique across schedulers"},
		crdCase{name: "adapter is another scheduler's model", spec: two(map[string]any{"name": "b", "modelName": "n", "modelSelector": sel, "loraAdapters": []any{"m"}}),
			field: "spec.schedulers[1].loraAdapters[0]", apiField: "spec.schedulers", msg: "a loraAdapters entry must not be the modelName of a scheduler"},
		crdCase{name: "model is an earlier scheduler's adapter", spec: setField(two(map[string]any{"name": "b", "modelName": "n", "modelSelector": sel}), "spec.schedulers[0].loraAdapters", []any{"n"}),
			field: "spec.schedulers[1].modelName", apiField: "spec.schedulers", msg: "a loraAdapters entry must not be the modelName of a scheduler"},
	)
	refuse("spec.schedulers", []any{}, "should have at least 1 items")
	refuse("spec.schedulers", nil, "Required value")
	lots := make([]any, 101)
	for i := range lots {
		lots[i] = map[string]any{"name": fmt.Sprintf("s%d", i), "modelName": fmt.Sprintf("m%d", i), "modelSelector": sel}
	}
	refuse("spec.schedulers", lots, "must have at most 100 items")
	cases[len(cases)-1].spec["bbr"] = map[string]any{"enabled": true}

	// auth, tls, diagnostics, buffers
	hash := "sha256:" + strings.Repeat("ab", 32)
	refuse("spec.gateway.maxBufferedBytes", 1<<20-1, atLeast+"1048576")
	accept("spec.gateway.maxBufferedBytes", 1<<20)
	refuse("spec.auth", map[string]any{}, "no authentication configured")
	accept("spec.auth", map[string]any{"apiKeys": []any{map[string]any{"tenant": "a", "hash": hash}}})
	accept("spec.auth", map[string]any{"allowAnonymous": true})
	refuse("spec.auth.apiKeys", []any{map[string]any{"tenant": "a", "hash": "sk-live-raw-key"}}, match)
	cases[len(cases)-1].field = "spec.auth.apiKeys[0].hash"
	refuse("spec.auth.jwt", map[string]any{"jwksURI": "ftp://idp/keys"}, match)
	cases[len(cases)-1].field = "spec.auth.jwt.jwksURI"
	refuse("spec.auth.jwt", map[string]any{"jwksURI": "https://idp/keys", "refreshInterval": "500ms"}, "must be at least 1s")
	cases[len(cases)-1].field = "spec.auth.jwt.refreshInterval"
	accept("spec.auth.jwt", map[string]any{"jwksURI": "https://idp/keys", "audiences": []any{"kvgate"}, "requiredClaims": []any{map[string]any{"name": "scope", "values": []any{"inference"}}}})
	refuse("spec.auth.jwt", map[string]any{"jwksURI": "https://idp/keys", "leeway": "6m"}, "must be between 0 and 5m0s")
	cases[len(cases)-1].field = "spec.auth.jwt.leeway"
	refuse("spec.auth.jwt", map[string]any{"jwksURI": "https://idp/keys", "fetchTimeout": "0s"}, "must be positive")
	cases[len(cases)-1].field = "spec.auth.jwt.fetchTimeout"
	accept("spec.auth.jwt", map[string]any{"jwksURI": "https://idp/keys", "leeway": "5m", "fetchTimeout": "1ms"})
	refuse("spec.schedulers[0].allowedTenants", []any{"acme"}, v1alpha1.MsgAllowedTenants)
	cases[len(cases)-1].apiField = "spec.schedulers"
	accept("spec.tls", map[string]any{"certFile": "/c", "keyFile": "/k", "minVersion": "1.3"})
	accept("spec.tls", map[string]any{"secretName": "kvgate-tls"})
	refuse("spec.tls", map[string]any{"secretName": "s", "certFile": "/c", "keyFile": "/k"}, "set secretName or certFile and keyFile, not both")
	refuse("spec.tls", map[string]any{"certFile": "/c"}, "certFile and keyFile go together")
	refuse("spec.tls.minVersion", "1.1", enum)
	cases[len(cases)-1].spec = setField(cases[len(cases)-1].spec, "spec.tls.secretName", "s")
	refuse("spec.schedulers[0].backendTLS", map[string]any{"caFile": "/ca"}, "applies only with appProtocol https")
	cases = append(cases, crdCase{name: "backendTLS with https accepted",
		spec: setField(setField(base(), "spec.schedulers[0].appProtocol", "https"), "spec.schedulers[0].backendTLS", map[string]any{"caFile": "/ca", "serverName": "vllm"})})
	refuse("spec.gateway.diagnostics", map[string]any{"expose": true, "tenants": []any{"ops", "ops"}}, `Duplicate value: "ops"`)
	cases[len(cases)-1].field = "spec.gateway.diagnostics.tenants[1]"

	// objectives
	objective := func(name string, priority int) map[string]any {
		return map[string]any{"name": name, "priority": priority}
	}
	for _, tc := range []struct {
		field    string
		name     string
		priority int
		msg      string
	}{
		{"priority", "chat", 1001, atMost + "1000"},
		{"priority", "chat", -1001, atLeast + "-1000"},
		{"", "chat", 1000, ""},
		{"", "chat", -1000, ""},
		{"name", "", 0, "should be at least 1 chars long"},
		{"name", strings.Repeat("o", 254), 0, "253"},
		{"", strings.Repeat("o", 253), 0, ""},
	} {
		c := crdCase{name: fmt.Sprintf("objective %.10q priority %d", tc.name, tc.priority), spec: setField(base(), "spec.objectives", []any{objective(tc.name, tc.priority)}), msg: tc.msg}
		if tc.field != "" {
			c.field = "spec.objectives[0]." + tc.field
		}
		cases = append(cases, c)
	}
	cases = append(cases, crdCase{name: "duplicate objective", spec: setField(base(), "spec.objectives", []any{objective("chat", 1), objective("chat", 2)}),
		field: "spec.objectives[1].name", apiField: "spec.objectives[1]", msg: "Duplicate value"})
	lotsObj := make([]any, 101)
	for i := range lotsObj {
		lotsObj[i] = objective(fmt.Sprintf("o%d", i), 0)
	}
	refuse("spec.objectives", lotsObj, "must have at most 100 items")

	// What kvgate cannot decode, the API server must not store.
	for _, v := range []string{"abc", "30", "1m30", "5 s", "9999999999h"} {
		spec := setField(setField(setField(base(), "spec.schedulers[0].routeTimeout", v), "spec.gateway.firstByteTimeout", v), "spec.gateway.responseHeaderTimeout", v)
		cases = append(cases, crdCase{name: "duration " + v, spec: spec, field: "spec.schedulers[0].routeTimeout", decode: true})
	}
	for _, v := range []string{"1m30s", "0", "250ms", "1.5h", ".5s", "2562047h"} {
		spec := setField(setField(setField(base(), "spec.schedulers[0].routeTimeout", v), "spec.gateway.firstByteTimeout", v), "spec.gateway.responseHeaderTimeout", v)
		cases = append(cases, crdCase{name: "duration " + v + " accepted", spec: spec})
	}
	for _, f := range []string{"spec.schedulers[0].weights.queue", "spec.schedulers[0].saturation.queueDepth", "spec.gateway.maxInFlightPerEndpoint", "spec.gateway.scrape.unhealthyAfter"} {
		refuse(f, int64(1)<<31, atMost+"2147483647")
		cases[len(cases)-1].decode = true
		accept(f, int64(1)<<31-1)
	}

	// The typed documents of the first TestCRDValidation, as a Go client sends them.
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
	neg := int32(-1)
	cases = append(cases,
		crdCase{name: "typed valid", spec: typed(t, v1alpha1.SchedulerSpec{Name: "a", ModelName: "m", ModelSelector: selector})},
		crdCase{name: "typed negative weight", spec: typed(t, v1alpha1.SchedulerSpec{Name: "a", ModelName: "m", ModelSelector: selector, Weights: &v1alpha1.Weights{Queue: &neg}}),
			field: "spec.schedulers[0].weights.queue", msg: atLeast + "0"},
		crdCase{name: "typed selector and poolRef", spec: typed(t, v1alpha1.SchedulerSpec{Name: "a", ModelName: "m", ModelSelector: selector, PoolRef: "pool"}),
			field: "spec.schedulers[0]", msg: v1alpha1.MsgEndpointSource},
		crdCase{name: "typed no schedulers", spec: typed(t), field: "spec.schedulers", msg: "Required value"},
	)

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			doc := document(tc.spec)
			apiErr := k.c.Create(context.Background(), &unstructured.Unstructured{Object: doc})
			kvgate := tc
			if tc.schemaOnly {
				kvgate.field = ""
			}
			kvgateErr := kvgateRefuses(t, doc, kvgate)
			switch {
			case tc.field == "" && apiErr != nil:
				t.Errorf("the API server refused it: %v", apiErr)
			case kvgate.field == "" && kvgateErr != "":
				t.Errorf("kvgate refused it: %s", kvgateErr)
			case tc.field == "":
			case apiErr == nil:
				t.Errorf("the API server accepted it; kvgate says %s", kvgateErr)
			default:
				field := tc.field
				if tc.apiField != "" {
					field = tc.apiField
				}
				if !strings.Contains(apiErr.Error(), field+":") || !strings.Contains(apiErr.Error(), tc.msg) {
					t.Errorf("the API server's error does not name %s and say %q: %v", field, tc.msg, apiErr)
				}
			}
		})
	}

	// The closed schema: an unknown field is an error for a strict client.
	u := &unstructured.Unstructured{Object: document(setField(base(), "spec.schedulers[0].scoreWeights", map[string]any{}))}
	if err := k.c.Create(context.Background(), u, client.FieldValidation("Strict")); err == nil || !strings.Contains(err.Error(), "scoreWeights") {
		t.Fatalf("unknown field: %v", err)
	}
}

// TestCRDKvgateOnly: what the schema cannot check (see TestCRDValidation) is
// accepted by the API server and refused by kvgate. A case failing here for the
// API server's refusal means the schema caught up: move it to TestCRDValidation.
func TestCRDKvgateOnly(t *testing.T) {
	k := startCluster(t)
	k.namespace(t, "crd")
	sel := map[string]any{"matchLabels": map[string]any{"app": "y"}}
	spec := setField(base(), "spec.bbr.enabled", true)
	setField(spec, "spec.schedulers[0].loraAdapters", []any{"sql"})
	spec["schedulers"] = append(spec["schedulers"].([]any), map[string]any{"name": "b", "modelName": "n", "modelSelector": sel, "loraAdapters": []any{"sql"}})
	doc := document(spec)
	if err := k.c.Create(context.Background(), &unstructured.Unstructured{Object: doc}); err != nil {
		t.Errorf("the API server refused an adapter in two schedulers: %v", err)
	}
	if got := kvgateRefuses(t, doc, crdCase{field: "spec.schedulers[1].loraAdapters[0]"}); !strings.Contains(got, "already served by spec.schedulers[0].loraAdapters[0]") {
		t.Errorf("kvgate: %q", got)
	}
	spec = setField(setField(base(), "spec.schedulers[0].engineType", "custom"), "spec.schedulers[0].metrics",
		map[string]any{"queue": map[string]any{"name": "q", "labels": map[string]any{"pool-name": "a"}}})
	doc = document(spec)
	if err := k.c.Create(context.Background(), &unstructured.Unstructured{Object: doc}); err != nil {
		t.Errorf("the API server refused a label matcher's name: %v", err)
	}
	if got := kvgateRefuses(t, doc, crdCase{field: "spec.schedulers[0].metrics.queue.labels.pool-name"}); !strings.Contains(got, "is not a Prometheus label name") {
		t.Errorf("kvgate: %q", got)
	}
}

// short names a value in a case's name.
func short(v any) string {
	if l, ok := v.([]any); ok && len(l) > 3 {
		return fmt.Sprintf("[%d items]", len(l))
	}
	return fmt.Sprint(v)
}

// base is a valid spec: one scheduler selecting app=x. (A case must be valid
// but for what it tests: the API server skips the CEL rules of an object
// that breaks its schema.)
func base() map[string]any {
	return map[string]any{"bbr": map[string]any{"enabled": true}, "schedulers": []any{map[string]any{"name": "a", "modelName": "m", "modelSelector": map[string]any{"matchLabels": map[string]any{"app": "x"}}}}}
}

// typed is the spec of igwc(schedulers), as a typed client would send it.
func typed(t *testing.T, schedulers ...v1alpha1.SchedulerSpec) map[string]any {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(igwc("crd", "typed", schedulers...))
	if err != nil {
		t.Fatal(err)
	}
	return obj["spec"].(map[string]any)
}

// document wraps a spec into an InferenceGatewayConfig of namespace crd.
func document(spec map[string]any) map[string]any {
	return map[string]any{
		"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.Kind,
		"metadata": map[string]any{"generateName": "crd-", "namespace": "crd"},
		"spec":     spec,
	}
}

// setField puts v at field (a path like spec.schedulers[0].weights.queue) of spec,
// making the objects on the way; a nil v removes the field. It returns spec.
func setField(spec map[string]any, field string, v any) map[string]any {
	parts := strings.Split(strings.TrimPrefix(field, "spec."), ".")
	m := spec
	for i, p := range parts {
		key, index, list := strings.Cut(p, "[")
		last := i == len(parts)-1
		if list {
			n, _ := strconv.Atoi(strings.TrimSuffix(index, "]"))
			items, _ := m[key].([]any)
			for len(items) <= n {
				items = append(items, map[string]any{})
			}
			m[key] = items
			if last {
				items[n] = v
				return spec
			}
			m = items[n].(map[string]any)
			continue
		}
		if last {
			if v == nil {
				delete(m, key)
			} else {
				m[key] = v
			}
			return spec
		}
		next, ok := m[key].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[key] = next
		}
		m = next
	}
	return spec
}

// kvgateRefuses is why kvgate refuses doc ("" when it accepts it), checking
// that its two readers agree: decoding as the controller's client does, then
// Validate; and config.Parse, as `kvgate serve --config` reads a file. A
// refusal must name tc.field (or, with tc.decode, come from decoding).
func kvgateRefuses(t *testing.T, doc map[string]any, tc crdCase) string {
	t.Helper()
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	_, fileErr := config.Parse("igwc.json", data)
	var cfg v1alpha1.InferenceGatewayConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		if !tc.decode {
			t.Errorf("kvgate cannot decode it: %v", err)
		}
		if fileErr == nil {
			t.Errorf("config.Parse accepted what does not decode")
		}
		return "cannot decode: " + err.Error()
	}
	if tc.decode {
		t.Errorf("kvgate decodes it")
	}
	errs := cfg.Validate()
	if (len(errs) == 0) != (fileErr == nil) {
		t.Errorf("Validate() = %v but config.Parse: %v", errs, fileErr)
	}
	if len(errs) == 0 {
		return ""
	}
	var out []string
	named := false
	for _, e := range errs {
		out = append(out, e.Error())
		named = named || e.Path == tc.field
	}
	if tc.field != "" && !named {
		t.Errorf("Validate() does not name %s: %v", tc.field, errs)
	}
	return strings.Join(out, "; ")
}
