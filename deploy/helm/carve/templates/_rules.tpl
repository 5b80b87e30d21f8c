{{/*
carve's alert rules: the one source of the PrometheusRule and of
deploy/prometheus/carve-rules.yaml (make manifests renders it with the
default values). Prometheus' own templates are escaped as {{`{{ ... }}`}}.
Each alert's runbook_url points at its section of docs/operations.md.
*/}}
{{- define "carve.rules" -}}
{{- $r := .Values.metrics.prometheusRule -}}
{{- $t := $r.thresholds -}}
{{- $runbook := $r.runbookUrl -}}
{{- $rules := list -}}

{{- $rules = append $rules (dict
  "alert" "CarveVolumeGroupAlmostFull"
  "expr" (printf `(
  max by (node, volume_group) (carve_volume_group_free_bytes unless on (node, device_class) carve_thin_pool_data_percent)
    / max by (node, volume_group) (carve_volume_group_size_bytes)
) < %v
` $t.volumeGroupFreeRatio)
  "for" "15m" "severity" "warning"
  "summary" (printf `Volume group {{ $labels.volume_group }} on {{ $labels.node }} has less than %v%% free space` (mulf $t.volumeGroupFreeRatio 100))
  "description" "New volumes of the thick device classes on this volume group go to other nodes, and volumes here cannot grow much more. Only volume groups that back a thick class count: a volume group whose space went to a thin pool is watched through the pool. Add a disk to the volume group or move workloads.") -}}

{{- $rules = append $rules (dict
  "alert" "CarveVolumeGroupMetadataAlmostFull"
  "expr" (printf `max by (node, volume_group) (carve_volume_group_metadata_free_bytes) < %v
` (int $t.volumeGroupMetadataFreeBytes))
  "for" "15m" "severity" "warning"
  "summary" `The LVM metadata area of volume group {{ $labels.volume_group }} on {{ $labels.node }} has {{ $value | humanize1024 }}B left`
  "description" "Each volume takes about 500 bytes; below 2048 bytes the node takes no new volume of the group's classes, however much space is free. The area cannot be grown in place: plan PVs with a larger pvcreate --metadatasize (docs/install.md, metadata area).") -}}

{{- $rules = append $rules (dict
  "alert" "CarveDeviceClassExhausted"
  "expr" `max by (node, device_class) (carve_capacity_available_bytes) == 0
unless on (node, device_class)
min by (node, device_class) (carve_device_class_available) == 0
`
  "for" "30m" "severity" "info"
  "summary" `Device class {{ $labels.device_class }} on {{ $labels.node }} reports no capacity`
  "description" "The scheduler sends no new volume of this class to this node: its volume group (thick) or thin pool (thin) is full up to the spare, or the thin class's overprovision ratio is used up. A class that is unavailable (its volume group or pool missing or broken, its metadata area full) is CarveDeviceClassUnavailable's, not this alert's.") -}}

{{- $rules = append $rules (dict
  "alert" "CarveDeviceClassUnavailable"
  "expr" `max by (node, device_class, volume_group, reason) (carve_device_class_available == 0)
`
  "for" "5m" "severity" "warning"
  "summary" `Device class {{ $labels.device_class }} on {{ $labels.node }} cannot take volumes: {{ $labels.reason }}`
  "description" "The node agent cannot make volumes of this class (reason: vg-missing, vg-unreadable, pv-missing, thin-pool-missing, thin-pool-unusable, metadata-full, lvm-error, lvm-timeout or not-loaded). Its capacity is 0, so new claims of the class go to other nodes or stay Pending; existing volumes of a missing or broken volume group may be unreadable too. The node agent's log names the volume group and LVM's error.") -}}

