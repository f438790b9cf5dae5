package v1alpha1

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults applied where a field is unset.
const (
	DefaultTargetPort          = 8000
	DefaultMaxRequestBodyBytes = 256 << 20
	DefaultMaxAttempts         = 3
	DefaultQueueTimeout        = time.Second
	DefaultConnectTimeout      = 2 * time.Second
	DefaultRetryBufferBytes    = 8 << 20
	DefaultSaturationQueue     = 5
	DefaultSaturationKVPercent = 80
	DefaultPrefixBlockChars    = 64
	DefaultPrefixMaxBlocks     = 256
	DefaultPrefixCapacity      = 31_250
	DefaultScrapeInterval      = 50 * time.Millisecond
	DefaultScrapeTimeout       = time.Second
	DefaultStaleAfter          = 2 * time.Second
	DefaultUnhealthyAfter      = 3
)

// App protocols of model servers.
const (
	AppProtocolHTTP = "http"
	AppProtocolH2C  = "kubernetes.io/h2c"
)

const (
	maxSchedulers    = 100
	maxObjectives    = 100
	maxAdapters      = 50
	maxBodyLimit     = 1 << 30
	maxAttemptsLimit = 10
)

// Known names for the enumerated fields.
var (
	Pickers     = []string{"kvgate", "least-request", "round-robin", "random", "power-of-two"}
	Profiles    = []string{"kvgate", "chat", "batch", "gie-default"}
	EngineTypes = []string{"vllm", "sglang", "trtllm", "triton"}
)

// FieldError is one problem with a document, at a field path such as
// spec.schedulers[1].modelName.
type FieldError struct {
	Path    string
	Message string
}

func (e FieldError) Error() string { return e.Path + ": " + e.Message }

