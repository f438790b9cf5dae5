// Package latency learns, online, how fast a model server answers: a small
// linear model per endpoint fitted to what the gateway observes of each
// response (its time to first token against the prefill work ahead of it and
// the running batch; its inter-token latency against the batch), so that the
// picker can predict a request's time to first token on every candidate, on a
// pool of mixed GPUs as on a uniform one.
//
// The fit is least squares with exponential forgetting — the model forgets at
// a known rate, so a pod that slows down is seen within a few dozen answers —
// pulled toward a prior (the pool's median model, or a default), with
// non-negative coefficients, and made robust by down-weighting an answer whose
// error is many times the typical one: one request stuck behind a stall does
// not teach the model that the pod is slow.
package latency

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// dim is the most features a Model takes (an intercept and four inputs).
const dim = 5

// Model is y ≈ θ·x fitted online: weighted least squares over the answers,
// each weighing Forgetting times less per later answer, pulled toward a
// prior (ridge) and solved with every coefficient non-negative. It keeps
// sufficient statistics, not the answers, and solves the small system after
// each answer: unlike recursive least squares, whose covariance update loses
// its conditioning under forgetting and diverged in the bursty scenario, it
// cannot wind up. The zero value is not usable: start one with New. A Model is
// not safe for concurrent use.
type Model struct {
	n     int
	prior [dim]float64
	ridge [dim]float64 // the prior's pull on each coefficient
	sxx   [dim][dim]float64
	sxy   [dim]float64
	theta [dim]float64
	scale float64 // typical absolute error, for down-weighting outliers
	// Samples counts the observations fitted.
	Samples int
}

// Forgetting is the weight an observation keeps per later observation: about
// the last 1/(1−Forgetting) answers make the fit.
const Forgetting = 0.95

// clip is how many typical errors an answer's error may reach before it
// weighs less: one request stuck behind a stall moves the fit as a few
// typical answers would, a change that repeats moves it all the way.
const clip = 4

// noise is the typical error, in the answers' unit, that a coefficient's
// spread is measured against: a prior with spread s pulls like one answer
// whose error is noise when the coefficient is s off.
const noise = 0.05

// New starts a model of len(prior) features (at most dim) at the prior
// coefficients, each held to the prior with the given spread: how far from
// it one answer of typical error may pull it.
func New(prior, spread []float64) *Model {
	m := &Model{n: min(len(prior), dim)}
	for i := range m.n {
		m.prior[i] = max(prior[i], 0)
		m.theta[i] = m.prior[i]
		sp := 1.0
		if i < len(spread) && spread[i] > 0 {
			sp = spread[i]
		}
		m.ridge[i] = (noise / sp) * (noise / sp)
	}
	return m
}

// Coefficients returns θ.
func (m *Model) Coefficients() []float64 { return append([]float64(nil), m.theta[:m.n]...) }

// Predict returns θ·x.
func (m *Model) Predict(x []float64) float64 {
	y := 0.0
	for i := range m.n {
		y += m.theta[i] * x[i]
	}
	return y
}

// Observe fits one observation y of features x.
func (m *Model) Observe(x []float64, y float64) {
	if !sane(y) {
		return
	}
	for i := range m.n {
		if !sane(x[i]) {
			return
		}
	}
	e := math.Abs(y - m.Predict(x))
	w := 1.0
	if m.Samples >= 3 && m.scale > 0 && e > clip*m.scale {
		w = clip * m.scale / e
	}
	// The typical error follows the answers' errors, each counted at most
	// twice the typical: a stall hits every request in flight at once, and
	// a run of them must not make the next ones look typical; a real change
	// of speed, which lasts, still raises it within a few dozen answers.
	if m.Samples == 0 {
		m.scale = e
	} else {
		m.scale = 0.9*m.scale + 0.1*min(e, 2*m.scale)
	}
	// Forgetting, with what is forgotten of a term the answer does not speak
	// of (nothing queued ahead: an idle pod says nothing new of its
	// throughput under a queue) given back as a pull toward the current
	// estimate: an idle spell does not wear away what a burst taught, and
	// the statistics stay those of a least-squares fit.
	n := m.n
	for i := range n {
		for j := range n {
			m.sxx[i][j] = Forgetting*m.sxx[i][j] + w*x[i]*x[j]
		}
		m.sxy[i] = Forgetting*m.sxy[i] + w*x[i]*y
	}
	for i := range n {
		if x[i] == 0 {
			kept := (1 - Forgetting) * m.sxx[i][i] / Forgetting
			m.sxx[i][i] += kept
			m.sxy[i] += kept * m.theta[i]
		}
	}
	m.Samples++
	m.solve()
}

