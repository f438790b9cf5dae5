package kube

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/certs"
)

// Certificates is a gateway serving spec.tls: an Applier that implements it
// gets the certificate of the Secret spec.tls.secretName names, at first and
// on every change. One that does not load keeps the previous certificate.
type Certificates interface {
	SetCertificate(secret string, certPEM, keyPEM []byte) error
	// ServesTLS says whether the gateway serves spec.tls at all (kvgate
	// serve does; epp's listener has its own flags).
	ServesTLS() bool
}

// TLSCondition is the status condition on the Secret spec.tls names.
const TLSCondition = "TLSReady"

// secretWatch follows the one Secret spec.tls names, with an informer of its
// own that lists and watches it by name (a metadata.name field selector): no
// other Secret is read or cached, so RBAC can grant just that name.
type secretWatch struct {
	ctx  context.Context // the controller's
	cs   kubernetes.Interface
	ns   string
	sink Certificates
	log  *slog.Logger
	kick func() // re-runs the reconcile, so that status follows

	mu    sync.Mutex
	name  string
	stop  context.CancelFunc
	state secretState
}

// secretState is what became of the Secret.
type secretState struct {
	synced   bool   // listed at least once
	found    bool   // the Secret exists
	problem  string // why its certificate did not load, or why it cannot be read
	loaded   bool   // a certificate of this Secret serves
	serial   string // of the certificate serving
	notAfter metav1.Time
}

// follow watches the named Secret from now on ("" watches none).
func (w *secretWatch) follow(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if name == w.name {
		return
	}
	if w.stop != nil {
		w.stop()
		w.stop = nil
	}
	w.name, w.state = name, secretState{}
	if name == "" {
		return
	}
	ctx, stop := context.WithCancel(w.ctx)
	w.stop = stop
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	secrets := w.cs.CoreV1().Secrets(w.ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return secrets.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return secrets.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.Secret{}, 0, cache.Indexers{})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.changed(name, o) },
		UpdateFunc: func(_, o any) { w.changed(name, o) },
		DeleteFunc: func(any) { w.gone(name) },
	})
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) { w.failed(name, err) })
	go inf.RunWithContext(ctx)
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			w.update(name, func(s *secretState) {
				s.synced, s.found = true, len(inf.GetStore().List()) > 0
				if !s.found {
					w.log.Warn("the Secret spec.tls names does not exist", "secret", w.ns+"/"+name)
				}
			})
		}
	}()
	w.log.Info("watching the TLS Secret", "secret", w.ns+"/"+name)
}

// update changes the state of the named Secret, if it is still the one
// followed, and re-runs the reconcile.
func (w *secretWatch) update(name string, f func(*secretState)) {
	w.mu.Lock()
	if name != w.name {
		w.mu.Unlock()
		return
	}
	f(&w.state)
	w.mu.Unlock()
	w.kick()
}

func (w *secretWatch) changed(name string, o any) {
	s, ok := o.(*corev1.Secret)
	if !ok {
		return
	}
	crt, key := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
	var err error
	if len(crt) == 0 || len(key) == 0 {
		err = fmt.Errorf("it has no %s and %s (a kubernetes.io/tls Secret has both)", corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	} else {
		err = w.sink.SetCertificate(name, crt, key)
	}
	w.update(name, func(st *secretState) {
		st.synced, st.found, st.problem = true, true, ""
		if err != nil {
			st.problem = err.Error()
			w.log.Error("the TLS Secret's certificate did not load", "secret", w.ns+"/"+name, "err", err)
			return
		}
		if c, err := certs.Parse(crt, key); err == nil {
			st.loaded, st.serial, st.notAfter = true, c.Leaf.SerialNumber.String(), metav1.NewTime(c.Leaf.NotAfter)
		}
	})
}

func (w *secretWatch) gone(name string) {
	w.update(name, func(st *secretState) {
		st.found, st.problem = false, ""
		w.log.Warn("the TLS Secret was deleted; its last certificate keeps serving", "secret", w.ns+"/"+name)
	})
}

func (w *secretWatch) failed(name string, err error) {
	w.update(name, func(st *secretState) {
		w.log.Warn("watching the TLS Secret", "secret", w.ns+"/"+name, "err", err)
		if st.synced && !apierrors.IsForbidden(err) {
			return // a watch broken after the Secret was read: the informer lists again
		}
		switch {
		case apierrors.IsForbidden(err):
			st.problem = fmt.Sprintf("kvgate may not read it: grant get, list and watch on Secret %s (the Helm chart does for tls.secretName)", name)
		default:
			st.problem = "reading it: " + err.Error()
		}
	})
}

// condition is the TLSReady condition, nil when no Secret is followed; and
// whether no certificate of it serves (the listener refuses handshakes).
func (w *secretWatch) condition() (*metav1.Condition, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.name == "" {
		return nil, false
	}
	st := w.state
	ref := fmt.Sprintf("spec.tls.secretName %q", w.name)
	after := "TLS handshakes are refused until it is"
	if st.loaded {
		after = fmt.Sprintf("the certificate loaded before (serial %s, expires %s) keeps serving", st.serial, st.notAfter.UTC().Format("2006-01-02T15:04:05Z"))
	}
	c := &metav1.Condition{Type: TLSCondition, Status: metav1.ConditionFalse}
	switch {
	case st.problem != "" && !st.found && !st.synced:
		c.Reason, c.Message = "SecretUnreadable", fmt.Sprintf("%s: %s; %s", ref, st.problem, after)
	case !st.synced:
		c.Reason, c.Message = "Pending", fmt.Sprintf("%s: not read yet; %s", ref, after)
	case !st.found:
		c.Reason, c.Message = "SecretNotFound", fmt.Sprintf("%s: no Secret of that name in namespace %s; %s", ref, w.ns, after)
	case st.problem != "":
		c.Reason, c.Message = "InvalidSecret", fmt.Sprintf("%s: %s; %s", ref, st.problem, after)
	default:
		c.Status, c.Reason = metav1.ConditionTrue, "CertificateLoaded"
		c.Message = fmt.Sprintf("serving the certificate of Secret %s (serial %s, expires %s)", w.name, st.serial, st.notAfter.UTC().Format("2006-01-02T15:04:05Z"))
	}
	return c, !st.loaded
}

// tlsSecret is the Secret a configuration's spec.tls names, "" for none.
func tlsSecret(cfg *v1alpha1.InferenceGatewayConfig) string {
	if cfg == nil || cfg.Spec.TLS == nil {
		return ""
	}
	return cfg.Spec.TLS.SecretName
}

// withTLS completes a status with the TLSReady condition when spec.tls names
// a Secret; while no certificate of it serves, Ready is false: the listener
// refuses every handshake.
func (r *Reconciler) withTLS(st v1alpha1.InferenceGatewayConfigStatus, ready metav1.Condition) v1alpha1.InferenceGatewayConfigStatus {
	var c *metav1.Condition
	none := false
	if r.secrets != nil {
		c, none = r.secrets.condition()
	}
	if c == nil {
		st.Conditions = append(st.Conditions, ready)
		return st
	}
	c.ObservedGeneration = ready.ObservedGeneration
	if none {
		ready = metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NoCertificate", ObservedGeneration: ready.ObservedGeneration, Message: trim(c.Message)}
	}
	c.Message = trim(c.Message)
	st.Conditions = append(st.Conditions, ready, *c)
	return st
}
