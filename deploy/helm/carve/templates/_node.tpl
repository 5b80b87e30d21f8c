{{/*
carve.nodeDaemonSet renders one node DaemonSet. dict: root (the chart's
top context), group (a nodeGroups entry, or an empty dict for carve-node).
*/}}
{{- define "carve.nodeDaemonSet" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $g := .group -}}
{{- $pluginDir := include "carve.pluginDir" $root -}}
{{- $name := "carve-node" -}}
{{- $config := "carve-device-classes" -}}
{{- if $g.name -}}
{{- $name = printf "carve-node-%s" $g.name -}}
{{- $config = printf "carve-device-classes-%s" $g.name -}}
{{- end -}}
# The node DaemonSet{{ if $g.name }} of node group {{ $g.name }} (nodes labelled
# carve.dev/node-group={{ $g.name }}){{ end }}: the whole CSI plugin runs on
# every node that holds volumes ("distributed provisioning"). The node's own
# csi-provisioner creates the volumes of PVCs whose selected node is this
# node and publishes this node's capacity; its own csi-snapshotter
# (--node-deployment) makes the snapshots of this node's volumes, which a
# snapshot-controller run with --enable-distributed-snapshotting hands to it
# (docs/install.md). carve registers itself with the
# kubelet (a socket in the kubelet's plugins_registry directory) and serves
# its own health endpoints, so neither node-driver-registrar nor
# livenessprobe runs here: the kubelet probes /healthz (liveness: the process
# serves) and /readyz (readiness: every configured volume group and thin pool
# is there) on the metrics port.
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
      serviceAccountName: carve-node
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
        {{- with $g.name }}
        carve.dev/node-group: {{ . }}
        {{- end }}
      {{- if not $g.name }}
      {{- with $v.node.affinity }}
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
      containers:
        - name: carve
          image: {{ include "carve.image" $root }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          args:
            - plugin
            - --endpoint=unix:///csi/csi.sock
            - --node-name=$(NODE_NAME)
            - --config=/etc/carve/config.yaml
            - --metrics-address=0.0.0.0:{{ $v.node.metricsPort }}
            # The kubelet finds carve here, and dials its CSI socket at the
            # path the socket-dir volume has on the host.
            - --kubelet-registration-dir=/registration
            - --kubelet-csi-socket={{ $pluginDir }}/csi.sock
            {{- if $v.node.maxVolumes }}
            - --max-volumes={{ $v.node.maxVolumes }}
            {{- end }}
            {{- with $v.node.audit }}
            {{- if ne .interval "1m" }}
            - --audit-interval={{ .interval }}
            {{- end }}
            {{- if ne .orphanGracePeriod "10m" }}
            - --orphan-grace-period={{ .orphanGracePeriod }}
            {{- end }}
            {{- if .removeOrphans }}
            - --remove-orphans
            {{- end }}
            {{- end }}
            {{- include "carve.logArgs" (dict "level" $v.node.logLevel "format" $v.logFormat) | nindent 12 }}
            {{- with $v.node.extraArgs }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          env:
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
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
            - name: kubelet-dir
              mountPath: {{ $v.kubeletDir }}
              mountPropagation: Bidirectional
            - name: dev
              mountPath: /dev
            - name: lvm-config
              mountPath: /etc/lvm
            - name: lvm-lock
              mountPath: /run/lock/lvm
            - name: device-classes
              mountPath: /etc/carve
              readOnly: true
        - name: csi-provisioner
          image: {{ $v.sidecars.provisioner.image.repository }}:{{ $v.sidecars.provisioner.image.tag }}
          imagePullPolicy: IfNotPresent
          args:
            - --csi-address=/csi/csi.sock
            - --node-deployment
            - --strict-topology
            - --immediate-topology=false
            - --enable-capacity
            - --capacity-ownerref-level=0
            - --extra-create-metadata
            # Ask for capacity every 2 s (default 1m): GetCapacity answers
            # from carve's memory, no LVM command, and an unchanged answer
            # writes nothing; carve's view follows a change made outside
            # carve within about 2 s (it watches LVM's metadata backups), so
            # the scheduler sees it within about 4 s.
            - --capacity-poll-interval=2s
            # Client-side limits on the API (default 5/s, burst 10): each
            # claim costs a PV create and two events, so a burst of claims
            # on one node waited seconds for the limiter alone.
            - --kube-api-qps=20
            - --kube-api-burst=100
            # csi_sidecar_operations_seconds and the provisioner's work
            # queues, scraped through carve-provisioner-metrics.
            - --http-endpoint=:{{ $v.node.provisionerMetricsPort }}
            {{- include "carve.logArgs" (dict "level" $v.sidecars.provisioner.logLevel "format" $v.logFormat) | nindent 12 }}
            {{- with $v.sidecars.provisioner.extraArgs }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: prov-metrics
              containerPort: {{ $v.node.provisionerMetricsPort }}
              protocol: TCP
          env:
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            - name: NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            {{- with $v.sidecars.provisioner.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with $v.sidecars.provisioner.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $v.sidecars.provisioner.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          terminationMessagePolicy: FallbackToLogsOnError
          volumeMounts:
            - name: socket-dir
              mountPath: /csi
        {{- if $v.sidecars.snapshotter.enabled }}
        # --node-deployment: act only on the VolumeSnapshotContents labelled
        # with this node (NODE_NAME); no leader election then. carve has no
        # volume group snapshots.
        - name: csi-snapshotter
          image: {{ $v.sidecars.snapshotter.image.repository }}:{{ $v.sidecars.snapshotter.image.tag }}
          imagePullPolicy: IfNotPresent
          args:
            - --csi-address=/csi/csi.sock
            - --node-deployment
            - --feature-gates=CSIVolumeGroupSnapshot=false
            {{- include "carve.logArgs" (dict "level" $v.sidecars.snapshotter.logLevel "format" $v.logFormat) | nindent 12 }}
            {{- with $v.sidecars.snapshotter.extraArgs }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          env:
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            {{- with $v.sidecars.snapshotter.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with $v.sidecars.snapshotter.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $v.sidecars.snapshotter.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          terminationMessagePolicy: FallbackToLogsOnError
          volumeMounts:
            - name: socket-dir
              mountPath: /csi
        {{- end }}
      volumes:
        - name: socket-dir
          hostPath:
            path: {{ $pluginDir }}
            type: DirectoryOrCreate
        - name: registration-dir
          hostPath:
            path: {{ $v.kubeletDir }}/plugins_registry
            type: Directory
        - name: kubelet-dir
          hostPath:
            path: {{ $v.kubeletDir }}
            type: Directory
        - name: dev
          hostPath:
            path: /dev
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
        - name: device-classes
          configMap:
            name: {{ $config }}
{{- end }}