// maxInput bounds an observation's values: a gauge or a time beyond it is a
// server's nonsense, and its square would overflow the statistics.
const maxInput = 1e7

func sane(v float64) bool { return !math.IsNaN(v) && math.Abs(v) <= maxInput }

// solve sets θ to the non-negative minimiser of the forgotten squared errors
// plus the ridge: of the solutions with some coefficients held at 0, the best
// whose free coefficients are all non-negative (5 coefficients: 31 systems).
func (m *Model) solve() {
	n := m.n
	best, bestCost := m.theta, math.Inf(1)
	for free := 1; free < 1<<n; free++ {
		var a [dim][dim]float64
		var b [dim]float64
		var idx []int
		for i := range n {
			if free&(1<<i) != 0 {
				idx = append(idx, i)
			}
		}
		for r, i := range idx {
			for c, j := range idx {
				a[r][c] = m.sxx[i][j]
			}
			a[r][r] += m.ridge[i]
			b[r] = m.sxy[i] + m.ridge[i]*m.prior[i]
		}
		sol, ok := solveSmall(a, b, len(idx))
		if !ok {
			continue
		}
		var th [dim]float64
		feasible := true
		for r, i := range idx {
			if sol[r] < 0 {
				feasible = false
			}
			th[i] = sol[r]
		}
		if !feasible {
			continue
		}
		if c := m.cost(th); c < bestCost {
			best, bestCost = th, c
		}
	}
	m.theta = best
}

// cost is the forgotten squared error of θ (up to a constant) plus the ridge.
func (m *Model) cost(th [dim]float64) float64 {
	c := 0.0
	for i := range m.n {
		c -= 2 * th[i] * m.sxy[i]
		for j := range m.n {
			c += th[i] * m.sxx[i][j] * th[j]
		}
		d := th[i] - m.prior[i]
		c += m.ridge[i] * d * d
	}
	return c
}

// solveSmall solves a·x = b for the leading k×k block by Gaussian elimination
// with partial pivoting.
func solveSmall(a [dim][dim]float64, b [dim]float64, k int) ([dim]float64, bool) {
	for col := range k {
		p := col
		for r := col + 1; r < k; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[p][col]) {
				p = r
			}
		}
		if math.Abs(a[p][col]) < 1e-15 {
			return b, false
		}
		a[col], a[p] = a[p], a[col]
		b[col], b[p] = b[p], b[col]
		for r := col + 1; r < k; r++ {
			f := a[r][col] / a[col][col]
			for c := col; c < k; c++ {
				a[r][c] -= f * a[col][c]
			}
			b[r] -= f * b[col]
		}
	}
	var x [dim]float64
	for r := k - 1; r >= 0; r-- {
		v := b[r]
		for c := r + 1; c < k; c++ {
			v -= a[r][c] * x[c]
		}
		x[r] = v / a[r][r]
	}
	return x, true
}

