{{/* Names: the release name when it already says netclaim, else <release>-netclaim. */}}
{{- define "netclaim.fullname" -}}
{{- if contains "netclaim" .Release.Name -}}
{{- .Release.Name | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-netclaim" .Release.Name | trunc 55 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "netclaim.serviceAccountName" -}}
{{- printf "%s-publisher" (include "netclaim.fullname" .) -}}
{{- end -}}

{{/* The DRA driver names as a list (driverName may be one string or a list). */}}
{{- define "netclaim.driverNames" -}}
{{- $names := .Values.driverName -}}
{{- if kindIs "string" $names -}}{{- $names = list $names -}}{{- end -}}
{{- if not $names -}}{{- fail "driverName is required: the DRA driver whose devices netclaim reports" -}}{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{- define "netclaim.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "netclaim.selectorLabels" -}}
app.kubernetes.io/name: netclaim
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "netclaim.labels" -}}
{{ include "netclaim.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
