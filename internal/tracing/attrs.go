package tracing

import (
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// The attributes of kvgate's spans and access log: OpenTelemetry's HTTP and
// GenAI semantic conventions where they name the thing, kvgate.* for the rest.
// Neither credentials nor prompts are ever recorded.
const (
	// GenAI semantic conventions (not in the Go semconv packages).
	GenAIOperation    = attribute.Key("gen_ai.operation.name")
	GenAIRequestModel = attribute.Key("gen_ai.request.model")
	GenAIInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	GenAIOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
	// GenAITTFT is the time to the answer's first bytes, in seconds: the
	// GenAI conventions' gen_ai.server.time_to_first_token metric, as an
	// attribute.
	GenAITTFT = attribute.Key("gen_ai.server.time_to_first_token")

	HTTPMethod      = semconv.HTTPRequestMethodKey
	HTTPStatus      = semconv.HTTPResponseStatusCodeKey
	HTTPResendCount = semconv.HTTPRequestResendCountKey
	URLPath         = semconv.URLPathKey
	ServerAddress   = semconv.ServerAddressKey
	ServerPort      = semconv.ServerPortKey
	ErrorType       = semconv.ErrorTypeKey

	RequestID  = attribute.Key("kvgate.request_id")
	Scheduler  = attribute.Key("kvgate.scheduler")
	Candidates = attribute.Key("kvgate.candidates")
	// Endpoint is the endpoint that served (request span) or was tried
	// (attempt span); Winner the one the picker chose, tried first.
	Endpoint = attribute.Key("kvgate.endpoint")
	Winner   = attribute.Key("kvgate.winner")
	// Score is the winner's total score; Scores every ranked candidate's,
	// "addr total name=value ..., addr ...".
	Score       = attribute.Key("kvgate.score")
	Scores      = attribute.Key("kvgate.scores")
	Retries     = attribute.Key("kvgate.retries")
	RetryReason = attribute.Key("kvgate.retry.reason")
	Attempt     = attribute.Key("kvgate.attempt")
	Tenant      = attribute.Key("kvgate.tenant")
	// Member is the tier-1 gateway a kvgate global attempt went to.
	Member = attribute.Key("kvgate.member")
)

// EventFirstToken marks, on an attempt span, when the answer's first bytes
// arrived.
const EventFirstToken = "gen_ai.first_token"

// Operation is the GenAI operation name of an OpenAI API path, "" for none.
func Operation(path string) string {
	switch path {
	case "/v1/chat/completions", "/v1/responses":
		return "chat"
	case "/v1/completions":
		return "text_completion"
	case "/v1/embeddings":
		return "embeddings"
	}
	return ""
}