// Speed is an endpoint's learned speed, as the picker reads it: its time to
// first token as a function of the prefill work ahead of it and its running
// batch, and its decode step time as a function of the batch.
type Speed struct {
	// Base is the time to first token with no work ahead, in seconds.
	Base float64 `json:"baseSeconds"`
	// PerKToken is the time per thousand tokens of the request's own
	// prefill, in seconds: a prompt's latency.
	PerKToken float64 `json:"secondsPerKToken"`
	// PerKTokenQueued is the time per thousand tokens of prefill queued
	// ahead of the request: the inverse of the endpoint's prefill
	// throughput, which batching makes far higher than one prompt's rate
	// suggests, and more so on a larger GPU.
	PerKTokenQueued float64 `json:"secondsPerKTokenQueued"`
	// PerRunning is the time to first token each running request adds.
	PerRunning float64 `json:"secondsPerRunning"`
	// AdapterLoad is the time to first token a request adds when its LoRA
	// adapter is not loaded at the endpoint.
	AdapterLoad float64 `json:"adapterLoadSeconds"`
	// StepBase and StepPerRunning model the inter-token latency.
	StepBase       float64 `json:"stepSeconds"`
	StepPerRunning float64 `json:"stepSecondsPerRunning"`
	// Pace is the endpoint's times to first token over what its pool's
	// speed predicts for the same work: 1 for a typical member of the pool,
	// 10 for one ten times slower.
	Pace float64 `json:"pace,omitempty"`
	// MeanPrefillTokens is the typical prefill (prompt tokens not cached) of
	// the requests the endpoint served, for the work of the requests it
	// reports waiting that this gateway did not send.
	MeanPrefillTokens float64 `json:"meanPrefillTokens"`
	// Samples counts the answers that taught the TTFT model; Steps the
	// streams that taught the step model.
	Samples int `json:"samples"`
	Steps   int `json:"steps"`
	// Borrowed says the endpoint has too few answers of its own: the speed
	// is its pool's median (or the default) until it has MinSamples.
	Borrowed bool `json:"borrowed,omitempty"`
}

// ownShare is the weight of an endpoint's own fit in Speed, the rest the
// pool's at its pace: on the bench's uniform fleets the pool's shape alone
// predicts best, on its mixed ones the own fit; half of each came within
// about 5% of the better on both (uniform-steady, burst-at-once).
const ownShare = 0.5

// MinSamples is how many answers an endpoint's model needs before it speaks
// for the endpoint rather than its pool's median.
const MinSamples = 5

// minPerKToken keeps a prediction growing with the work ahead: a fit that put
// all of a pod's time in its intercept would otherwise see no cost in
// queueing more on it.
const minPerKToken = 1e-3

// Default is the speed assumed of an endpoint before anything in its pool
// answered: about a mid-range GPU's prefill of an 8B model. Only its ratios
// to other endpoints' speeds matter to a pick, and every endpoint starts
// from it.
var Default = Speed{Base: 0.01, PerKToken: 0.1, PerKTokenQueued: 0.1, PerRunning: 0.0005, AdapterLoad: 0.05, StepBase: 0.02, StepPerRunning: 0.0002, MeanPrefillTokens: 512}

// TTFT predicts the time to first token of a request of own prefill tokens
// with ahead tokens of prefill queued before it, behind running requests,
// with loads adapter loads (1 when its adapter is not loaded there, else 0).
func (s Speed) TTFT(own, ahead, running, loads float64) float64 {
	return max(s.Base, 0) + max(s.PerKToken, minPerKToken)*own/1000 + max(s.PerKTokenQueued, minPerKToken)*ahead/1000 +
		max(s.PerRunning, 0)*running + max(s.AdapterLoad, 0)*loads
}

// Features of the models: TTFT on [1, ktokens, running/100], the step on
// [1, running/100], scaled so that coefficients are of like size.
func ttftX(own, ahead, running, loads float64) []float64 {
	return []float64{1, own / 1000, ahead / 1000, running / 100, loads}
}
func stepX(running float64) []float64 { return []float64{1, running / 100} }

// Tracker learns one endpoint's Speed. It is safe for concurrent use: answers
// update it under a lock, and a pick reads the last fit without one.
type Tracker struct {
	mu          sync.Mutex
	ttft, step  *Model
	meanPrefill float64
	// logPace is the mean log of the answers' times over what the pool's
	// speed predicted for them, and paced the answers it is of.
	logPace float64
	paced   int
	fit     atomic.Pointer[Speed] // the models' coefficients after the last answer
}

