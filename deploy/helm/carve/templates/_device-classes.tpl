{{- define "carve.deviceClassConfigMap" -}}
{{- $g := .group -}}
# The device-class file {{ if $g.name }}of node group {{ $g.name }}{{ else }}every node plugin of carve-node{{ end }} reads at start-up
# (--config). Every volume group and thin pool named here must exist on
# every node that runs {{ if $g.name }}carve-node-{{ $g.name }}{{ else }}carve-node{{ end }}; docs/install.md shows how to prepare
# them, and how node groups give nodes with other disks other classes. The
# plugin reads the file once: restart the DaemonSet after a change (the
# Helm chart rolls it by itself).
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "carve.fullname" .root }}-device-classes{{ with $g.name }}-{{ . }}{{ end }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "carve.labels" .root | nindent 4 }}
    {{- with $g.name }}
    carve.dev/node-group: {{ . }}
    {{- end }}
data:
  config.yaml: |
    {{- include "carve.deviceClassFile" ($g.deviceClasses | default .root.Values.deviceClasses) | nindent 4 }}
{{- end }}
