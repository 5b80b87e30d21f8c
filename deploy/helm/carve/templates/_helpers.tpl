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
{{ include "carve.imageRef" (dict "ctx" . "image" .Values.image "tag" (.Values.image.tag | default (printf "v%s" .Chart.AppVersion))) }}
{{- end }}

{{/* An image reference: repository:tag, with the repository's registry
(its first path element) replaced by .Values.imageRegistry when that is
set, so one value moves every image to a mirror. dict: ctx, image, tag. */}}
{{- define "carve.imageRef" -}}
{{- $repo := .image.repository -}}
{{- with .ctx.Values.imageRegistry -}}
{{- $parts := splitList "/" $repo -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $parts = rest $parts -}}
{{- end -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" .) (join "/" $parts) -}}
{{- end -}}
{{ $repo }}:{{ .tag | default .image.tag }}
{{- end }}

{{/* Whether the chart makes snapshot objects (VolumeSnapshotClasses):
the snapshotter is on and the cluster serves snapshot.storage.k8s.io/v1.
Without the API, applying them would fail the whole install; Helm checks
every object against the API before it creates any, so CRDs installed by
crds.install serve them from the next helm upgrade on. */}}
{{- define "carve.snapshotAPI" -}}
{{- if and .Values.sidecars.snapshotter.enabled (.Capabilities.APIVersions.Has "snapshot.storage.k8s.io/v1") }}true{{ end -}}
{{- end }}

{{/* The prefix of every object's name: fullnameOverride, else
nameOverride, else carve. The release name is not part of it (one carve per
cluster: the CSIDriver lvm.carve.dev is cluster-wide). The
app.kubernetes.io/name label stays carve: kubectl carve, the dashboard and
the alert rules select by it. */}}
{{- define "carve.fullname" -}}
{{ .Values.fullnameOverride | default .Values.nameOverride | default "carve" | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/* The service accounts (node.serviceAccount, controller.serviceAccount). */}}
{{- define "carve.nodeServiceAccount" -}}
{{ .Values.node.serviceAccount.name | default (printf "%s-node" (include "carve.fullname" .)) }}
{{- end }}
{{- define "carve.controllerServiceAccount" -}}
{{ .Values.controller.serviceAccount.name | default (printf "%s-controller" (include "carve.fullname" .)) }}
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

{{/*
The TLS Secret of the external-snapshot-metadata sidecar.
*/}}
{{- define "carve.snapshotMetadataSecret" -}}
{{- .Values.sidecars.snapshotMetadata.tls.secretName | default (printf "%s-snapshot-metadata-tls" (include "carve.fullname" .)) -}}
{{- end }}
