{{/*
The helpers `helm create` writes. Every object's name comes from the release
(fullname), so two releases never share an object, cluster-scoped ones
included. The default install (release autoglm-ebpf) is named autoglm-ebpf
throughout, as the kustomize base: a release name that contains the chart's
name is used as it is.
*/}}

{{/* The app's name: the chart's, or nameOverride. */}}
{{- define "autoglm-ebpf.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name, at most 63 characters (DNS labels: a Service's name is
one). fullnameOverride, else the release's name where it contains the app's,
else RELEASE-NAME.
*/}}
{{- define "autoglm-ebpf.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The helm.sh/chart label. */}}
{{- define "autoglm-ebpf.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
What selects the release's own pods and Service: the app and the release,
so that two releases in one namespace do not select each other's pods.
*/}}
{{- define "autoglm-ebpf.selectorLabels" -}}
app.kubernetes.io/name: {{ include "autoglm-ebpf.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of every object: the kustomize base's (selector labels and part-of),
plus Helm's own. The version is the image's tag, the one running.
*/}}
{{- define "autoglm-ebpf.labels" -}}
{{ include "autoglm-ebpf.selectorLabels" . }}
app.kubernetes.io/part-of: autoglm-ebpf
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "autoglm-ebpf.chart" . }}
{{- end }}

{{/* The ServiceAccount the agent runs as. */}}
{{- define "autoglm-ebpf.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "autoglm-ebpf.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The PriorityClass the pod asks for: the one the chart makes (named after the
release unless priorityClass.name says), or an existing one, or none.
*/}}
{{- define "autoglm-ebpf.priorityClassName" -}}
{{- if .Values.priorityClass.create }}
{{- default (printf "%s-node-agent" (include "autoglm-ebpf.fullname" .)) .Values.priorityClass.name }}
{{- else }}
{{- .Values.priorityClass.name }}
{{- end }}
{{- end }}

{{/* The image: repository@digest when a digest is given, else repository:tag. */}}
{{- define "autoglm-ebpf.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
The beta AppArmor annotation saying what podSecurityContext.appArmorProfile
says (the API server refuses a pod where the two differ); none without it.
*/}}
{{- define "autoglm-ebpf.appArmorAnnotation" -}}
{{- with .Values.podSecurityContext.appArmorProfile }}
{{- if eq .type "Unconfined" }}unconfined
{{- else if eq .type "RuntimeDefault" }}runtime/default
{{- else if eq .type "Localhost" }}localhost/{{ .localhostProfile }}
{{- end }}
{{- end }}
{{- end }}
