package host_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/testenv"
)

// TestAdminKubernetes: on a real kube-apiserver with RBAC, kvgate running as a
// service account that holds only the shipped kvgate-admin-auth ClusterRole
// admits the token of a user bound to kvgate-admin-reader on /debug/* and
// /metrics, refuses a user without the binding (403) and a token the API
// server does not know (401), and leaves health open.
func TestAdminKubernetes(t *testing.T) {
	env := &envtest.Environment{BinaryAssetsDirectory: testenv.Require(t, testenv.Kube)}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(cfg)
	const ns = "kvgate-system"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The shipped ClusterRoles, from the kustomize base.
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "admin_auth.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(raw, []byte("\n---")) {
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal(doc, &role); err != nil {
			t.Fatal(err)
		}
		if role.Kind != "ClusterRole" {
			continue
		}
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	token := func(sa string) string {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	bind := func(sa, role string) {
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa + "-" + role},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	gateway, reader, stranger := token("kvgate"), token("prometheus"), token("stranger")
	bind("kvgate", "kvgate-admin-auth")
	bind("prometheus", "kvgate-admin-reader")
	// kvgate reviews as its own service account: the shipped rules must do.
	asGateway := rest.AnonymousClientConfig(cfg)
	asGateway.BearerToken = gateway

	g := start(t, config(scheduler("chat", llama, startSim(t, llama, simserver.Options{}).Addr())),
		host.CoreOptions{Admin: host.AdminOptions{Auth: host.AdminAuthKubernetes, Kube: asGateway, Metrics: true}})
	checkAdmin(t, g.AdminURL, []adminCase{
		{"health without token", "/healthz", "", "", 200},
		{"readiness without token", "/readyz", "", "", 200},
		{"config without token", "/debug/config", "", "", 401},
		{"config for a reader", "/debug/config", reader, "", 200},
		{"fleet for a reader", "/debug/fleet", reader, "", 200},
		{"metrics for a reader", "/metrics", reader, "", 200},
		{"config for a reader again (cached)", "/debug/config", reader, "", 200},
		{"config for a user without the binding", "/debug/config", stranger, "", 403},
		{"metrics for a user without the binding", "/metrics", stranger, "", 403},
		{"a token the API server does not know", "/debug/config", "not-a-token", "", 401},
		{"a reader under a rebound name", "/debug/config", reader, "attacker.example", 403},
	})
}
