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

{{/* The leader-election flags of a sidecar. */}}
{{- define "nvmeof-csi.leader" -}}
{{- if .Values.controller.leaderElection }}
- --leader-election
- --leader-election-namespace=$(NAMESPACE)
{{- end }}
{{- end -}}
