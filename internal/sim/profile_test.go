package sim

import "testing"

// TestBatchDefaultsFollowVLLM checks max_num_batched_tokens and max_num_seqs
// against vLLM's V1 defaults (EngineArgs.get_batch_defaults): large only on a GPU
// of at least 70 GiB that is not an A100; an explicit value always wins, and a
// defaulted max_num_seqs never exceeds the token budget.
func TestBatchDefaultsFollowVLLM(t *testing.T) {
	for _, tc := range []struct {
		name                string
		cfg                 Config
		wantTokens, wantSeq int
	}{
		{"h100 server", Config{GPU: "h100"}, 8192, 1024},
		{"h100 server tp4", Config{GPU: "h100", ModelSize: "70b", TensorParallel: 4}, 8192, 1024},
		{"h100 offline", Config{GPU: "h100", Offline: true}, 16384, 1024},
		{"a100 80GB server", Config{GPU: "a100"}, 2048, 256},
		{"a100 80GB offline", Config{GPU: "a100", Offline: true}, 8192, 256},
		{"l40s server", Config{GPU: "l40s"}, 2048, 256},
		{"a10g server", Config{GPU: "a10g"}, 2048, 256},
		{"a10g offline", Config{GPU: "a10g", Offline: true}, 8192, 256},
		{"h100 explicit seqs", Config{GPU: "h100", MaxNumSeqs: 256}, 8192, 256},
		{"a10g explicit seqs", Config{GPU: "a10g", MaxNumSeqs: 1024}, 2048, 1024},
		{"h100 explicit tokens", Config{GPU: "h100", MaxNumBatchedTokens: 16384}, 16384, 1024},
		{"h100 small budget caps default seqs", Config{GPU: "h100", MaxNumBatchedTokens: 512}, 512, 512},
		{"small budget, explicit seqs", Config{GPU: "h100", MaxNumBatchedTokens: 512, MaxNumSeqs: 600}, 512, 600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cfg.ModelSize == "" {
				tc.cfg.ModelSize = "8b"
			}
			e := mustEngine(t, tc.cfg)
			if got := e.Config(); got.MaxNumBatchedTokens != tc.wantTokens || got.MaxNumSeqs != tc.wantSeq {
				t.Errorf("max_num_batched_tokens %d, max_num_seqs %d; want %d, %d",
					got.MaxNumBatchedTokens, got.MaxNumSeqs, tc.wantTokens, tc.wantSeq)
			}
		})
	}
}

// TestBatchDefaultsByMemoryAndName covers the rule's two conditions on GPUs the
// simulator has no profile for.
func TestBatchDefaultsByMemoryAndName(t *testing.T) {
	for _, tc := range []struct {
		gpu      GPU
		wantSeqs int
	}{
		{GPU{Name: "h200", MemoryGB: 150.1}, 1024},
		{GPU{Name: "mi300x", MemoryGB: 205.8}, 1024},
		{GPU{Name: "A100-SXM4-80GB", MemoryGB: 85.2}, 256},
		{GPU{Name: "a100-40gb", MemoryGB: 42.4}, 256},
		{GPU{Name: "l40s", MemoryGB: 48.3}, 256},
		{GPU{Name: "just under 70 GiB", MemoryGB: 75.1}, 256}, // 69.9 GiB
		{GPU{Name: "just over 70 GiB", MemoryGB: 75.2}, 1024}, // 70.04 GiB
	} {
		if _, seqs := tc.gpu.BatchDefaults(false); seqs != tc.wantSeqs {
			t.Errorf("%s (%.1f GB): max_num_seqs %d, want %d", tc.gpu.Name, tc.gpu.MemoryGB, seqs, tc.wantSeqs)
		}
	}
}
