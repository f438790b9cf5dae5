package host

import (
	"embed"
	"github.com/kvgate/kvgate/internal/openai"
	"io/fs"
	"net/http"
)

// The fleet page: plain HTML, CSS and JavaScript embedded in the binary, no
// build step and nothing fetched from elsewhere. The page reads only the
// admin listener's JSON (/debug/fleet, /summary, /debug/decisions), polling
// each second.

//go:embed ui
var uiFiles embed.FS

// uiPolicy keeps the page to its own files and JSON: everything it renders
// comes from configuration and scraped metrics, so no script but its own may
// run, and nothing may frame it.
const uiPolicy = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// routeUI adds the fleet page (/ui/, with / leading there) and the decision
// log it reads (/debug/decisions) to the admin mux. The page's own files are
// the binary's, the same for everyone, and a browser's navigation carries no
// bearer token: they answer without authentication (under the Host check),
// and the page sends the token the user gives it with its reads of /debug/*.
func (h *Host) routeUI(mux *http.ServeMux, g *AdminGate) {
	mux.Handle("GET /ui/", g.browsable(uiHandler()))
	mux.Handle("GET /ui", g.browsable(http.RedirectHandler("/ui/", http.StatusFound)))
	mux.Handle("GET /{$}", g.browsable(http.RedirectHandler("/ui/", http.StatusFound)))
	mux.Handle("GET /debug/decisions", g.protected(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		openai.WriteJSON(w, h.core.Decisions())
	})))
}

// uiHandler serves the page's files under /ui/.
func uiHandler() http.Handler {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree always has ui/
	}
	files := http.StripPrefix("/ui", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", uiPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// A new binary's page must not run an old script.
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
