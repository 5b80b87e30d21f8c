{{/* Labels on every object: the kustomize base's label plus Helm's own. */}}
{{- define "carve.labels" -}}
app.kubernetes.io/name: carve
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The carve image. */}}
{{- define "carve.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "v%s" .Chart.AppVersion) }}
{{- end }}

{{/* The socket path the kubelet uses to reach the node plugin. */}}
{{- define "carve.pluginDir" -}}
{{ .Values.kubeletDir }}/plugins/lvm.carve.dev
{{- end }}

{{/*
Labels of the ServiceMonitor and the PrometheusRule: carve's, `release` for
kube-prometheus-stack's selectors (metrics.release), and the object's own.
*/}}
{{- define "carve.monitoringLabels" -}}
{{ include "carve.labels" .ctx }}
{{- with .ctx.Values.metrics.release }}
release: {{ . | quote }}
{{- end }}
{{- with .labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The device-class file (the plugin's --config) for a list of classes. */}}
{{- define "carve.deviceClassFile" -}}
{{ toYaml (dict "deviceClasses" .) }}
{{- end }}

{{/* The sidecars' leader election. A replica that stops dead holds its
lease until it expires: the other takes over after at most the lease
duration plus one retry period (docs/operations.md). */}}
{{- define "carve.leaderElectionArgs" -}}
- --leader-election
- --leader-election-lease-duration={{ .Values.controller.leaderElection.leaseDuration }}
- --leader-election-renew-deadline={{ .Values.controller.leaderElection.renewDeadline }}
- --leader-election-retry-period={{ .Values.controller.leaderElection.retryPeriod }}
{{- end }}

{{/* -v and --logging-format of carve or a sidecar, when not the defaults.
dict: level, format. */}}
{{- define "carve.logArgs" -}}
{{- if .level }}
- --v={{ .level }}
{{- end }}
{{- if ne .format "text" }}
- --logging-format={{ .format }}
{{- end }}
{{- end }}
