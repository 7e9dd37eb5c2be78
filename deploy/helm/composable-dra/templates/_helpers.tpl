{{/* Names: <release>-composable-dra or the release name when it already says so. */}}
{{- define "cdra.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The name of one component's objects: cdra.name (dict "root" $ "component" "plugin"). */}}
{{- define "cdra.name" -}}
{{- printf "%s-%s" (include "cdra.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Lease API caller flags (remote GPUs): cdra.leaseArgs (dict "root" $ "component" "plugin"). */}}
{{- define "cdra.leaseArgs" -}}
{{- $r := .root.Values.remoteGPU -}}
{{- if eq .component "plugin" }}
- --lease-token-file={{ include "cdra.leaseTokenDir" . }}/token
{{- else }}
- --lease-service-account={{ .root.Release.Namespace }}/{{ include "cdra.name" . }}
{{- end }}
- {{ printf "--donor-api-template=%s" $r.donorApiTemplate | quote }}
{{- range $node, $url := $r.donorApis }}
- {{ printf "--donor-api=%s=%s" $node $url | quote }}
{{- end }}
{{- with include "cdra.donorCAFile" .root }}
- --donor-ca-file={{ . }}
{{- end }}
{{- end -}}

{{/* The donors' CA bundle inside the plugin and scaler containers: the mounted
     remoteGPU.donorCA (a Secret's or a ConfigMap's key), else remoteGPU.donorCAFile. */}}
{{- define "cdra.donorCAFile" -}}
{{- $r := .Values.remoteGPU -}}
{{- if and $r.donorCA.secret $r.donorCA.configMap -}}
{{- fail "remoteGPU.donorCA: set secret or configMap, not both" -}}
{{- end -}}
{{- if or $r.donorCA.secret $r.donorCA.configMap -}}
{{- if $r.donorCAFile -}}
{{- fail "remoteGPU.donorCA mounts the CA bundle: leave remoteGPU.donorCAFile empty" -}}
{{- end -}}
{{- printf "/var/run/composable-dra/donor-ca/%s" $r.donorCA.key -}}
{{- else -}}
{{- $r.donorCAFile -}}
{{- end -}}
{{- end -}}

{{/* The volume (cdra.donorCAVolume) and mount (cdra.donorCAMount) of remoteGPU.donorCA,
     when remote GPUs are on and it names a Secret or a ConfigMap; empty otherwise. */}}
{{- define "cdra.donorCAVolume" -}}
{{- $ca := .Values.remoteGPU.donorCA -}}
{{- if and .Values.remoteGPU.enabled $ca.secret }}
- name: donor-ca
  secret: {secretName: {{ $ca.secret }}, items: [{key: {{ $ca.key }}, path: {{ $ca.key }}}]}
{{- else if and .Values.remoteGPU.enabled $ca.configMap }}
- name: donor-ca
  configMap: {name: {{ $ca.configMap }}, items: [{key: {{ $ca.key }}, path: {{ $ca.key }}}]}
{{- end }}
{{- end -}}

{{- define "cdra.donorCAMount" -}}
{{- $ca := .Values.remoteGPU.donorCA -}}
{{- if and .Values.remoteGPU.enabled (or $ca.secret $ca.configMap) }}
- {name: donor-ca, mountPath: /var/run/composable-dra/donor-ca, readOnly: true}
{{- end }}
{{- end -}}

{{/* Where the plugin's projected lease token is mounted (remote GPUs). */}}
{{- define "cdra.leaseTokenDir" -}}
/var/run/secrets/composable-dra/lease
{{- end -}}

{{- define "cdra.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: composable-dra
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "cdra.selectorLabels" . }}
{{- end -}}

{{- define "cdra.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "cdra.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The service account's user name, as RBAC and admission see it. */}}
{{- define "cdra.saUser" -}}
{{- printf "system:serviceaccount:%s:%s" .root.Release.Namespace (include "cdra.name" .) -}}
{{- end -}}

{{/* The emulator's Service: its fixed address where emulator.clusterIP sets one, else its DNS name. */}}
{{- define "cdra.emulatorURL" -}}
{{- $e := .Values.emulator -}}
{{- if $e.clusterIP -}}
{{- if contains ":" $e.clusterIP -}}
{{- printf "http://[%s]:%d" $e.clusterIP (int $e.port) -}}
{{- else -}}
{{- printf "http://%s:%d" $e.clusterIP (int $e.port) -}}
{{- end -}}
{{- else -}}
{{- printf "http://%s.%s.svc:%d" (include "cdra.name" (dict "root" . "component" "fabric-emulator")) .Release.Namespace (int $e.port) -}}
{{- end -}}
{{- end -}}

{{/* The fabric manager's URL: explicit, else the emulator's when it is installed. */}}
{{- define "cdra.fabricEndpoint" -}}
{{- if .endpoint -}}
{{- .endpoint -}}
{{- else if .root.Values.emulator.enabled -}}
{{- include "cdra.emulatorURL" .root -}}
{{- end -}}
{{- end -}}

{{- define "cdra.credentialsSecret" -}}
{{- if .Values.fabric.credentials.existingSecret -}}
{{- .Values.fabric.credentials.existingSecret -}}
{{- else if .Values.fabric.credentials.create -}}
{{- include "cdra.name" (dict "root" . "component" "fabric-credentials") -}}
{{- end -}}
{{- end -}}

{{- define "cdra.credentialsNamespaces" -}}
{{- $ns := .Values.credentialsNamespaces -}}
{{- if not $ns -}}{{- $ns = list .Release.Namespace -}}{{- end -}}
{{- toJson (uniq $ns) -}}
{{- end -}}

{{/* Flags every component takes. */}}
{{- define "cdra.globalArgs" -}}
- --log-level={{ .Values.logging.level }}
- --log-format={{ .Values.logging.format }}
{{- end -}}

{{/* Environment every component gets. */}}
{{- define "cdra.podEnv" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
{{- end -}}

{{- define "cdra.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}