// Validate checks the spec and returns every problem found, in document order.
func (c *InferenceGatewayConfig) Validate() []FieldError {
	var errs []FieldError
	add := func(path, format string, args ...any) {
		errs = append(errs, FieldError{Path: path, Message: fmt.Sprintf(format, args...)})
	}
	s := &c.Spec
	if n := len(s.Schedulers); n == 0 || n > maxSchedulers {
		add("spec.schedulers", "must list between 1 and %d schedulers, found %d", maxSchedulers, n)
	}
	if len(s.Schedulers) > 1 && !s.BBR.Enabled {
		add("spec.bbr.enabled", "must be true when there is more than one scheduler: the model in the body picks the pool")
	}
	if b := s.BBR.MaxRequestBodyBytes; b != nil && (*b < 1024 || *b > maxBodyLimit) {
		add("spec.bbr.maxRequestBodyBytes", "must be between 1024 and %d, got %d", maxBodyLimit, *b)
	}
	if len(s.Objectives) > maxObjectives {
		add("spec.objectives", "lists %d objectives, at most %d allowed", len(s.Objectives), maxObjectives)
	}
	objectives := map[string]int{}
	for i, o := range s.Objectives {
		p := fmt.Sprintf("spec.objectives[%d]", i)
		switch j, dup := objectives[o.Name]; {
		case o.Name == "":
			add(p+".name", "is required")
		case len(o.Name) > 253:
			add(p+".name", "must be at most 253 characters")
		case dup:
			add(p+".name", "%q is already the name of spec.objectives[%d]", o.Name, j)
		default:
			objectives[o.Name] = i
		}
		if o.Priority < -1000 || o.Priority > 1000 {
			add(p+".priority", "must be between -1000 and 1000, got %d", o.Priority)
		}
	}
	names, models := map[string]int{}, map[string]string{}
	for i, sc := range s.Schedulers {
		p := fmt.Sprintf("spec.schedulers[%d]", i)
		switch {
		case sc.Name == "":
			add(p+".name", "is required")
		case !isDNSLabel(sc.Name):
			add(p+".name", "%q must be a DNS label (lower-case letters, digits and '-', at most 63)", sc.Name)
		default:
			if j, dup := names[sc.Name]; dup {
				add(p+".name", "%q is already the name of spec.schedulers[%d]", sc.Name, j)
			}
			names[sc.Name] = i
		}
		if sc.ModelName == "" {
			add(p+".modelName", "is required")
		} else if other, dup := models[sc.ModelName]; dup {
			add(p+".modelName", "%q is already served by %s", sc.ModelName, other)
		} else {
			models[sc.ModelName] = p
		}
		if len(sc.LoRAAdapters) > maxAdapters {
			add(p+".loraAdapters", "lists %d adapters, at most %d allowed", len(sc.LoRAAdapters), maxAdapters)
		}
		for j, a := range sc.LoRAAdapters {
			ap := fmt.Sprintf("%s.loraAdapters[%d]", p, j)
			if a == "" {
				add(ap, "must not be empty")
			} else if other, dup := models[a]; dup {
				add(ap, "%q is already served by %s", a, other)
			} else {
				models[a] = ap
			}
		}
		if sc.ModelSelector == nil && len(sc.Endpoints) == 0 && sc.PoolRef == "" {
			add(p, "needs a modelSelector or poolRef (Kubernetes) or static endpoints")
		}
		for j, ep := range sc.Endpoints {
			if err := checkHostPort(ep); err != nil {
				add(fmt.Sprintf("%s.endpoints[%d]", p, j), "%q: %v", ep, err)
			}
		}
		if sc.TargetPort < 0 || sc.TargetPort > 65535 {
			add(p+".targetPort", "must be a port between 1 and 65535, got %d", sc.TargetPort)
		}
		if sc.AppProtocol != "" && sc.AppProtocol != AppProtocolHTTP && sc.AppProtocol != AppProtocolH2C {
			add(p+".appProtocol", "%q is not %s or %s", sc.AppProtocol, AppProtocolHTTP, AppProtocolH2C)
		}
		checkEnum(add, p+".engineType", sc.EngineType, EngineTypes)
		checkEnum(add, p+".picker", sc.Picker, Pickers)
		checkEnum(add, p+".profile", sc.Profile, Profiles)
		if w := sc.Weights; w != nil {
			for name, v := range w.ByName() {
				if v != nil && *v < 0 {
					add(p+".weights."+name, "must be ≥ 0, got %d", *v)
				}
			}
		}
		if st := sc.Saturation; st != nil {
			if v := st.QueueDepth; v != nil && *v < 1 {
				add(p+".saturation.queueDepth", "must be ≥ 1, got %d", *v)
			}
			if v := st.KVCachePercent; v != nil && (*v < 1 || *v > 100) {
				add(p+".saturation.kvCachePercent", "must be between 1 and 100, got %d", *v)
			}
		}
		if px := sc.Prefix; px != nil {
			if v := px.BlockChars; v != nil && (*v < 8 || *v > 4096) {
				add(p+".prefix.blockChars", "must be between 8 and 4096, got %d", *v)
			}
			if v := px.MaxBlocks; v != nil && (*v < 1 || *v > 4096) {
				add(p+".prefix.maxBlocks", "must be between 1 and 4096, got %d", *v)
			}
			if v := px.CapacityBlocks; v != nil && *v < 1 {
				add(p+".prefix.capacityBlocks", "must be ≥ 1, got %d", *v)
			}
		}
		if sc.RouteTimeout != nil && sc.RouteTimeout.Duration < 0 {
			add(p+".routeTimeout", "must not be negative")
		}
	}
	g := s.Gateway
	if g.MaxAttempts != nil && (*g.MaxAttempts < 1 || *g.MaxAttempts > maxAttemptsLimit) {
		add("spec.gateway.maxAttempts", "must be between 1 and %d, got %d", maxAttemptsLimit, *g.MaxAttempts)
	}
	if g.MaxInFlightPerEndpoint != nil && *g.MaxInFlightPerEndpoint < 0 {
		add("spec.gateway.maxInFlightPerEndpoint", "must be ≥ 0")
	}
	if g.RetryBufferBytes != nil && *g.RetryBufferBytes < 0 {
		add("spec.gateway.retryBufferBytes", "must be ≥ 0")
	}
	if g.QueueTimeout != nil && (g.QueueTimeout.Duration < 0 || g.QueueTimeout.Duration > time.Minute) {
		add("spec.gateway.queueTimeout", "must be between 0s and 1m")
	}
	if g.ConnectTimeout != nil && (g.ConnectTimeout.Duration <= 0 || g.ConnectTimeout.Duration > time.Minute) {
		add("spec.gateway.connectTimeout", "must be between 1ns and 1m")
	}
	if g.ResponseHeaderTimeout != nil && g.ResponseHeaderTimeout.Duration < 0 {
		add("spec.gateway.responseHeaderTimeout", "must not be negative")
	}
	if sp := g.Scrape; sp != nil {
		if d := sp.Interval; d != nil && (d.Duration < 10*time.Millisecond || d.Duration > time.Minute) {
			add("spec.gateway.scrape.interval", "must be between 10ms and 1m, got %s", d.Duration)
		}
		if d := sp.Timeout; d != nil && (d.Duration <= 0 || d.Duration > time.Minute) {
			add("spec.gateway.scrape.timeout", "must be between 1ns and 1m, got %s", d.Duration)
		}
		if d := sp.StaleAfter; d != nil && d.Duration < g.ScrapeInterval() {
			add("spec.gateway.scrape.staleAfter", "must be at least the scrape interval (%s), got %s", g.ScrapeInterval(), d.Duration)
		}
		if v := sp.UnhealthyAfter; v != nil && *v < 1 {
			add("spec.gateway.scrape.unhealthyAfter", "must be ≥ 1, got %d", *v)
		}
	}
	// Errors in a stable, document-like order.
	slices.SortStableFunc(errs, func(a, b FieldError) int { return strings.Compare(a.Path, b.Path) })
	return errs
}

func checkEnum(add func(string, string, ...any), path, v string, known []string) {
	if v != "" && !slices.Contains(known, v) {
		add(path, "%q is not one of %s", v, strings.Join(known, ", "))
	}
}

func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if host == "" {
		return fmt.Errorf("missing host")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port must be between 1 and 65535")
	}
	return nil
}

func isDNSLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range s {
		lower, digit := c >= 'a' && c <= 'z', c >= '0' && c <= '9'
		if !lower && !digit && c != '-' {
			return false
		}
	}
	return true
}
