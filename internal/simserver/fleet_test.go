package simserver

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/waittest"
)

func TestParseFleet(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		servers    []string
		addrs      []string
		err        string
	}{
		{"replicas", `
seed: 10
servers:
- {name: h100, listen: "127.0.0.1:9001", replicas: 2, gpu: h100, model: m, modelSize: 8b}
- {name: a10g, listen: "127.0.0.1:9101", gpu: a10g, model: m, modelSize: 8b, engine: sglang,
   faults: {errorRate: 0.5, addedLatency: 20ms}}
`, []string{"h100-0", "h100-1", "a10g"}, []string{"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9101"}, ""},
		{"unknown field", "servers:\n- {name: a, listen: ':1', gpu: h100, model: m, modelSize: 8b, gpus: 2}\n", nil, nil, `unknown field "gpus"`},
		{"missing gpu", "servers:\n- {name: a, listen: ':1', model: m, modelSize: 8b}\n", nil, nil, "required"},
		{"no servers", "seed: 1\n", nil, nil, "no servers"},
		{"duplicate", "servers:\n- {name: a, listen: ':1', gpu: h100, model: m, modelSize: 8b}\n- {name: a, listen: ':2', gpu: h100, model: m, modelSize: 8b}\n", nil, nil, "duplicate"},
		{"bad duration", "servers:\n- {name: a, listen: ':1', gpu: h100, model: m, modelSize: 8b, faults: {addedLatency: soon}}\n", nil, nil, "duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := ParseFleet([]byte(tc.yaml))
			var opts []Options
			var addrs []string
			if err == nil {
				opts, addrs, err = spec.Options(slog.New(slog.DiscardHandler))
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, o := range opts {
				names = append(names, o.Name)
			}
			if strings.Join(names, ",") != strings.Join(tc.servers, ",") || strings.Join(addrs, ",") != strings.Join(tc.addrs, ",") {
				t.Fatalf("servers %v at %v", names, addrs)
			}
			if opts[1].Engine.Seed != 11 || opts[2].Faults.AddedLatency != Duration(20*time.Millisecond) || opts[2].Dialect != DialectSGLang {
				t.Errorf("seed %d, faults %+v, dialect %s", opts[1].Engine.Seed, opts[2].Faults, opts[2].Dialect)
			}
		})
	}
}

func TestFleetAdmin(t *testing.T) {
	spec, err := ParseFleet([]byte(`
servers:
- {name: fast, listen: "127.0.0.1:0", gpu: h100, model: m, modelSize: 8b}
- {name: slow, listen: "127.0.0.1:0", gpu: a10g, model: m, modelSize: 8b}
`))
	if err != nil {
		t.Fatal(err)
	}
	opts, addrs, err := spec.Options(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := NewFleet(opts, addrs, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = fleet.Serve(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	admin := "http://" + fleet.AdminAddr()

	var list []serverInfo
	waittest.Until(t, 2*time.Second, "admin API", func() bool {
		resp, err := http.Get(admin + "/admin/servers")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&list) == nil
	})
	if len(list) != 2 || list[0].GPU != "h100" || list[1].GPU != "a10g" || list[1].KVBlocks == 0 {
		t.Fatalf("servers %+v", list)
	}
	slow := "http://" + list[1].Address

	if code := putJSON(t, admin+"/admin/servers/slow/faults", Faults{RefuseConnections: true}); code != 200 {
		t.Fatalf("set faults: %d", code)
	}
	if _, err := getStatus(slow + "/health"); err == nil {
		t.Fatal("refusing server answered")
	}
	if _, err := getStatus("http://" + list[0].Address + "/health"); err != nil {
		t.Fatalf("the other server stopped too: %v", err)
	}
	if code := putJSON(t, admin+"/admin/servers/slow/faults", Faults{}); code != 200 {
		t.Fatalf("clear faults: %d", code)
	}
	if code, err := getStatus(slow + "/health"); err != nil || code != 200 {
		t.Fatalf("after clearing: %d %v", code, err)
	}
	if code := putJSON(t, admin+"/admin/servers/nope/faults", Faults{}); code != 404 {
		t.Errorf("unknown server: %d", code)
	}
}
