{{- define "kvgate.labels" -}}
app.kubernetes.io/name: kvgate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "kvgate.selector" -}}
app.kubernetes.io/name: kvgate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
