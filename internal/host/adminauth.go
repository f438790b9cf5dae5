package host

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
)

// The admin listener's authentication modes (AdminOptions.Auth).
const (
	// AdminAuthNone serves the debug pages to loopback clients only (the
	// same host, an SSH tunnel, kubectl port-forward).
	AdminAuthNone = "none"
	// AdminAuthToken wants the bearer token held in AdminOptions.TokenFile.
	AdminAuthToken = "token"
	// AdminAuthKubernetes has the Kubernetes API server authenticate the
	// bearer token (TokenReview) and authorize the request's path and verb
	// (SubjectAccessReview), as controller-runtime's metrics filters do.
	AdminAuthKubernetes = "kubernetes"
)

// AdminOptions secure the admin listener. /healthz, /readyz and /summary
// (kvgate global's heartbeat) always answer everyone; /metrics does too unless
// Metrics is set with an authentication mode.
type AdminOptions struct {
	// Auth is the authentication of /debug/* (AdminAuthNone when empty).
	Auth string
	// TokenFile holds the token of AdminAuthToken, reread when it changes.
	TokenFile string
	// Kube reaches the API server that reviews tokens in AdminAuthKubernetes.
	Kube *rest.Config
	// Metrics puts /metrics behind the same authentication (not in
	// AdminAuthNone, where Prometheus scrapes from elsewhere).
	Metrics bool
	// Pprof serves Go's profiler under /debug/pprof/.
	Pprof bool
	// Hosts are the names, besides localhost and IP addresses, that the Host
	// header of a page a browser may open (/ui/, /debug/*) may carry: other
	// names could be an attacker's, rebound to this address.
	Hosts []string
}

// Bounds of the Kubernetes reviews. The good answer's lifetime is
// controller-runtime's authentication cache TTL; a refusal is kept shorter so
// that a binding just granted takes effect soon.
const (
	reviewAllowTTL   = time.Minute
	reviewDenyTTL    = 10 * time.Second
	reviewCacheSize  = 4096
	reviewTimeout    = 10 * time.Second
	reviewsInFlight  = 16
	tokenFileRecheck = time.Second
)

// AdminGate decides who reads an admin listener's protected pages.
type AdminGate struct {
	opts  AdminOptions
	log   *slog.Logger
	token *tokenFile
	kube  *kubeReviewer
	hosts map[string]bool
	// broken, when set, is why the options did not hold: nothing is admitted.
	broken error
}

// NewAdminGate is the gate o describes. When o does not hold, it returns why
// and a gate that admits nobody to protected pages, saying why (the caller
// refuses to start).
func NewAdminGate(o AdminOptions, log *slog.Logger) (*AdminGate, error) {
	g, err := newAdminGate(o, log)
	if err != nil {
		return &AdminGate{opts: AdminOptions{Auth: AdminAuthToken}, broken: err}, err
	}
	return g, nil
}

func newAdminGate(o AdminOptions, log *slog.Logger) (*AdminGate, error) {
	g := &AdminGate{opts: o, log: log, hosts: map[string]bool{}}
	for _, h := range o.Hosts {
		g.hosts[strings.ToLower(strings.TrimSuffix(h, "."))] = true
	}
	switch o.Auth {
	case "", AdminAuthNone:
		g.opts.Auth = AdminAuthNone
	case AdminAuthToken:
		if o.TokenFile == "" {
			return nil, errors.New("admin authentication token: no token file")
		}
		g.token = &tokenFile{path: o.TokenFile, log: log}
		if err := g.token.load(); err != nil {
			return nil, err
		}
	case AdminAuthKubernetes:
		if o.Kube == nil {
			return nil, errors.New("admin authentication kubernetes: no cluster to review tokens")
		}
		k, err := newKubeReviewer(o.Kube)
		if err != nil {
			return nil, err
		}
		g.kube = k
	default:
		return nil, fmt.Errorf("admin authentication %q: want %s, %s or %s", o.Auth, AdminAuthNone, AdminAuthToken, AdminAuthKubernetes)
	}
	return g, nil
}

