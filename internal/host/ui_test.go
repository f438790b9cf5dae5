package host_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/openai/openai-go/v3"

	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/testenv"
)

// TestUIFiles: the admin listener serves the fleet page and its files under a
// policy that runs only its own script, leads / there, and the page loads
// nothing from another origin.
func TestUIFiles(t *testing.T) {
	g := start(t, config(scheduler("chat", llama, startSim(t, llama, simserver.Options{}).Addr())), host.CoreOptions{})
	noFollow := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	external := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//|@import`)
	for _, tc := range []struct {
		path, status, contentType, location string
		page                                bool // served under the page's policy
	}{
		{"/ui/", "200 OK", "text/html", "", true},
		{"/ui/app.js", "200 OK", "text/javascript", "", true},
		{"/ui/style.css", "200 OK", "text/css", "", true},
		{"/ui", "302 Found", "", "/ui/", false},
		{"/", "302 Found", "", "/ui/", false},
		{"/debug/decisions", "200 OK", "application/json", "", false},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp, err := noFollow.Get(g.AdminURL + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.Status != tc.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.contentType) || resp.Header.Get("Location") != tc.location {
				t.Fatalf("%s, %q, location %q", resp.Status, resp.Header.Get("Content-Type"), resp.Header.Get("Location"))
			}
			csp := resp.Header.Get("Content-Security-Policy")
			if tc.page && (!strings.Contains(csp, "default-src 'self'") || strings.Contains(csp, "unsafe") || resp.Header.Get("X-Content-Type-Options") != "nosniff") {
				t.Errorf("policy %q, nosniff %q", csp, resp.Header.Get("X-Content-Type-Options"))
			}
			if tc.page && external.Match(body) {
				t.Errorf("loads from elsewhere: %q", external.Find(body))
			}
			if tc.path == "/debug/decisions" {
				var v []route.DecisionsView
				if err := json.Unmarshal(body, &v); err != nil || len(v) != 1 || v[0].Scheduler != "chat" {
					t.Errorf("decisions %s (%v)", body, err)
				}
			}
		})
	}
}

