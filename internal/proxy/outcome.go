package proxy

import "strconv"

// The `code` label values of every front's request metrics that are not HTTP
// statuses. One set, so that a dashboard reads tier 1, the EPP front and tier
// 2 alike.
const (
	// CodeClientGone is nginx's 499: the client went away before its answer
	// was through.
	CodeClientGone = "499"
	// CodeStreamError is a response that broke after its headers went out.
	CodeStreamError = "stream_error"
	// CodeUnseen is a request whose response the EPP data plane never saw.
	CodeUnseen = "unseen"
)

// StatusClientClosed is the status behind CodeClientGone.
const StatusClientClosed = 499

// Code is the label of a response answered with status.
func Code(status int) string { return strconv.Itoa(status) }