{{- $rules = append $rules (dict
  "alert" "CarveThinPoolDataHigh"
  "expr" (printf `max by (node, volume_group, thin_pool) (carve_thin_pool_data_percent) > %v
` $t.thinPoolDataWarningPercent)
  "for" "10m" "severity" "warning"
  "summary" `Thin pool {{ $labels.volume_group }}/{{ $labels.thin_pool }} on {{ $labels.node }} is {{ $value | humanize }}% full (data)`
  "description" "A full thin pool fails writes of every volume in it. Extend the pool (lvextend) or free space before it reaches 100%.") -}}

{{- $rules = append $rules (dict
  "alert" "CarveThinPoolDataCritical"
  "expr" (printf `max by (node, volume_group, thin_pool) (carve_thin_pool_data_percent) > %v
` $t.thinPoolDataCriticalPercent)
  "for" "2m" "severity" "critical"
  "summary" `Thin pool {{ $labels.volume_group }}/{{ $labels.thin_pool }} on {{ $labels.node }} is {{ $value | humanize }}% full (data)`
  "description" "Writes to thin volumes in this pool are about to fail. Extend the pool now.") -}}

{{- $rules = append $rules (dict
  "alert" "CarveThinPoolFillingUp"
  "expr" (printf `max by (node, volume_group, thin_pool) (predict_linear(carve_thin_pool_data_percent[6h], %v * 3600)) >= 100
and
max by (node, volume_group, thin_pool) (carve_thin_pool_data_percent) > %v
` $t.thinPoolFillHours $t.thinPoolFillMinPercent)
  "for" "1h" "severity" "warning"
  "summary" (printf `Thin pool {{ $labels.volume_group }}/{{ $labels.thin_pool }} on {{ $labels.node }} fills up within %v hours at the rate of the last 6 hours` $t.thinPoolFillHours)
  "description" "Overprovisioned pools fill from the applications' writes, not from carve's actions. Extend the pool, or find the volume that grows.") -}}

{{- $rules = append $rules (dict
  "alert" "CarveSnapshotSpaceHigh"
  "expr" (printf `max by (node, device_class, volume_group, snapshot) (carve_snapshot_cow_used_ratio) > %v
unless on (node, volume_group, snapshot)
max by (node, volume_group, snapshot) (carve_snapshot_invalid) == 1
` $t.snapshotSpaceUsedRatio)
  "for" "10m" "severity" "warning"
  "summary" `Thick snapshot {{ $labels.volume_group }}/{{ $labels.snapshot }} on {{ $labels.node }} has used {{ $value | humanizePercentage }} of its copy-on-write space`
  "description" "Every block its volume writes takes space; when it is all used the snapshot is lost (CarveSnapshotInvalid). Restore or copy what it holds now, or take a new snapshot with more space (the class's snapshotSpacePercent).") -}}

{{- $rules = append $rules (dict
  "alert" "CarveSnapshotInvalid"
  "expr" `max by (node, device_class, volume_group, snapshot) (carve_snapshot_invalid) == 1
`
  "for" "1m" "severity" "critical"
  "summary" `Thick snapshot {{ $labels.volume_group }}/{{ $labels.snapshot }} on {{ $labels.node }} ran out of copy-on-write space: its content is lost`
  "description" "No restore reads it (FAILED_PRECONDITION), though its VolumeSnapshot still shows readyToUse: true (csi-snapshotter does not ask again once a snapshot is ready). Delete the VolumeSnapshot and take a new one with more space (the class's snapshotSpacePercent).") -}}

{{- $rules = append $rules (dict
  "alert" "CarveThinPoolMetadataHigh"
  "expr" (printf `max by (node, volume_group, thin_pool) (carve_thin_pool_metadata_percent) > %v
` $t.thinPoolMetadataWarningPercent)
  "for" "10m" "severity" "warning"
  "summary" `Thin pool {{ $labels.volume_group }}/{{ $labels.thin_pool }} on {{ $labels.node }} metadata is {{ $value | humanize }}% full`
  "description" "A thin pool whose metadata fills up goes read-only. Extend its metadata LV (lvextend --poolmetadatasize).") -}}

