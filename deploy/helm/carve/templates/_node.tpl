{{/*
carve.nodeDaemonSet renders one node DaemonSet. dict: root (the chart's
top context), group (a nodeGroups entry, or an empty dict for carve-node).
*/}}
{{- define "carve.nodeDaemonSet" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $g := .group -}}
{{- $kubeletDir := $g.kubeletDir | default $v.kubeletDir -}}
{{- $pluginDir := printf "%s/plugins/lvm.carve.dev" $kubeletDir -}}
{{- $fullname := include "carve.fullname" $root -}}
{{- $name := printf "%s-node" $fullname -}}
{{- $config := printf "%s-device-classes" $fullname -}}
{{- if $g.name -}}
{{- $name = printf "%s-node-%s" $fullname $g.name -}}
{{- $config = printf "%s-device-classes-%s" $fullname $g.name -}}
{{- end -}}
# The node DaemonSet{{ if $g.name }} of node group {{ $g.name }} (nodes labelled
# carve.dev/node-group={{ $g.name }}){{ end }}: the node agent, one container
# (carve-node node) on every node that holds volumes. It serves the kubelet
# (Node service, on the socket it registers in the kubelet's
# plugins_registry directory) and, on the node channel (TLS port
# node-channel), the controller: carve controller calls this node's
# Controller service and node agent there, and csi-provisioner and
# csi-snapshotter run beside carve controller, not here. The node channel's
# CA certificate comes from the ConfigMap carve-node-channel-ca (made by
# carve controller; optional, so a pod starts before it exists and no
# handshake succeeds until it does); the projected token (audience
# carve-controller, bound to this pod) proves this pod's node when the
# controller enrolls it. The node agent uses no Kubernetes API: no API
# token is mounted, and its service account is bound to no role (carve
# controller audits the node's LVs over the node channel). carve serves
# its own health endpoints, so neither node-driver-registrar nor
# livenessprobe runs here: the kubelet probes /healthz (liveness: the
# process serves) and /readyz (readiness: every configured volume group and
# thin pool is there) on the metrics port.
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "carve.labels" $root | nindent 4 }}
    app.kubernetes.io/component: node
    {{- with $g.name }}
    carve.dev/node-group: {{ . }}
    {{- end }}
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: carve
      app.kubernetes.io/component: node
      {{- if $g.name }}
      carve.dev/node-group: {{ $g.name }}
      {{- else }}
    # Not the pods of node groups' DaemonSets.
    matchExpressions:
      - key: carve.dev/node-group
        operator: DoesNotExist
      {{- end }}
  {{- with $v.node.updateStrategy }}
  updateStrategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  template:
    metadata:
      labels:
        {{- with $v.node.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        app.kubernetes.io/name: carve
        app.kubernetes.io/component: node
        {{- with $g.name }}
        carve.dev/node-group: {{ . }}
        {{- end }}
      annotations:
        {{- with $v.node.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        # A changed device-class file rolls the pods (the plugin reads it
        # once, at start).
        carve.dev/device-classes: {{ include "carve.deviceClassFile" ($g.deviceClasses | default $v.deviceClasses) | sha256sum | trunc 16 | quote }}
    spec:
      serviceAccountName: {{ include "carve.nodeServiceAccount" $root }}
      # No API token: the node agent holds no Kubernetes API rights. The
      # service account only names the pod in its projected token for carve
      # controller (the node-channel-token volume).
      automountServiceAccountToken: false
      {{- with $v.node.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      nodeSelector:
        {{- with $v.node.nodeSelector }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- if $g.nodeSelector }}
        {{- /* A group chosen by its own nodeSelector instead of the label. */}}
        {{- toYaml $g.nodeSelector | nindent 8 }}
        {{- else if $g.name }}
        carve.dev/node-group: {{ $g.name }}
        {{- end }}
      {{- if not $g.name }}
      {{- /* carve-node stays off the nodes of groups chosen by a
      nodeSelector: each key=value of theirs is a NotIn here (two carve
      plugins on one node would share its socket). */}}
      {{- $aff := deepCopy ($v.node.affinity | default dict) }}
      {{- $excl := list }}
      {{- range $v.nodeGroups }}{{ range $k, $val := .nodeSelector }}{{ $excl = append $excl (dict "key" $k "operator" "NotIn" "values" (list $val)) }}{{ end }}{{ end }}
      {{- if $excl }}
      {{- $na := get $aff "nodeAffinity" | default dict }}
      {{- $req := get $na "requiredDuringSchedulingIgnoredDuringExecution" | default dict }}
      {{- $terms := get $req "nodeSelectorTerms" | default (list dict) }}
      {{- range $terms }}{{ $_ := set . "matchExpressions" (concat (get . "matchExpressions" | default list) $excl) }}{{ end }}
      {{- $_ := set $req "nodeSelectorTerms" $terms }}
      {{- $_ := set $na "requiredDuringSchedulingIgnoredDuringExecution" $req }}
      {{- $_ := set $aff "nodeAffinity" $na }}
      {{- end }}
      {{- with $aff }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- end }}
      {{- with (hasKey $g "tolerations" | ternary $g.tolerations $v.node.tolerations) }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.node.podSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.node.initContainers }}
      initContainers:
        {{- tpl (toYaml .) $root | nindent 8 }}
      {{- end }}
      containers:
        - name: carve
          image: {{ include "carve.image" $root }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          # carve-node: the node agent's build of carve, without the
          # controller role and any Kubernetes client (half the memory),
          # under tini, which reaps the processes lvm's daemons leave to
          # PID 1 and forwards SIGTERM to carve alone (Dockerfile).
          command:
            - /usr/bin/tini
            - --
            - /usr/local/bin/carve-node
          args:
            - node
            - --endpoint=unix:///csi/csi.sock
            - --node-name=$(NODE_NAME)
            - --config=/etc/carve/config.yaml
            - --metrics-address=0.0.0.0:{{ $v.node.metricsPort }}
            # The kubelet finds carve here, and dials its CSI socket at the
            # path the socket-dir volume has on the host.
            - --kubelet-registration-dir=/registration
            - --kubelet-csi-socket={{ $pluginDir }}/csi.sock
            # carve's own directory on the node's disk (node.stateDir):
            # the marks of volumes being made and formatted.
            - --state-dir=/var/lib/carve
            # The host's cgroup hierarchy (the container's own
            # /sys/fs/cgroup shows only its own cgroup): volumes' IO
            # limits go into the io.max of the pods they are published to.
            - --cgroup-root=/host/sys/fs/cgroup
            # The node channel: the pod's own address (the one its
            # EndpointSlice names), the CA bundle and the projected token.
            - --node-channel-address=$(POD_IP):{{ $v.node.nodeChannelPort }}
            - --node-channel-ca-file=/etc/carve/node-channel/ca.crt
            - --node-channel-token-file=/var/run/secrets/carve.dev/token
            {{- if $v.node.nodeCopyPort }}
            # Where other node agents read this node's volumes for
            # restores and clones across nodes (node.nodeCopyPort).
            - --node-copy-address=$(POD_IP):{{ $v.node.nodeCopyPort }}
            {{- end }}
            {{- if $v.node.maxVolumes }}
            - --max-volumes={{ $v.node.maxVolumes }}
            {{- end }}
            {{- include "carve.logArgs" (dict "level" $v.node.logLevel "format" $v.logFormat) | nindent 12 }}
            {{- with $v.node.extraArgs }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- with $g.extraArgs }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          env:
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            # No udev inside the container: LVM makes the /dev/<vg>/<lv>
            # nodes itself instead of waiting for a udev it cannot reach.
            - name: DM_DISABLE_UDEV
              value: "1"
            {{- with $v.node.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with $v.node.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          ports:
            - name: metrics
              containerPort: {{ $v.node.metricsPort }}
              protocol: TCP
            - name: node-channel
              containerPort: {{ $v.node.nodeChannelPort }}
              protocol: TCP
            {{- if $v.node.nodeCopyPort }}
            - name: node-copy
              containerPort: {{ $v.node.nodeCopyPort }}
              protocol: TCP
            {{- end }}
          {{- with $v.node.livenessProbe }}
          livenessProbe:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $v.node.readinessProbe }}
          readinessProbe:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with ($g.resources | default $v.node.resources) }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          # A plugin that exits shows its last log lines in kubectl describe.
          terminationMessagePolicy: FallbackToLogsOnError
          volumeMounts:
            - name: socket-dir
              mountPath: /csi
            - name: registration-dir
              mountPath: /registration
            - name: state-dir
              mountPath: /var/lib/carve
            - name: kubelet-dir
              mountPath: {{ $kubeletDir }}
              mountPropagation: Bidirectional
            - name: dev
              mountPath: /dev
            - name: cgroup
              mountPath: /host/sys/fs/cgroup
            - name: lvm-config
              mountPath: /etc/lvm
            - name: lvm-lock
              mountPath: /run/lock/lvm
            - name: config
              mountPath: /etc/carve
              readOnly: true
            - name: node-channel-token
              mountPath: /var/run/secrets/carve.dev
              readOnly: true
            {{- with $v.node.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: socket-dir
          hostPath:
            path: {{ $pluginDir }}
            type: DirectoryOrCreate
        - name: registration-dir
          hostPath:
            path: {{ $kubeletDir }}/plugins_registry
            type: Directory
        # Only carve mounts it; it must outlive the pod and the node's
        # reboots (carve refuses a tmpfs or ramfs).
        - name: state-dir
          hostPath:
            path: {{ $v.node.stateDir }}
            type: DirectoryOrCreate
        - name: kubelet-dir
          hostPath:
            path: {{ $kubeletDir }}
            type: Directory
        - name: dev
          hostPath:
            path: /dev
            type: Directory
        - name: cgroup
          hostPath:
            path: /sys/fs/cgroup
            type: Directory
        # The host's LVM configuration, metadata backups and archives, and
        # LVM's lock directory: lvm2 in the container and on the host then
        # share one view and one set of locks.
        - name: lvm-config
          hostPath:
            path: /etc/lvm
            type: DirectoryOrCreate
        - name: lvm-lock
          hostPath:
            path: /run/lock/lvm
            type: DirectoryOrCreate
        # /etc/carve: the device-class file (config.yaml) and the node
        # channel's CA certificate (node-channel/ca.crt), which carve
        # controller publishes; one volume, since a mount nested in a
        # ConfigMap's (read-only) mount cannot be made.
        - name: config
          projected:
            sources:
              - configMap:
                  name: {{ $config }}
              - configMap:
                  name: {{ $fullname }}-node-channel-ca
                  optional: true
                  items:
                    - key: ca.crt
                      path: node-channel/ca.crt
        # The token carve controller checks with a TokenReview at enrollment.
        - name: node-channel-token
          projected:
            sources:
              - serviceAccountToken:
                  audience: carve-controller
                  expirationSeconds: 3600
                  path: token
        {{- with $v.node.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
{{- end }}