// TestFleetPage opens the fleet page in headless Chromium against simulated
// servers behind the gateway with streaming traffic: it renders every
// endpoint, a decision with its candidates' scores and the winner, its numbers
// move between two screenshots, it fits a phone's width, and names from the
// configuration show as text, never as markup. With KVGATE_UI_SCREENSHOT set
// to a PNG path (docs/fleet-page.png) it writes the laptop screenshot there.
func TestFleetPage(t *testing.T) {
	browser := testenv.Require(t, testenv.Chromium)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	allocCtx, stopAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(browser), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 800),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		// Without these Chromium dials out (updates, sync, QUIC probes),
		// which a closed network refuses.
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("hide-scrollbars", true))
	t.Cleanup(stopAlloc)
	browserCtx, closeBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(closeBrowser)
	if err := chromedp.Do(browserCtx); err != nil {
		t.Fatalf("starting %s: %v", browser, err)
	}

	// Behind --admin-auth token the page asks for the token on the first
	// 401 and sends it with its reads: the fleet shows.
	t.Run("asks for the admin token", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(file, []byte("page-token"), 0o600); err != nil {
			t.Fatal(err)
		}
		g := start(t, config(scheduler("chat", llama, startSim(t, llama, simserver.Options{}).Addr())),
			host.CoreOptions{Admin: host.AdminOptions{Auth: host.AdminAuthToken, TokenFile: file}})
		tab, closeTab := chromedp.NewContext(browserCtx)
		t.Cleanup(closeTab)
		if err := chromedp.Do(tab, chromedp.Navigate(g.AdminURL+"/ui/"), waitTrue(`!document.getElementById("login").hidden`),
			chromedp.SendKeys("#token", "page-token"), chromedp.Click("#login button"),
			waitTrue(`document.querySelectorAll("tr[data-endpoint]").length === 1`)); err != nil {
			t.Fatalf("the page did not ask for the token, or did not show the fleet with it: %v", err)
		}
	})

	t.Run("live fleet", func(t *testing.T) {
		var addrs []string
		for _, gpu := range []string{"h100", "a100", "a10g"} {
			addrs = append(addrs, startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: gpu, ModelSize: "8b"}}).Addr())
		}
		coder := startSim(t, qwen, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "32b"}}).Addr()
		g := start(t, config(scheduler("chat", llama, addrs...), scheduler("code", qwen, coder)), host.CoreOptions{})
		stopTraffic := streamTraffic(t, g.URL, map[string]int{llama: 5, qwen: 1})
		t.Cleanup(stopTraffic)

		var errs pageErrors
		tab, closeTab := chromedp.NewContext(browserCtx, chromedp.WithListener(errs.listen))
		t.Cleanup(closeTab)
		// The page has rendered every endpoint, a decision of each scheduler
		// (chat's ranking its three endpoints, once the fleet has scraped
		// them) and TTFT samples.
		ready := `(() => { const eps = [...document.querySelectorAll("tr[data-endpoint]")].map(r => r.dataset.endpoint);
			return eps.length >= 4 && document.querySelectorAll("details.decision[open] tr.win").length >= 2 &&
				document.querySelectorAll("section[data-scheduler=chat] details.decision[open] tbody tr").length >= 3 &&
				[...document.querySelectorAll("[data-num=p50]")].some(e => e.textContent !== "–"); })()`
		if err := chromedp.Do(tab, chromedp.Navigate(g.AdminURL+"/ui/"), waitTrue(ready)); err != nil {
			t.Fatalf("the page never showed every endpoint with a decision and TTFT: %v", err)
		}
		first, shot := readPage(t, tab)
		for _, a := range append(slices.Clone(addrs), coder) {
			if !slices.Contains(first.Endpoints, a) {
				t.Errorf("endpoint %s not rendered; rendered %v", a, first.Endpoints)
			}
		}
		if len(first.Decision) != len(addrs) || !slices.ContainsFunc(first.Decision, func(r []string) bool { return strings.HasSuffix(r[0], "✓") }) {
			t.Errorf("chat's newest decision %q: want its %d candidates with scores and the winner marked", first.Decision, len(addrs))
		}
		for _, row := range first.Decision {
			if len(row) < 3 || !regexp.MustCompile(`^\d+\.\d{3}$`).MatchString(row[1]) {
				t.Errorf("decision row %q: want a candidate, its score and per-scorer scores", row)
			}
		}
		// A few seconds of traffic later the numbers differ.
		time.Sleep(3 * time.Second)
		second, shot2 := readPage(t, tab)
		for _, png := range [][]byte{shot, shot2} {
			if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
				t.Errorf("a screenshot is not a PNG: %.16q", png)
			}
		}
		if slices.Equal(first.Numbers, second.Numbers) {
			t.Errorf("numbers unchanged after 3 s of traffic: %q", first.Numbers)
		}
		if first.Newest == second.Newest {
			t.Errorf("newest decision unchanged after 3 s of traffic: %q", first.Newest)
		}
		// Nothing the policy blocked, no script error, no failed fetch.
		if e := errs.all(); len(e) > 0 {
			t.Errorf("the page logged errors: %q", e)
		}
		if path := os.Getenv("KVGATE_UI_SCREENSHOT"); path != "" {
			// For the docs: half a minute of traffic draws the charts.
			time.Sleep(25 * time.Second)
			// A laptop's screen, not the whole page: the file stays small.
			shot, err := chromedp.Run(tab, chromedp.CaptureScreenshot())
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, shot, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s (%d bytes)", path, len(shot))
		}

		// A phone: every part still shows, nothing scrolls sideways.
		if err := chromedp.Do(tab, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile),
			chromedp.Sleep(1500*time.Millisecond)); err != nil { // a poll re-renders at the new width
			t.Fatal(err)
		}
		widths, err := chromedp.Run(tab, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, window.innerWidth, document.querySelectorAll("tr[data-endpoint]").length]`))
		if err != nil {
			t.Fatal(err)
		}
		if len(widths) != 3 || widths[1] != 390 || widths[0] > widths[1] || widths[2] < 4 {
			t.Errorf("at 390 px: content %v px wide in a %v px window, %v endpoint rows", widths[0], widths[1], widths[2])
		}
		// To look at: the top of the page and its decisions on a phone.
		if path := os.Getenv("KVGATE_UI_PHONE_SCREENSHOT"); path != "" {
			for i, scroll := range []string{`window.scrollTo(0, 0)`, `document.querySelector("details.decision").scrollIntoView()`} {
				if _, err := chromedp.Run(tab, chromedp.Evaluate[chromedp.Void](scroll)); err != nil {
					t.Fatal(err)
				}
				shot, err := chromedp.Run(tab, chromedp.CaptureScreenshot())
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(strings.TrimSuffix(path, ".png")+fmt.Sprint("-", i, ".png"), shot, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	})

	t.Run("an endpoint whose scrapes fail shows as unhealthy", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := l.Addr().String()
		_ = l.Close() // nothing listens there: every scrape fails
		live := startSim(t, llama, simserver.Options{}).Addr()
		g := start(t, config(scheduler("chat", llama, live, dead)), host.CoreOptions{})
		tab, closeTab := chromedp.NewContext(browserCtx)
		t.Cleanup(closeTab)
		badge := func(addr string) string {
			return `(document.querySelector('tr[data-endpoint="` + addr + `"] .badge') || {}).`
		}
		both := badge(live) + `textContent === "healthy" && ` + badge(dead) + `className === "badge bad"`
		if err := chromedp.Do(tab, chromedp.Navigate(g.AdminURL+"/ui/"), waitTrue(both)); err != nil {
			got, _ := chromedp.Run(tab, chromedp.Evaluate[[]string](`[...document.querySelectorAll("tr[data-endpoint] .badge")].map(b => b.textContent + " " + b.className)`))
			t.Fatalf("badges %q: want the live endpoint healthy and the dead one marked bad: %v", got, err)
		}
		got, err := chromedp.Run(tab, chromedp.Evaluate[[]string](`[`+badge(dead)+`textContent, `+badge(dead)+`title]`))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0] != "unhealthy" || got[1] == "" {
			t.Errorf("the dead endpoint's badge %q (title %q): want unhealthy, with the scrape's error as its title", got[0], got[1])
		}
	})

	t.Run("names are text", func(t *testing.T) {
		evil := `<img src=x id=injected onerror="document.title='pwned'">`
		cfg := config(scheduler("evil", evil, startSim(t, llama, simserver.Options{}).Addr()))
		cfg.Spec.Schedulers[0].LoRAAdapters = []string{`<b id=injected>adapter</b>`}
		g := start(t, cfg, host.CoreOptions{})
		tab, closeTab := chromedp.NewContext(browserCtx)
		t.Cleanup(closeTab)
		if err := chromedp.Do(tab, chromedp.Navigate(g.AdminURL+"/ui/"), waitTrue(`document.querySelector("section.sched") !== null`)); err != nil {
			t.Fatal(err)
		}
		text, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.querySelector("section.sched").textContent`))
		if err != nil {
			t.Fatal(err)
		}
		title, err := chromedp.Run(tab, chromedp.Title())
		if err != nil {
			t.Fatal(err)
		}
		injected, err := chromedp.Run(tab, chromedp.Evaluate[bool](`document.getElementById("injected") !== null`))
		if err != nil {
			t.Fatal(err)
		}
		if injected || title == "pwned" || !strings.Contains(text, evil) || !strings.Contains(text, "<b id=injected>") {
			t.Errorf("names rendered as markup (injected %v, title %q); text %q", injected, title, text)
		}
	})
}