// prior turns a Speed into the TTFT model's starting coefficients. The spreads
// say how readily answers move each: the intercept little (a pod's time is
// mostly its prefill work, which a pod answering only short prompts cannot
// tell apart from a constant), the per-token cost readily.
func ttftPrior(s Speed) *Model {
	return New([]float64{s.Base, s.PerKToken, s.PerKTokenQueued, s.PerRunning * 100, s.AdapterLoad}, []float64{0.05, 2, 2, 0.2, 0.2})
}

func stepPrior(s Speed) *Model {
	return New([]float64{s.StepBase, s.StepPerRunning * 100}, []float64{0.02, 0.05})
}

// ObserveTTFT fits one answer: its time to first token, seconds, for own
// prefill tokens with ahead queued before it, behind running requests, with
// loads adapter loads. prior starts a model that has none (the pool's median
// speed).
func (t *Tracker) ObserveTTFT(own, ahead, running, loads, seconds float64, prior Speed) {
	if seconds < 0 || own < 0 || ahead < 0 || math.IsNaN(seconds) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ttft == nil {
		t.ttft = ttftPrior(prior)
		t.meanPrefill = prior.MeanPrefillTokens
	}
	t.ttft.Observe(ttftX(own, ahead, running, loads), seconds)
	if p := prior.TTFT(own, ahead, running, loads); p > 0 && seconds > 0 {
		// A running mean at first, then forgetting as the fit does: a new pod
		// of another generation reaches its pace within a few answers.
		w := max(1-Forgetting, 1/float64(t.paced+1))
		t.logPace += w * (math.Log(seconds/p) - t.logPace)
		t.paced++
	}
	if own > 0 {
		t.meanPrefill = 0.95*t.meanPrefill + 0.05*own
	}
	t.publish(prior)
}

// ForgetTTFT drops what the tracker learned of the time to first token: the
// next answer starts a model from its prior again, and until MinSamples of
// them the endpoint borrows its pool's speed. For a belief an answer showed
// wrong many times over, which the robust fit would take dozens of answers to
// leave (it weighs each such answer as an outlier).
func (t *Tracker) ForgetTTFT() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ttft, t.logPace, t.paced = nil, 0, 0
	if old := t.fit.Load(); old != nil {
		s := *old
		s.Samples = 0
		t.fit.Store(&s)
	}
}

// ObserveStep fits one stream's mean inter-token latency, seconds, with
// running requests in the batch when it started.
func (t *Tracker) ObserveStep(running, seconds float64, prior Speed) {
	if seconds <= 0 || math.IsNaN(seconds) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.step == nil {
		t.step = stepPrior(prior)
	}
	t.step.Observe(stepX(running), seconds)
	t.publish(prior)
}

// publish stores the models' coefficients for Speed; t.mu is held.
func (t *Tracker) publish(prior Speed) {
	s := prior
	s.Samples, s.Steps = 0, 0
	if old := t.fit.Load(); old != nil {
		s = *old
	}
	if t.ttft != nil {
		c := t.ttft.Coefficients()
		s.Base, s.PerKToken, s.PerKTokenQueued, s.PerRunning, s.AdapterLoad, s.Samples = c[0], c[1], c[2], c[3]/100, c[4], t.ttft.Samples
		s.MeanPrefillTokens = t.meanPrefill
		s.Pace = math.Exp(t.logPace)
	}
	if t.step != nil {
		c := t.step.Coefficients()
		s.StepBase, s.StepPerRunning, s.Steps = c[0], c[1]/100, t.step.Samples
	}
	t.fit.Store(&s)
}

