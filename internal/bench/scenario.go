package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// Scenario is a workload on a fleet, run under several policies.
type Scenario struct {
	report.Scenario
	Fleet    simserver.FleetSpec
	Workload workload.Spec
}

const (
	llama8b  = "meta-llama/Llama-3.1-8B-Instruct"
	llama70b = "meta-llama/Llama-3.3-70B-Instruct"
)

func servers(name, gpu, size string, tp, n int, extra func(*simserver.ServerSpec)) simserver.ServerSpec {
	// Ports only matter to `kvgate sim`; virtual time never listens. Each GPU
	// has its own range, so that a fleet of several kinds can run there too.
	port := 21000 // a10g, and any other
	switch gpu {
	case "h100":
		port = 20000
	case "a100":
		port = 22000
	case "l40s":
		port = 23000
	}
	model := llama8b
	if size == "70b" {
		model = llama70b
	}
	s := simserver.ServerSpec{Name: name, Listen: fmt.Sprintf("127.0.0.1:%d", port), Replicas: n, GPU: gpu, Model: model, ModelSize: size, TensorParallel: tp}
	if extra != nil {
		extra(&s)
	}
	return s
}

// Job is one scenario × policy to run.
type Job struct {
	Scenario Scenario
	Trace    workload.Trace
	Policy   string
	// Draw numbers the runs of a randomised policy (its seed offset).
	Draw    int
	Options SimOptions
}

// RunSimJobs runs jobs in virtual time, as many at once as there are cores, and
// returns their results in job order. progress, when not nil, gets a line per
// finished job.
func RunSimJobs(ctx context.Context, jobs []Job, progress io.Writer) ([]report.Result, error) {
	results := make([]report.Result, len(jobs))
	var mu sync.Mutex
	err := inParallel(ctx, len(jobs), func(i int) error {
		j := jobs[i]
		start := time.Now()
		opts := j.Options
		opts.Fleet, opts.Policy, opts.Draw = j.Scenario.Fleet, j.Policy, j.Draw
		name := j.Policy
		if PolicyDraws(j.Policy, 0) > 1 {
			name = fmt.Sprintf("%s#%d", j.Policy, j.Draw)
		}
		recs, stats, err := RunSim(ctx, opts, j.Trace)
		if err != nil {
			return fmt.Errorf("%s / %s: %w", j.Scenario.Name, name, err)
		}
		results[i] = report.Summarize(j.Scenario.Name, j.Policy, "sim", recs)
		results[i].Draw = j.Draw
		results[i].Preemptions = int(stats.Preemptions)
		finished(progress, &mu, j.Scenario.Name, name, results[i], start)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}

// finished writes a finished run's line to progress, if not nil.
func finished(progress io.Writer, mu *sync.Mutex, scenario, name string, r report.Result, start time.Time) {
	if progress == nil {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Fprintf(progress, "  %-15s %-20s %7d requests  TTFT p95 %9.1f ms  p99 %9.1f ms  (%.1fs)\n",
		scenario, name, r.Requests, r.TTFTP95ms, r.TTFTP99ms, time.Since(start).Seconds())
}

// inParallel calls do(0), …, do(n−1), as many at once as there are cores, and
// returns the context's error if it ended, else the first error in index
// order.
func inParallel(ctx context.Context, n int, do func(i int) error) error {
	errs := make([]error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for i := range next {
				errs[i] = do(i)
			}
		})
	}
loop:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break loop
		}
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Jobs expands scenarios × policies, generating each scenario's trace once; a
// randomised policy (kube-proxy, kube-proxy-ipvs) gets opts.Draws runs
// (DefaultDraws when 0), Draw 0 to Draws−1.
func Jobs(scenarios []Scenario, policies []string, opts SimOptions) ([]Job, error) {
	var jobs []Job
	for _, s := range scenarios {
		tr, err := workload.Generate(s.Workload)
		if err != nil {
			return nil, fmt.Errorf("scenario %s: %w", s.Name, err)
		}
		for _, p := range policies {
			pj, err := PolicyJobs(s, tr, p, opts)
			if err != nil {
				return nil, err
			}
			jobs = append(jobs, pj...)
		}
	}
	return jobs, nil
}

// PolicyJobs are the runs of one policy on one scenario's trace: one, or
// PolicyDraws(policy, opts.Draws) of a randomised policy.
func PolicyJobs(s Scenario, tr workload.Trace, policy string, opts SimOptions) ([]Job, error) {
	if !slices.Contains(Policies, policy) {
		return nil, fmt.Errorf("unknown policy %q (known: %v)", policy, Policies)
	}
	var jobs []Job
	for d := range PolicyDraws(policy, opts.Draws) {
		jobs = append(jobs, Job{Scenario: s, Trace: tr, Policy: policy, Draw: d, Options: opts})
	}
	return jobs, nil
}
