package ratelimit

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/internal/redistest"
)

// BenchmarkReserve is the cost of one decision: a script call to a redis-server
// on loopback, or the local store; one key, then many keys from parallel
// goroutines. The limits are high enough that every call is allowed.
func BenchmarkReserve(b *testing.B) {
	lim := Limits{RequestsPerMinute: 1e9, TokensPerMinute: 1e12}
	quiet := Options{Logger: slog.New(slog.DiscardHandler)}
	for _, backend := range backends {
		b.Run(backend, func(b *testing.B) {
			l := New(nil, quiet)
			if backend == onRedis {
				l = New(redistest.Start(b).Client(b), quiet)
			}
			ctx := context.Background()
			b.Run("serial", func(b *testing.B) {
				k := Key{Tenant: "bench", Model: "m"}
				for b.Loop() {
					if res, _, err := l.Reserve(ctx, k, lim, 1000); err != nil || !res.Allowed || res.Degraded {
						b.Fatalf("%+v, %v", res, err)
					}
				}
			})
			b.Run("parallel", func(b *testing.B) {
				b.RunParallel(func(pb *testing.PB) {
					for i := 0; pb.Next(); i++ {
						k := Key{Tenant: "bench-" + strconv.Itoa(i%64), Model: "m"} // as many tenants
						if res, _, err := l.Reserve(ctx, k, lim, 1000); err != nil || !res.Allowed || res.Degraded {
							b.Errorf("%+v, %v", res, err)
							return
						}
					}
				})
			})
		})
	}
}