// Speed is what the picker predicts with: half the endpoint's own TTFT model,
// half the pool's speed (prior) at the endpoint's pace (its coefficients
// times Pace), with its own step model. A fit of five coefficients per pod is
// noisy on a pool of like pods (queued work, the batch and the intercept
// explain one another, so like pods land far apart), while one factor of
// pace is measured on every answer and reads alike for pods of one kind; the
// pool's shape alone, though, misjudges a generation whose prefill and batch
// costs differ in other ratios than its pace. With fewer than MinSamples
// answers it is the pool's, marked Borrowed; likewise the step model.
func (t *Tracker) Speed(prior Speed) Speed {
	s := t.Fit(prior)
	if s.Borrowed {
		// Too few answers for a fit of its own, but each already says how
		// far the endpoint is from its pool's pace: a burst that comes
		// before the fits does not find a slow generation rated as fast.
		if own := t.fit.Load(); own != nil && own.Samples > 0 {
			s.Pace = own.Pace
			s.Base, s.PerKToken, s.PerKTokenQueued, s.PerRunning, s.AdapterLoad =
				prior.Base*s.Pace, prior.PerKToken*s.Pace, prior.PerKTokenQueued*s.Pace, prior.PerRunning*s.Pace, prior.AdapterLoad*s.Pace
		}
		return s
	}
	pace, l := s.Pace, ownShare
	s.Base, s.PerKToken, s.PerKTokenQueued, s.PerRunning, s.AdapterLoad =
		l*s.Base+(1-l)*prior.Base*pace, l*s.PerKToken+(1-l)*prior.PerKToken*pace, l*s.PerKTokenQueued+(1-l)*prior.PerKTokenQueued*pace, l*s.PerRunning+(1-l)*prior.PerRunning*pace, l*s.AdapterLoad+(1-l)*prior.AdapterLoad*pace
	return s
}

// Fit is the endpoint's own fitted models, what its pool's median is taken
// of; with fewer than MinSamples answers, prior's, marked Borrowed; likewise
// the step model.
func (t *Tracker) Fit(prior Speed) Speed {
	own := t.fit.Load()
	if own == nil {
		prior.Samples, prior.Steps, prior.Pace, prior.Borrowed = 0, 0, 1, true
		return prior
	}
	s := *own
	if s.Samples < MinSamples {
		s.Base, s.PerKToken, s.PerKTokenQueued, s.PerRunning, s.AdapterLoad = prior.Base, prior.PerKToken, prior.PerKTokenQueued, prior.PerRunning, prior.AdapterLoad
		s.MeanPrefillTokens, s.Pace, s.Borrowed = prior.MeanPrefillTokens, 1, true
	}
	if s.Steps < MinSamples {
		s.StepBase, s.StepPerRunning = prior.StepBase, prior.StepPerRunning
	}
	return s
}

// Median is the coefficient-wise median of the speeds that are not borrowed,
// or Default when none is: a new pod in a pool starts as its typical member.
// Its Samples is the number of speeds the median is of (0: the default).
func Median(speeds []Speed) Speed {
	var own []Speed
	for _, s := range speeds {
		if !s.Borrowed {
			own = append(own, s)
		}
	}
	if len(own) == 0 {
		return Default
	}
	med := func(f func(Speed) float64) float64 {
		v := make([]float64, len(own))
		for i, s := range own {
			v[i] = f(s)
		}
		return median(v)
	}
	return Speed{
		Base: med(func(s Speed) float64 { return s.Base }), PerKToken: med(func(s Speed) float64 { return s.PerKToken }),
		PerKTokenQueued: med(func(s Speed) float64 { return s.PerKTokenQueued }),
		PerRunning:      med(func(s Speed) float64 { return s.PerRunning }), AdapterLoad: med(func(s Speed) float64 { return s.AdapterLoad }),
		StepBase:          med(func(s Speed) float64 { return s.StepBase }),
		StepPerRunning:    med(func(s Speed) float64 { return s.StepPerRunning }),
		MeanPrefillTokens: med(func(s Speed) float64 { return s.MeanPrefillTokens }),
		Samples:           len(own),
	}
}

func median(v []float64) float64 {
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