{{- $rules = append $rules (dict
  "alert" "CarveThinPoolMetadataCritical"
  "expr" (printf `max by (node, volume_group, thin_pool) (carve_thin_pool_metadata_percent) > %v
` $t.thinPoolMetadataCriticalPercent)
  "for" "2m" "severity" "critical"
  "summary" `Thin pool {{ $labels.volume_group }}/{{ $labels.thin_pool }} on {{ $labels.node }} metadata is {{ $value | humanize }}% full`
  "description" "When the metadata is full the pool goes read-only and may need thin_repair. Extend the metadata LV now (lvextend --poolmetadatasize).") -}}

{{- $rules = append $rules (dict
  "alert" "CarveThinPoolNotZeroing"
  "expr" `max by (node, device_class, volume_group, thin_pool) (carve_thin_pool_zeroing) == 0
`
  "for" "5m" "severity" "critical"
  "summary" `Thin pool {{ $labels.volume_group }}/{{ $labels.thin_pool }} of class {{ $labels.device_class }} on {{ $labels.node }} does not zero new blocks`
  "description" "A new thin volume of this class can read data a deleted volume wrote. Turn zeroing on with `lvchange --zero y {{ $labels.volume_group }}/{{ $labels.thin_pool }}` (docs/configuration.md, erasure).") -}}

{{- $rules = append $rules (dict
  "alert" "CarvePhaseErrorRateHigh"
  "expr" (printf `(
  sum by (node, phase) (rate(carve_phase_duration_seconds_count{result!~"OK|ResourceExhausted|Aborted"}[10m]))
    / sum by (node, phase) (rate(carve_phase_duration_seconds_count[10m]))
) > %v
and
sum by (node, phase) (increase(carve_phase_duration_seconds_count{result!~"OK|ResourceExhausted|Aborted"}[10m])) > 2
` $t.errorRatio)
  "for" "5m" "severity" "warning"
  "summary" `carve {{ $labels.phase }} fails on {{ $labels.node }} ({{ $value | humanizePercentage }} of calls)`
  "description" (printf "More than %v%% of the {{ $labels.phase }} calls on this node failed over 10 minutes. Out of space (ResourceExhausted) and busy, retry (Aborted: a retry arrived while the first call still runs) do not count. The plugin's log names the volume and the error; the dashboard's error panel shows the gRPC codes." (mulf $t.errorRatio 100))) -}}

{{- $rules = append $rules (dict
  "alert" "CarveStateRefreshStale"
  "expr" (printf `time() - max by (node) (carve_state_refresh_timestamp_seconds{result="success"}) > %v
` $t.refreshStaleSeconds)
  "for" "5m" "severity" "warning"
  "summary" (printf `carve on {{ $labels.node }} has not read its volume groups for over %v seconds` $t.refreshStaleSeconds)
  "description" "The capacity it reports to the scheduler may be stale. Check that lvm commands work on the node (a hung disk, a stuck LVM lock).") -}}

{{- $rules = append $rules (dict
  "alert" "CarveOrphanedVolumes"
  "expr" `sum by (node, device_class) (carve_orphaned_volumes) > 0
`
  "for" "15m" "severity" "warning"
  "summary" `{{ $value }} orphaned carve volume(s) of class {{ $labels.device_class }} on {{ $labels.node }}`
  "description" "LVs carve made that no PersistentVolume has pointed at for longer than the audit's grace period hold space no claim can use (carve_orphaned_volume_bytes). The Node's OrphanedVolume Events and carve controller's log name each LV, its size and its claim.") -}}

{{- $rules = append $rules (dict
  "alert" "CarveVolumeDataMissing"
  "expr" `sum by (node) (carve_volumes_missing) > 0
`
  "for" "5m" "severity" "critical"
  "summary" `{{ $value }} carve PersistentVolume(s) on {{ $labels.node }} lost their LV`
  "description" "The volume group on this node no longer holds the LV of these PVs (a disk replaced, a volume group made anew, an lvremove by hand): their data is gone and their pods cannot start. VolumeDataMissing Events on the PVs and PVCs name them.") -}}

