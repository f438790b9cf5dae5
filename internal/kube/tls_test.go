package kube

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/certs/certstest"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/servetest"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestTLSSecret: kvgate serve in Kubernetes with spec.tls.secretName, against
// a real kube-apiserver. With the Secret missing the listener refuses
// handshakes (and answers plain HTTP 400, never the API) and status says
// why; the Secret created, the API is served over TLS; rotated under
// traffic, new connections get the new certificate and no request fails; a
// broken Secret, then a deleted one, keep the certificate serving, each
// reported in status.
func TestTLSSecret(t *testing.T) {
	k := startCluster(t)
	const ns = "tls"
	k.namespace(t, ns)
	ips, port := servers(t, 1)
	k.pod(t, ns, "m-0", ips[0], true, map[string]string{"app": "m"})
	target := types.NamespacedName{Namespace: ns, Name: "kvgate"}
	cfg := igwc(ns, "kvgate", v1alpha1.SchedulerSpec{Name: "m", ModelName: model, TargetPort: ptr(int32(port)),
		ModelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "m"}}})
	cfg.Spec.TLS = &v1alpha1.TLSSpec{SecretName: "api-tls"}
	ctx := context.Background()
	if err := k.c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}

	logs := &logtest.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kvgate log:\n%s", logs.String())
		}
	})
	addrs := servetest.Serve(t, host.Options{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DrainTimeout: 5 * time.Second, Logger: log,
		Source: func(ctx context.Context, g *host.Host) error {
			return Start(ctx, k.cfg, Options{Target: target, Gateway: g, Log: log, LeaderElection: true})
		}}, gateway.Options{})

	caOld, caNew := certstest.NewCA(t, "old"), certstest.NewCA(t, "new")
	roots := certstest.Pool(caOld, caNew)
	first, second := caOld.Issue(t), caNew.Issue(t)
	serial := func() (string, error) {
		c, err := tls.Dial("tcp", addrs.API, &tls.Config{RootCAs: roots})
		if err != nil {
			return "", err
		}
		defer func() { _ = c.Close() }()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
	}
	tlsCond := func(reason, text string) func() bool {
		return func() bool {
			c := condition(k.status(t, ns, "kvgate"), TLSCondition)
			return c.Reason == reason && strings.Contains(c.Message, text)
		}
	}

	waittest.Until(t, 10*time.Second, "status: the Secret is missing", func() bool {
		st := k.status(t, ns, "kvgate")
		return tlsCond("SecretNotFound", "handshakes are refused")() && condition(st, "Ready").Reason == "NoCertificate"
	})
	if s, err := serial(); err == nil {
		t.Fatalf("a handshake succeeded with no Secret: serial %s", s)
	}
	readyz := func() int {
		resp, err := http.Get("http://" + addrs.Admin + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := readyz(); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz %d with no certificate, want 503", code)
	}
	resp, err := http.Post("http://"+addrs.API+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"`+model+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") {
		t.Fatalf("plain HTTP with TLS asked: %d %s", resp.StatusCode, body)
	}

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api-tls"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: first.CertPEM, corev1.TLSPrivateKeyKey: first.KeyPEM}}
	if err := k.c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 10*time.Second, "the Secret's certificate served", func() bool {
		s, err := serial()
		return err == nil && s == first.Serial.String()
	})
	if code := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz %d with the certificate loaded", code)
	}
	waittest.Until(t, 10*time.Second, "status: the certificate loaded", func() bool {
		return tlsCond("CertificateLoaded", first.Serial.String())() && condition(k.status(t, ns, "kvgate"), "Ready").Status == metav1.ConditionTrue
	})

	// Traffic while the Secret is rotated.
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	fresh := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	var ok, failed atomic.Int64
	var failures sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, rt := range []http.RoundTripper{tr, fresh, fresh} {
		client := &http.Client{Transport: rt, Timeout: 10 * time.Second}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Post("https://"+addrs.API+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`))
				if err != nil {
					failed.Add(1)
					failures.Store(err.Error(), true)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
					failures.Store(resp.Status, true)
					continue
				}
				ok.Add(1)
			}
		})
	}
	waittest.Until(t, 10*time.Second, "traffic", func() bool { return ok.Load() >= 20 })
	k.setSecret(t, ns, "api-tls", second.CertPEM, second.KeyPEM)
	waittest.Until(t, 10*time.Second, "the rotated certificate served", func() bool {
		s, err := serial()
		return err == nil && s == second.Serial.String()
	})
	before := ok.Load()
	waittest.Until(t, 10*time.Second, "traffic after the rotation", func() bool { return ok.Load() >= before+20 })
	close(stop)
	wg.Wait()
	failures.Range(func(k, _ any) bool {
		t.Errorf("failure: %s", k)
		return true
	})
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed across the rotation", failed.Load(), failed.Load()+ok.Load())
	}

	for _, step := range []struct {
		name, reason, text string
		change             func()
	}{
		{"broken", "InvalidSecret", "keeps serving", func() { k.setSecret(t, ns, "api-tls", []byte("not PEM"), second.KeyPEM) }},
		{"deleted", "SecretNotFound", "keeps serving", func() {
			if err := k.c.Delete(ctx, secret); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(step.name, func(t *testing.T) {
			step.change()
			waittest.Until(t, 10*time.Second, "status: "+step.reason, tlsCond(step.reason, step.text))
			if c := condition(k.status(t, ns, "kvgate"), "Ready"); c.Status != metav1.ConditionTrue {
				t.Fatalf("Ready %s (%s) while a certificate serves", c.Status, c.Message)
			}
			if s, err := serial(); err != nil || s != second.Serial.String() {
				t.Fatalf("serving %s, %v; want the last good certificate %s", s, err, second.Serial)
			}
		})
	}

	// spec.tls removed: TLSReady leaves status in the write that observes
	// the edit, not at some later event.
	k.edit(t, target, func(c *v1alpha1.InferenceGatewayConfig) { c.Spec.TLS = nil })
	var cur v1alpha1.InferenceGatewayConfig
	if err := k.c.Get(ctx, target, &cur); err != nil {
		t.Fatal(err)
	}
	edited := time.Now()
	waittest.Until(t, 5*time.Second, "TLSReady gone from status", func() bool {
		st := k.status(t, ns, "kvgate")
		return st.ObservedGeneration == cur.Generation && meta.FindStatusCondition(st.Conditions, TLSCondition) == nil
	})
	if took := time.Since(edited); took > time.Second {
		t.Errorf("TLSReady left status %v after spec.tls was removed, want within 1s", took)
	}
}

// setSecret replaces a TLS Secret's certificate and key.
func (k *cluster) setSecret(t *testing.T, ns, name string, certPEM, keyPEM []byte) {
	t.Helper()
	var s corev1.Secret
	if err := k.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	s.Data = map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}
	if err := k.c.Update(context.Background(), &s); err != nil {
		t.Fatal(err)
	}
}

// certSink records the certificates handed to a gateway.
type certSink struct {
	mu  sync.Mutex
	got map[string][]byte
}

func (s *certSink) SetCertificate(secret string, certPEM, _ []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got[secret] = certPEM
	return nil
}

func (s *certSink) ServesTLS() bool { return true }

func (s *certSink) cert(secret string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[secret]
}

// TestTLSSecretRBAC: with the Role the Helm chart renders for tls.secretName,
// and nothing more, kvgate reads its Secret (listed and watched by name) and
// no other; another name is reported as unreadable.
func TestTLSSecretRBAC(t *testing.T) {
	helm := testenv.Require(t, testenv.Helm)
	k := startCluster(t)
	const ns = "rbac"
	k.namespace(t, ns)
	out, err := helmCmd(t, helm, "template", "kvgate", chartDir, "--namespace", ns, "--set", "tls.secretName=api-tls").Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	for _, o := range decodeYAML(t, "helm template", out) {
		switch o.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding":
			o.SetNamespace(ns)
			if err := k.c.Create(context.Background(), o); err != nil {
				t.Fatal(err)
			}
		}
	}
	leaf := certstest.NewCA(t, "ca").Issue(t)
	for _, name := range []string{"api-tls", "other"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: leaf.CertPEM, corev1.TLSPrivateKeyKey: leaf.KeyPEM}}
		if err := k.c.Create(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	as := rest.CopyConfig(k.cfg)
	as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":kvgate"}
	cs, err := kubernetes.NewForConfig(as)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The grant is by name: the whole namespace's Secrets stay closed.
	if _, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing every Secret as kvgate: %v, want forbidden", err)
	}
	for _, tc := range []struct {
		name, reason string
		loads        bool
	}{
		{"api-tls", "CertificateLoaded", true},
		{"other", "SecretUnreadable", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := &certSink{got: map[string][]byte{}}
			w := &secretWatch{ctx: ctx, cs: cs, ns: ns, sink: sink, log: quiet, kick: func() {}}
			w.follow(tc.name)
			defer w.follow("")
			waittest.Until(t, 10*time.Second, "status "+tc.reason, func() bool {
				c, _ := w.condition()
				return c != nil && c.Reason == tc.reason
			})
			if got := sink.cert(tc.name) != nil; got != tc.loads {
				t.Fatalf("certificate handed over %t, want %t", got, tc.loads)
			}
			if c, _ := w.condition(); !tc.loads && !strings.Contains(c.Message, "may not read") {
				t.Fatalf("message %q does not say kvgate may not read it", c.Message)
			}
		})
	}
}
