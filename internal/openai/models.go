package openai

import (
	"encoding/json"
	"net/http"
)

// Model is one entry of GET /v1/models, with vLLM's extra fields (root,
// max_model_len) when the server knows them.
type Model struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"` // "model"
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root,omitempty"`
	Parent      *string `json:"parent"` // the base model of an adapter; null otherwise
	MaxModelLen int     `json:"max_model_len,omitempty"`
}

// ModelList is the body of GET /v1/models.
type ModelList struct {
	Object string  `json:"object"` // "list"
	Data   []Model `json:"data"`
}

// Models wraps models in the list body.
func Models(models []Model) ModelList {
	if models == nil {
		models = []Model{}
	}
	return ModelList{Object: "list", Data: models}
}

// WriteJSON answers 200 with v as indented JSON (the model list and the
// admin listener's views, read by people as often as by programs).
func WriteJSON(w http.ResponseWriter, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		WriteError(w, http.StatusInternalServerError, TypeServer, "the answer could not be encoded")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}
