{{- define "kvgate.labels" -}}
app.kubernetes.io/name: kvgate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "kvgate.selector" -}}
app.kubernetes.io/name: kvgate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /* Shared state is on: forced, or "auto" above one replica. */ -}}
{{- define "kvgate.shared" -}}
{{- $e := toString .Values.sharedState.enabled -}}
{{- if or (eq $e "true") (and (eq $e "auto") (gt (int .Values.replicas) 1)) }}true{{ end -}}
{{- end -}}
{{- /* The chart runs Redis: shared state on and no external one named. */ -}}
{{- define "kvgate.bundledRedis" -}}
{{- if and (include "kvgate.shared" .) (not .Values.sharedState.redis) }}true{{ end -}}
{{- end -}}
{{- define "kvgate.redisAddr" -}}
{{- if .Values.sharedState.redis }}{{ .Values.sharedState.redis }}{{ else }}{{ .Release.Name }}-redis:6379{{ end -}}
{{- end -}}
{{- define "kvgate.redisSecret" -}}
{{- if .Values.sharedState.existingSecret }}{{ .Values.sharedState.existingSecret }}{{ else if include "kvgate.bundledRedis" . }}{{ .Release.Name }}-redis{{ end -}}
{{- end -}}
{{- /* The API listener's TLS Secret: tls.secretName, else the chart-made config's spec.tls.secretName. */ -}}
{{- define "kvgate.tlsSecret" -}}
{{- .Values.tls.secretName | default (dig "tls" "secretName" "" (.Values.config.spec | default dict)) -}}
{{- end -}}
{{- /* The admin port's ClusterRoles: cluster-scoped, so named by namespace and release. */ -}}
{{- define "kvgate.adminRole" -}}
{{ .Release.Namespace }}-{{ .Release.Name }}-admin
{{- end -}}
{{- /* /metrics wants a token. */ -}}
{{- define "kvgate.metricsAuth" -}}
{{- if and (eq .Values.admin.auth "kubernetes") .Values.admin.metricsAuth }}true{{ end -}}
{{- end -}}
