{{/* The chart's name: nameOverride, else netclaim (the app.kubernetes.io/name label). */}}
{{- define "netclaim.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 55 | trimSuffix "-" -}}
{{- end -}}

{{/* Names: fullnameOverride; else the release name when it already says the chart's name, else <release>-<name>. */}}
{{- define "netclaim.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "netclaim.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 55 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "netclaim.serviceAccountName" -}}
{{- printf "%s-publisher" (include "netclaim.fullname" .) -}}
{{- end -}}

{{/* The DRA driver names as a list (driverName may be one string or a list); no driver: the render fails,
saying what to set (values.yaml has no default on purpose: a wrong driver would install and report nothing). */}}
{{- define "netclaim.driverNames" -}}
{{- $names := .Values.driverName -}}
{{- if kindIs "string" $names -}}{{- $names = compact (list $names) -}}{{- end -}}
{{- if not $names -}}
{{- fail "driverName is required: set it to the DRA driver name of the network devices netclaim reports, the driver their DeviceClass selects (e.g. --set driverName=nic.acme.io; several: --set 'driverName={a.example.com,b.example.com}')" -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{- /* registry/repository@digest when a digest is given (what a release pins), else repository:tag. */ -}}
{{- define "netclaim.image" -}}
{{- $repo := .Values.image.repository -}}
{{- with .Values.image.registry }}{{ $repo = printf "%s/%s" . $repo }}{{ end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "netclaim.selectorLabels" -}}
app.kubernetes.io/name: {{ include "netclaim.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* A label value may not hold "+" (semver build metadata): "_" instead, as helm's own charts do. */}}
{{- define "netclaim.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Every object's labels: the selector, version, chart, and commonLabels. */}}
{{- define "netclaim.labels" -}}
{{ include "netclaim.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "netclaim.chart" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
A container's securityContext. Default: uid 0 with every capability dropped,
no privilege escalation, read-only root. securityContext.privileged is for
platforms whose policy gives hostPath writes only to privileged containers
(OpenShift without a custom SCC, some SELinux-enforcing RHEL nodes); the API
refuses privileged together with allowPrivilegeEscalation=false, so that one
is left out then. securityContext.seLinuxType sets the SELinux type (spc_t
lets a container write the host's CNI and state directories). Called with
(dict "Values" .Values "add" (list ...)), the capabilities in `add` are kept
(the publisher's SYS_ADMIN for the live-interface watch).
*/}}
{{- define "netclaim.securityContext" -}}
{{- $caps := dict "drop" (list "ALL") -}}
{{- with .add -}}{{- $_ := set $caps "add" . -}}{{- end -}}
{{- $sc := dict "runAsUser" 0 "readOnlyRootFilesystem" true "capabilities" $caps -}}
{{- if .Values.securityContext.privileged -}}
{{- $_ := set $sc "privileged" true -}}
{{- else -}}
{{- $_ := set $sc "allowPrivilegeEscalation" false -}}
{{- end -}}
{{- with .Values.securityContext.seLinuxType -}}
{{- $_ := set $sc "seLinuxOptions" (dict "type" .) -}}
{{- end -}}
{{- toYaml $sc -}}
{{- end -}}

{{/*
The plugin log's directory, which the chain keeper mounts and empties on
uninstall; only a directory of netclaim's own (values.schema.json insists its
name contains "netclaim"), never a shared one such as /var/log. Empty when no
log file is set.
*/}}
{{- define "netclaim.pluginLogDir" -}}
{{- with .Values.cni.pluginLogFile -}}{{- dir . -}}{{- end -}}
{{- end -}}

{{/*
An integer setting of the plugin as a ConfigMap string: "" when unset (nil or ""), else its
decimal digits. A number from a values file reaches the template as a float64, which would print
1099511627776 as 1.099511627776e+12; int64 first keeps every digit.
*/}}
{{- define "netclaim.pluginInteger" -}}
{{- if or (kindIs "invalid" .) (eq (toString .) "") -}}
""
{{- else -}}
{{- . | int64 | toString | quote -}}
{{- end -}}
{{- end -}}

{{/* Where the probe listeners bind: the node's 127.0.0.1 (no pod reaches it), or, with
metrics.probeHost=node, the node's address (only for test nodes that share one loopback). */}}
{{- define "netclaim.probeAddressHost" -}}
{{- if eq .Values.metrics.probeHost "node" -}}$(HOST_IP){{- else -}}127.0.0.1{{- end -}}
{{- end -}}

{{/* A probe's handler. probes.mode=exec: the process's own unix socket (.socket, root's, in the run dir),
asked by a command in the container that passes only when root answers 200 (publisher/observe/localprobe.py).
tcp: httpGet to the probe port (.port). */}}
{{- define "netclaim.probeHandler" -}}
{{- if eq .root.Values.probes.mode "exec" -}}
exec: {command: ["/opt/netclaim/venv/bin/python", "-I", "-m", "publisher.observe.localprobe", {{ .socket | quote }}, {{ .path | quote }}]}
{{- else -}}
httpGet: {{ include "netclaim.probeGet" . }}
{{- end -}}
{{- end -}}

{{/* A probe's httpGet: to 127.0.0.1, or (probeHost=node) to the pod's IP, the node's for hostNetwork. */}}
{{- define "netclaim.probeGet" -}}
{{- if eq .root.Values.metrics.probeHost "node" -}}
{path: {{ .path }}, port: {{ .port }}}
{{- else -}}
{host: 127.0.0.1, path: {{ .path }}, port: {{ .port }}}
{{- end -}}
{{- end -}}