{{- $rules = append $rules (dict
  "alert" "CarveVolumesAbnormal"
  "expr" `sum by (node, volume_group) (carve_volumes_abnormal) > 0
`
  "for" "10m" "severity" "warning"
  "summary" `{{ $value }} carve volume(s) in volume group {{ $labels.volume_group }} on {{ $labels.node }} are abnormal`
  "description" "The node reports a health problem of these volumes (an LV failed, degraded or on a missing physical volume, its thin pool nearly full) or their LV is missing: their pods may fail to write or to start. VolumeAbnormal Events on their claims say which and why.") -}}

{{- $rules = append $rules (dict
  "alert" "CarveAuditStale"
  "expr" `time() - max by (node) (carve_audit_timestamp_seconds{result="success"}) > 1800
`
  "for" "10m" "severity" "warning"
  "summary" `carve on {{ $labels.node }} has not compared its volumes with the PersistentVolumes for 30 minutes`
  "description" "Orphaned volumes and missing data go unnoticed on this node. carve controller's log says why: the node's agent unreachable over the node channel, the API server unreachable, or RBAC (the carve-controller-audit ClusterRole).") -}}

{{- $rules = append $rules (dict
  "alert" "CarveNodeAnswersRefused"
  "expr" `sum by (node, reason) (increase(carve_node_answers_refused_total[10m])) > 0
`
  "for" "0m" "severity" "critical"
  "summary" `The node agent of {{ $labels.node }} answered about what is not its own ({{ $labels.reason }})`
  "description" "carve controller refused an answer of this node's agent that named another node's volume, snapshot or topology, or a volume another PersistentVolume holds: the node may be compromised (root on it can make its agent say anything) or run a broken build. Nothing was written from the answer; the controller's log has it (\"Refused a node agent's answer\").") -}}

{{- $rules = append $rules (dict
  "alert" "CarveNodeChannelCAExpiring"
  "expr" `min(carve_node_channel_ca_expiry_timestamp_seconds{ca="active"}) - time() < 2592000
`
  "for" "1h" "severity" "critical"
  "summary" `The node channel's CA expires in {{ $value | humanizeDuration }} and has not been rotated`
  "description" "carve controller rotates its CA when a third of the CA's life is left; this one is closer to its end, so the rotation is not happening (the controller's log says why: \"Keeping the node channel's CA\"). When the CA expires every handshake between the controller and the node agents fails, and no volume is made, deleted or snapshotted. Ask for a rotation now or replace the CA (runbook).") -}}

{{- $rules = append $rules (dict
  "alert" "CarveNodeChannelCertificateExpiring"
  "expr" `min by (role, node) (carve_node_channel_certificate_expiry_timestamp_seconds) - time() < 3600
`
  "for" "10m" "severity" "warning"
  "summary" `The node channel certificate of the {{ $labels.role }} {{ $labels.node }} expires within the hour`
  "description" "Certificates of the node channel are renewed at half their life (12 h of 24 h); one that is an hour from its end was not renewed: the node's agent cannot enroll again (see CarveNodeEnrollmentsFailing) or the controller cannot sign. When it expires the controller loses that node.") -}}

{{- $rules = append $rules (dict
  "alert" "CarveNodeEnrollmentsFailing"
  "expr" `sum by (result) (increase(carve_node_enrollments_total{result!="success"}[15m])) > 0
`
  "for" "30m" "severity" "warning"
  "summary" `Enrollments of node agents keep failing ({{ $labels.result }})`
  "description" "carve controller could not enroll a node agent for half an hour: refused means the agent's token did not match its endpoint (an impostor, or a pod that is not carve's node agent behind the Service); error means the agent, its CA bundle or the API server failed. A node that cannot enroll gets no volumes once its certificate expires. The controller's log names the node (\"Node agent not connected\").") -}}

