{{/* Labels of every object: the kustomize base's, plus Helm's own. */}}
{{- define "autoglm-ebpf.labels" -}}
app.kubernetes.io/name: autoglm-ebpf
app.kubernetes.io/part-of: autoglm-ebpf
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
