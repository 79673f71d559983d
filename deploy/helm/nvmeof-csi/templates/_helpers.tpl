{{/* Labels every object of the chart carries. */}}
{{- define "nvmeof-csi.labels" -}}
app.kubernetes.io/part-of: nvmeof-csi
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* An image reference from {registry, repository, tag, digest}; a digest wins over the tag.
     Call with (list $image $defaultTag). */}}
{{- define "nvmeof-csi.image" -}}
{{- $img := index . 0 -}}
{{- $tag := default (index . 1) $img.tag -}}
{{- $name := ternary $img.repository (printf "%s/%s" $img.registry $img.repository) (empty $img.registry) -}}
{{- if $img.digest -}}{{ $name }}@{{ $img.digest }}{{- else -}}{{ $name }}:{{ $tag }}{{- end -}}
{{- end -}}

{{/* The sidecars' securityContext: no privilege, no capability, read-only root. */}}
{{- define "nvmeof-csi.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}

{{/* The NVMe/TCP TLS handshake daemon (tlshd, in the driver image) beside a node plugin or an agent: it shares
the host's network namespace (the pod is hostNetwork), takes the kernel's handshake requests (netlink commands
that need CAP_NET_ADMIN: its one capability) and reads the kernel's .nvme keyring as uid 0 (keyctl, which the
runtime's default seccomp profile refuses: unconfined seccomp); the pod shares its process namespace so that
the driver sees it running. The runtime hides /proc/keys from it, so `nvmeof-csi tlshd` links .nvme into its
session keyring first, by the serial the driver's container publishes on the nvme-keyring volume
(nvmeof_csi/host/tlshd_keyring.py), then execs tlshd. The lab runs it with this capability only
(lab/tlshd.py). Argument: the root context. */}}
{{- define "nvmeof-csi.tlshd" -}}
- name: tlshd
  image: {{ include "nvmeof-csi.image" (list .Values.images.driver .Chart.AppVersion) }}
  imagePullPolicy: {{ .Values.imagePullPolicy }}
  command: [nvmeof-csi, tlshd, --serial-file, /run/nvme-keyring/serial, --, /usr/sbin/tlshd, -s, -c, /etc/tlshd.conf]
  securityContext:
    runAsUser: 0
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities: {drop: [ALL], add: [NET_ADMIN]}
    seccompProfile: {type: Unconfined}
  resources:
    {{- toYaml .Values.nvmeTls.resources | nindent 4 }}
  volumeMounts:
    - {name: nvme-keyring, mountPath: /run/nvme-keyring, readOnly: true}
{{- end -}}

{{/* What a driver container beside tlshd adds: its argument, its mount and the pod's volume. */}}
{{- define "nvmeof-csi.tlshdArg" -}}
- --keyring-serial-file=/run/nvme-keyring/serial   # for tlshd, which cannot see /proc/keys
{{- end -}}
{{- define "nvmeof-csi.tlshdMount" -}}
- {name: nvme-keyring, mountPath: /run/nvme-keyring}
{{- end -}}
{{- define "nvmeof-csi.tlshdVolume" -}}
- name: nvme-keyring
  emptyDir: {medium: Memory, sizeLimit: 1Mi}
{{- end -}}

{{/* Pod placement and pull settings of one workload: (list $root $workloadValues). */}}
{{- define "nvmeof-csi.placement" -}}
{{- $root := index . 0 -}}
{{- $w := index . 1 -}}
{{- with $w.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $w.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $w.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The env entry of a metrics host: loopback, or the node's IP when metrics.onNodeIP. */}}
{{- define "nvmeof-csi.metricsHost" -}}
- name: NVMEOF_CSI_METRICS_HOST       # hostNetwork: loopback unless metrics.onNodeIP
{{- if .Values.metrics.onNodeIP }}
  valueFrom: {fieldRef: {fieldPath: status.hostIP}}
{{- else }}
  value: 127.0.0.1
{{- end }}
{{- end -}}

{{/* The liveness (and start-up) probe's path: the livenessprobe sidecar's /healthz (our Probe RPC), or our own
/livez (the process answers; readiness is /healthz) when the sidecar is off. */}}
{{- define "nvmeof-csi.livePath" -}}
{{- if .Values.livenessProbeSidecar }}/healthz{{ else }}/livez{{ end }}
{{- end -}}

{{/* The leader-election flags of a sidecar. */}}
{{- define "nvmeof-csi.leader" -}}
{{- if .Values.controller.leaderElection }}
- --leader-election
- --leader-election-namespace=$(NAMESPACE)
{{- end }}
{{- end -}}