// browsable wraps a page a browser may open: its Host must be this machine's,
// an address or a configured name (DNS rebinding would otherwise let any web
// page a local user visits read it).
func (g *AdminGate) browsable(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.hostAllowed(r.Host) {
			http.Error(w, "kvgate admin: host "+r.Host+" not allowed (add it with --admin-host)", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// protected wraps a page that shows the configuration, the fleet or
// profiles: browsable, and read only by whom the authentication mode admits.
func (g *AdminGate) protected(next http.Handler) http.Handler {
	return g.browsable(g.authenticated(next))
}

// authenticated wraps a handler in the authentication mode (for /metrics,
// which machines read by address, without the Host check).
func (g *AdminGate) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if status, msg := g.admit(r); status != http.StatusOK {
			if status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="kvgate admin"`)
			}
			http.Error(w, "kvgate admin: "+msg, status)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// admit is the authentication mode's answer: 200 or the status to refuse
// with and why.
func (g *AdminGate) admit(r *http.Request) (int, string) {
	if g.broken != nil {
		return http.StatusServiceUnavailable, g.broken.Error()
	}
	if g.opts.Auth == AdminAuthNone {
		if isLoopback(r.RemoteAddr) {
			return http.StatusOK, ""
		}
		return http.StatusForbidden, "without --admin-auth this page answers loopback clients only (kubectl port-forward, an SSH tunnel)"
	}
	token, ok := bearer(r)
	if !ok {
		return http.StatusUnauthorized, "a bearer token is required"
	}
	if g.token != nil {
		if g.token.matches(token) {
			return http.StatusOK, ""
		}
		return http.StatusUnauthorized, "wrong token"
	}
	verb := strings.ToLower(r.Method)
	if r.Method == http.MethodHead {
		verb = "get"
	}
	return g.kube.review(r.Context(), token, r.URL.Path, verb)
}

// hostAllowed reports whether a Host header names this machine, an address
// or a configured name.
func (g *AdminGate) hostAllowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || net.ParseIP(host) != nil {
		return true
	}
	return g.hosts[host]
}

func isLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// bearer is the request's bearer token.
func bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	return token, true
}

// tokenFile is a static token read from a file and read again, at most every
// tokenFileRecheck, when it changed: a rotated Secret takes effect without a
// restart. Only its digest is kept, compared in constant time.
type tokenFile struct {
	path string
	log  *slog.Logger

	digest atomic.Pointer[[sha256.Size]byte]
	mu     sync.Mutex // one reader at a time
	next   time.Time
	seen   []byte
}

// load reads the file; its error is the caller's at startup.
func (f *tokenFile) load() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.read()
}

func (f *tokenFile) read() error {
	f.next = time.Now().Add(tokenFileRecheck)
	raw, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("admin token: %w", err)
	}
	if bytes.Equal(raw, f.seen) {
		return nil
	}
	f.seen = raw
	token := bytes.TrimSpace(raw)
	if len(token) == 0 {
		return fmt.Errorf("admin token: %s is empty", f.path)
	}
	d := sha256.Sum256(token)
	f.digest.Store(&d)
	return nil
}

// matches compares a token with the file's, reading the file again first when
// it is due. A file that cannot be read keeps the token read last.
func (f *tokenFile) matches(token string) bool {
	if f.mu.TryLock() {
		if time.Now().After(f.next) {
			if err := f.read(); err != nil {
				f.log.Error("admin token not reread; the previous one stays", "err", err)
			}
		}
		f.mu.Unlock()
	}
	want := f.digest.Load()
	got := sha256.Sum256([]byte(token))
	return want != nil && subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// kubeReviewer asks the API server who a token is (TokenReview) and whether
// that user may use a path (SubjectAccessReview on a non-resource URL). Its
// answers are cached briefly, in a bounded cache keyed by the token's digest,
// and at most reviewsInFlight reviews run at once: random tokens must not turn
// the gateway into a flood of reviews.
type kubeReviewer struct {
	authn    authnclient.TokenReviewInterface
	authz    authzclient.SubjectAccessReviewInterface
	cache    *cache.LRUExpireCache
	inFlight chan struct{}
}

// reviewed is a cached answer.
type reviewed struct {
	status int
	msg    string
}

func newKubeReviewer(cfg *rest.Config) (*kubeReviewer, error) {
	an, err := authnclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("admin authentication: %w", err)
	}
	az, err := authzclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("admin authentication: %w", err)
	}
	return &kubeReviewer{authn: an.TokenReviews(), authz: az.SubjectAccessReviews(),
		cache: cache.NewLRUExpireCache(reviewCacheSize), inFlight: make(chan struct{}, reviewsInFlight)}, nil
}

func (k *kubeReviewer) review(ctx context.Context, token, path, verb string) (int, string) {
	d := sha256.Sum256([]byte(token))
	key := string(d[:]) + "\x00" + verb + "\x00" + path
	if v, ok := k.cache.Get(key); ok {
		r := v.(reviewed)
		return r.status, r.msg
	}
	select {
	case k.inFlight <- struct{}{}:
		defer func() { <-k.inFlight }()
	default:
		return http.StatusTooManyRequests, "too many token reviews in flight"
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	r, err := k.ask(ctx, token, path, verb)
	if err != nil {
		// Not cached: the API server's trouble is not the client's answer.
		return http.StatusServiceUnavailable, "cannot review the token: " + err.Error()
	}
	ttl := reviewDenyTTL
	if r.status == http.StatusOK {
		ttl = reviewAllowTTL
	}
	k.cache.Add(key, r, ttl)
	return r.status, r.msg
}

func (k *kubeReviewer) ask(ctx context.Context, token, path, verb string) (reviewed, error) {
	tr, err := k.authn.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return reviewed{}, fmt.Errorf("TokenReview: %w", err)
	}
	if !tr.Status.Authenticated {
		return reviewed{http.StatusUnauthorized, "token not authenticated"}, nil
	}
	u := tr.Status.User
	extra := make(map[string]authzv1.ExtraValue, len(u.Extra))
	for name, v := range u.Extra {
		extra[name] = authzv1.ExtraValue(v)
	}
	sar, err := k.authz.Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: verb},
	}}, metav1.CreateOptions{})
	if err != nil {
		return reviewed{}, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	if !sar.Status.Allowed || sar.Status.Denied {
		return reviewed{http.StatusForbidden, fmt.Sprintf("%s may not %s %s", u.Username, verb, path)}, nil
	}
	return reviewed{http.StatusOK, ""}, nil
}