// pageErrors collects what a tab logs as an error (a policy violation, a
// failed load) and its uncaught exceptions.
type pageErrors struct {
	mu   sync.Mutex
	errs []string
}

func (p *pageErrors) listen(ev any) {
	var msg string
	switch ev := ev.(type) {
	case *cdplog.EventEntryAdded:
		if ev.Entry.Level != cdplog.EntryLevelError {
			return
		}
		msg = fmt.Sprintf("%s: %s %s", ev.Entry.Source, ev.Entry.Text, ev.Entry.URL)
	case *cdpruntime.EventExceptionThrown:
		msg = "exception: " + ev.ExceptionDetails.Text
		if ev.ExceptionDetails.Exception != nil {
			msg += " " + ev.ExceptionDetails.Exception.Description
		}
	default:
		return
	}
	p.mu.Lock()
	p.errs = append(p.errs, msg)
	p.mu.Unlock()
}

func (p *pageErrors) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.errs)
}

// pageState is what the test reads from the page's DOM.
type pageState struct {
	Endpoints []string   // the rendered endpoint rows
	Numbers   []string   // every live figure ([data-num])
	Newest    string     // the newest decision's key
	Decision  [][]string // chat's newest decision's rows: candidate, score, per-scorer scores
}

// readPage reads the page's state and takes a laptop screenshot of it.
func readPage(t *testing.T, tab context.Context) (pageState, []byte) {
	t.Helper()
	raw, err := chromedp.Run(tab, chromedp.Evaluate[string](`JSON.stringify({
		Endpoints: [...document.querySelectorAll("tr[data-endpoint]")].map(r => r.dataset.endpoint),
		Numbers: [...document.querySelectorAll("[data-num]")].map(e => e.textContent),
		Newest: document.querySelector("details.decision")?.dataset.decision || "",
		Decision: [...document.querySelectorAll("section[data-scheduler=chat] details.decision[open]")].slice(0, 1).flatMap(d =>
			[...d.querySelectorAll("tbody tr")].map(r => [...r.cells].map(c => c.textContent))),
	})`))
	if err != nil {
		t.Fatal(err)
	}
	shot, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	var s pageState
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		t.Fatal(err)
	}
	return s, shot
}

// waitTrue waits, up to 30 s, for a JavaScript expression to be true.
func waitTrue(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))
}

// streamTraffic streams chat completions through the gateway with the official SDK,
// workers per model, until the returned function is called; a few system
// prompts recur, so the prefix index fills.
func streamTraffic(t *testing.T, api string, workers map[string]int) func() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	client := sdk(api)
	for model, n := range workers {
		for w := range n {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					system := fmt.Sprintf("You are assistant %d of the support team. ", (w+i)%6) + strings.Repeat("Answer briefly and cite the policy. ", 40)
					stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
						Model:     model,
						Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(fmt.Sprintf("question %d", i))},
						MaxTokens: openai.Int(int64(8 + i%24)),
					})
					for stream.Next() {
					}
					if err := stream.Err(); err != nil && ctx.Err() == nil {
						t.Errorf("%s: %v", model, err)
						return
					}
					_ = stream.Close()
				}
			})
		}
	}
	return func() { cancel(); wg.Wait() }
}
