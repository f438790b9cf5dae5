package gateway

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/internal/openai"
)

// serveModels lists every model and adapter the request may use, in the
// OpenAI list format, or (GET /v1/models/{id}, the SDKs' models.retrieve) one
// of them; a model id may hold slashes.
func serveModels(w http.ResponseWriter, r *http.Request, models []openai.Model) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		openai.WriteError(w, http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "use GET")
		return
	}
	id, one := strings.CutPrefix(r.URL.Path, "/v1/models/")
	if !one {
		openai.WriteJSON(w, openai.Models(models))
		return
	}
	for _, m := range models {
		if m.ID == id {
			openai.WriteJSON(w, m)
			return
		}
	}
	openai.WriteError(w, http.StatusNotFound, openai.TypeNotFound, fmt.Sprintf("the model %q does not exist", id))
}