{{- $rules = append $rules (dict
  "alert" "CarveLostNodeVolumes"
  "expr" `max(carve_lost_node_volumes) > 0
`
  "for" "10m" "severity" "warning"
  "summary" `{{ $value }} carve PersistentVolume(s) are pinned to a Node that no longer exists`
  "description" "Their LVs were on the deleted node's disks: the data is gone, and their pods stay Pending until the claims are deleted. The NodeLost Events on the PVs and PVCs name them. With --delete-claims-of-lost-nodes carve controller deletes them once the Node has stayed absent for --lost-node-grace-period (30 min by default; PVs whose reclaim policy is Retain only with --delete-retained-claims-of-lost-nodes): until then this alert says they will go, and past it that the deletion fails (carve_lost_node_volumes_deleted_total, result error; the controller's log says why).") -}}

{{- $rules = append $rules (dict
  "alert" "CarveMoveParked"
  "expr" `max(carve_moves_parked) > 0
`
  "for" "5m" "severity" "critical"
  "summary" `{{ $value }} move(s) of carve claims are parked: their old volume cannot be vouched for`
  "description" "A move (kubectl carve move or drain) lost its old volume's node, or the old volume, while the workload was stopped or while rolling back. Its target volume and seed are kept, as they may hold the only copy of the data; no empty volume is provisioned in its claim's place until the node answers again (the move then resumes) or kubectl carve move --abort releases the claim. MoveParked Events on the claim and the old PV name them.") -}}

{{- $rules = append $rules (dict
  "alert" "CarveCapacityDeletionsHeld"
  "expr" `max(max_over_time(carve_capacity_deletions_held[5m])) > 0
`
  "for" "10m" "severity" "warning"
  "summary" "carve's capacity leaders keep holding deletions of CSIStorageCapacity objects"
  "description" "For 10 minutes, each leader of the Lease carve-controller-capacity in turn found that more of carve's nodes would lose their CSIStorageCapacity objects at once than report to it, kept their last capacity, and gave the Lease up. Either the controller replicas cannot reach the node agents (the node channel: network, NetworkPolicy, the node channel's CA), or most nodes' agents are gone. Until it ends, the scheduler still sends claims to the silent nodes. The controller's log says which nodes (\"Holding deletions of CSIStorageCapacity objects\").") -}}

{{- $rules = append $rules (dict
  "alert" "CarveNotRegisteredWithKubelet"
  "expr" `max by (node) (carve_kubelet_registration{state=~"waiting|failed"}) == 1
`
  "for" "10m" "severity" "warning"
  "summary" `The kubelet on {{ $labels.node }} has not registered carve`
  "description" `Pods on this node cannot mount carve volumes, and the node lacks the topology label the scheduler places carve volumes by. State failed: the plugin's log has the kubelet's reason ("The kubelet could not register carve"). State waiting: the kubelet never called; check that the registration-dir volume is the kubelet's plugins_registry directory.`) -}}

{{- $rules = append $rules (dict
  "alert" "CarveIOLimitsNotApplied"
  "expr" `sum by (node, result) (increase(carve_io_limit_applications_total{result!="ok"}[15m])) > 0
`
  "for" "1m" "severity" "warning"
  "summary" `IO limits of carve volumes could not be applied to pods on {{ $labels.node }}: {{ $labels.result }}`
  "description" "A volume with IO limits (VolumeAttributesClass or StorageClass parameters) was published, modified or re-applied at the node agent's start, and its limits could not be written into a pod's cgroup io.max. unsupported: the node has no cgroup v2 or no io controller, or --cgroup-root is empty (carve_io_limits_supported says which); the publish is refused, so the pod does not start. no-pod: the pod's cgroup was not found under --cgroup-root. error: the node agent's log names the failure.") -}}

{{- $rules = append $rules (dict
  "alert" "CarveVolumeKeyRefused"
  "expr" `sum by (node, reason) (increase(carve_volume_key_refusals_total{reason=~"other_node|key_id|unwrap"}[10m])) > 0
`
  "for" "0m" "severity" "critical"
  "summary" `carve controller refused the node agent of {{ $labels.node }} a volume key ({{ $labels.reason }})`
  "description" "A node agent asked for the key of an encrypted volume that is not its own: a volume whose PersistentVolume is on another node (other_node), a key ID that PersistentVolume does not record (key_id), or a wrapped key that does not unwrap for it (unwrap: another volume's, altered, or under a key-encryption key the Secret lost). No key was released. The node may be compromised, or the key-encryption Secret lost a key; the controller's log has each request (\"Refused a node's request for a volume key\").") -}}

{{- $rules = append $rules (dict
  "alert" "CarveEncryptedVolumeNotOpened"
  "expr" `sum by (node, result) (increase(carve_encrypted_volume_opens_total{result=~"refused|wrong_key|no_header"}[15m])) > 0
`
  "for" "1m" "severity" "warning"
  "summary" `An encrypted carve volume could not be opened on {{ $labels.node }}: {{ $labels.result }}`
  "description" "NodeStageVolume of an encrypted volume failed and the pod waits: carve controller refused its key (refused), the key opened no keyslot of its LUKS2 header (wrong_key), or the LV marked encrypted holds no LUKS2 header or no token of carve's (no_header). carve never formats such a volume. The kubelet's Event on the pod names the volume; the runbook says what each result means.") -}}

{{- $rules = append $rules (dict
  "alert" "CarvePVCPendingTooLong"
  "expr" `max by (namespace, persistentvolumeclaim) (kube_persistentvolumeclaim_status_phase{phase="Pending"}) == 1
and on (namespace, persistentvolumeclaim)
  max by (namespace, persistentvolumeclaim) (kube_pod_spec_volumes_persistentvolumeclaims_info)
and on (namespace, persistentvolumeclaim)
  (
    max by (namespace, persistentvolumeclaim, storageclass) (kube_persistentvolumeclaim_info)
    * on (storageclass) group_left ()
    max by (storageclass) (kube_storageclass_info{provisioner="lvm.carve.dev"})
  )
`
  "for" $t.pvcPendingFor "severity" "warning"
  "summary" `PVC {{ $labels.namespace }}/{{ $labels.persistentvolumeclaim }} of a carve StorageClass is Pending while a pod waits for it`
  "description" "No node could take the volume, or its node's plugin cannot create it. kubectl describe pvc shows the last event; kubectl carve pending lists every such PVC with its reason. Needs kube-state-metrics.") -}}

{{- $rules = append $rules (dict
  "alert" "CarvePluginDown"
  "expr" `up{job="carve-node-metrics"} == 0
`
  "for" "5m" "severity" "critical"
  "summary" `carve's node plugin on {{ $labels.node }} cannot be scraped`
  "description" "Volumes on this node cannot be created, mounted, grown or deleted while the plugin is down. Check the carve-node pod on that node; a pod that restarts in a loop shows here too.") -}}

{{- $rules = append $rules (dict
  "alert" "CarvePluginAbsent"
  "expr" `absent(up{job="carve-node-metrics"})
`
  "for" "15m" "severity" "critical"
  "summary" "Prometheus scrapes no carve node plugin at all"
  "description" "Either carve is not running anywhere or its ServiceMonitor / scrape configuration is missing (kube-prometheus-stack needs its release label on the ServiceMonitor).") -}}

groups:
  - name: carve
    rules:
{{- range $rules }}
{{- if not (has .alert $r.disabled) }}
      - alert: {{ .alert }}
        expr: |
          {{- .expr | trimSuffix "\n" | nindent 10 }}
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
          {{- with $r.additionalLabels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ .summary | quote }}
          description: {{ .description | quote }}
          runbook_url: {{ printf "%s#%s" $runbook (lower .alert) | quote }}
{{- end }}
{{- end }}
{{- end }}
