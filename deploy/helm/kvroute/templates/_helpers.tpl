{{- define "kvroute.fullname" -}}
{{- printf "%s-kvroute" .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; (dict "root" . "component" NAME). */}}
{{- define "kvroute.labels" -}}
{{ include "kvroute.selector" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "kvroute.selector" -}}
app.kubernetes.io/name: kvroute
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kvroute.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "kvroute.routerOn" -}}
{{- if ne .Values.topology "render-only" }}true{{ end -}}
{{- end -}}

{{- define "kvroute.renderOn" -}}
{{- if or (eq .Values.topology "render-only") .Values.render.enabled }}true{{ end -}}
{{- end -}}

{{/* The chart's engines run here (pods: create; headless: always). */}}
{{- define "kvroute.enginesOwned" -}}
{{- if or (eq .Values.topology "headless") (and (eq .Values.topology "pods") .Values.pods.create) }}true{{ end -}}
{{- end -}}

{{/* The engine pods, as a LabelSelector (matchLabels / matchExpressions). */}}
{{- define "kvroute.engineSelector" -}}
{{- if or (eq .Values.topology "headless") .Values.pods.create -}}
matchLabels:
  {{- include "kvroute.selector" (dict "root" . "component" "engine") | nindent 2 }}
{{- else -}}
{{- with .Values.pods.selector.matchLabels }}
matchLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.pods.selector.matchExpressions }}
matchExpressions:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The same selector in the API server's string grammar, for [discovery] selector. */}}
{{- define "kvroute.engineSelectorString" -}}
{{- $sel := include "kvroute.engineSelector" . | fromYaml -}}
{{- $parts := list -}}
{{- range $k, $v := $sel.matchLabels -}}
{{- $parts = append $parts (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- range $sel.matchExpressions -}}
{{- $op := .operator -}}
{{- if eq $op "In" -}}
{{- $parts = append $parts (printf "%s in (%s)" .key (join "," .values)) -}}
{{- else if eq $op "NotIn" -}}
{{- $parts = append $parts (printf "%s notin (%s)" .key (join "," .values)) -}}
{{- else if eq $op "Exists" -}}
{{- $parts = append $parts .key -}}
{{- else -}}
{{- $parts = append $parts (printf "!%s" .key) -}}
{{- end -}}
{{- end -}}
{{- if not $parts -}}
{{- fail "pods.selector: give matchLabels or matchExpressions selecting your vllm serve pods" -}}
{{- end -}}
{{- join "," $parts -}}
{{- end -}}

{{- define "kvroute.enginesNamespace" -}}
{{- if and (eq .Values.topology "pods") (not .Values.pods.create) -}}
{{ .Values.pods.namespace | default .Release.Namespace }}
{{- else -}}
{{ .Release.Namespace }}
{{- end -}}
{{- end -}}

{{/* --model (a directory or a Hub id) and the served name, for router and render. */}}
{{- define "kvroute.modelArgs" -}}
{{- if .Values.model.path }}
- --model
- {{ .Values.model.path | quote }}
{{- end }}
- --served-model-name
- {{ .Values.model.servedModelName | quote }}
- --max-model-len
- {{ .Values.model.maxModelLen | int | quote }}
{{- end -}}

{{/* Hugging Face: offline unless the model is a Hub id; the token from its Secret. */}}
{{- define "kvroute.hfEnv" -}}
{{- if not (regexMatch "^[^/.][^/]*/[^/]+$" .Values.model.path) }}
- {name: HF_HUB_OFFLINE, value: "1"}
{{- end }}
{{- with .Values.model.hfToken }}{{ if .secretName }}
- name: HF_TOKEN
  valueFrom: {secretKeyRef: {name: {{ .secretName }}, key: {{ .key }}}}
{{- end }}{{ end }}
{{- end -}}

{{/* The keys a router reads: name -> its file flag and its variable. */}}
{{- define "kvroute.keyKinds" -}}
api: {flag: --api-key-file, env: KVROUTE_API_KEY}
admin: {flag: --admin-key-file, env: KVROUTE_ADMIN_KEY}
engine: {flag: --engine-api-key-file, env: KVROUTE_ENGINE_API_KEY}
{{- end -}}

{{- define "kvroute.routerKeys" -}}
{{- $keys := dict -}}
{{- range $name, $kind := include "kvroute.keyKinds" . | fromYaml -}}
{{- $key := get $.Values.keys $name -}}
{{- if and $key.secretName (or (ne $name "engine") (eq $.Values.topology "pods")) -}}
{{- $_ := set $keys $name (merge (dict "secretName" $key.secretName "key" $key.key "as" $key.as) $kind) -}}
{{- end -}}
{{- end -}}
{{- toYaml $keys -}}
{{- end -}}

{{- define "kvroute.keyArgs" -}}
{{- range $name, $k := include "kvroute.routerKeys" . | fromYaml }}
{{- if eq $k.as "file" }}
- {{ $k.flag }}
- /run/secrets/kvroute/{{ $name }}/{{ $k.key }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "kvroute.keyEnv" -}}
{{- range $name, $k := include "kvroute.routerKeys" . | fromYaml }}
{{- if eq $k.as "env" }}
- name: {{ $k.env }}
  valueFrom: {secretKeyRef: {name: {{ $k.secretName }}, key: {{ $k.key }}}}
{{- end }}
{{- end }}
{{- end -}}

{{- define "kvroute.keyMounts" -}}
{{- range $name, $k := include "kvroute.routerKeys" . | fromYaml }}
{{- if eq $k.as "file" }}
- {name: key-{{ $name }}, mountPath: /run/secrets/kvroute/{{ $name }}, readOnly: true}
{{- end }}
{{- end }}
{{- end -}}

{{- define "kvroute.keyVolumes" -}}
{{- range $name, $k := include "kvroute.routerKeys" . | fromYaml }}
{{- if eq $k.as "file" }}
- name: key-{{ $name }}
  secret:
    secretName: {{ $k.secretName }}
    items: [{key: {{ $k.key }}, path: {{ $k.key }}}]
    defaultMode: 0440
{{- end }}
{{- end }}
{{- end -}}

{{/* Writable directories of a kvroute container on a read-only root filesystem. */}}
{{- define "kvroute.scratchMounts" -}}
- {name: tmp, mountPath: /tmp}
- {name: state, mountPath: /var/lib/kvroute}
- {name: cache, mountPath: /var/cache/kvroute}
{{- if .Values.model.volume }}
- {name: models, mountPath: {{ .Values.model.mountPath }}, readOnly: true}
{{- end }}
{{- end -}}

{{- define "kvroute.scratchVolumes" -}}
- {name: tmp, emptyDir: {}}
- {name: state, emptyDir: {}}
- {name: cache, emptyDir: {}}
{{- if .Values.model.volume }}
- name: models
  {{- toYaml .Values.model.volume | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A router pod's grace: preStop, the drain, the cut streams' last writes, a margin. */}}
{{- define "kvroute.routerGrace" -}}
{{- add .Values.router.preStopSeconds .Values.router.drainSeconds 10 -}}
{{- end -}}

{{/* The router's probes and hooks (the same in both topologies). */}}
{{- define "kvroute.routerProbes" -}}
startupProbe:
  httpGet: {path: /health, port: http}
  periodSeconds: 2
  failureThreshold: 150
livenessProbe:
  # The process answers; engines being down is not the router's fault.
  httpGet: {path: /health, port: http}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  # 503 while no engine is ready and from the moment a drain starts.
  httpGet: {path: /ready, port: http}
  periodSeconds: 2
  failureThreshold: 1
lifecycle:
  # The endpoints controllers drop the pod while it still serves; then SIGTERM starts the drain.
  preStop: {sleep: {seconds: {{ .Values.router.preStopSeconds }}}}
{{- end -}}

{{- define "kvroute.podScheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* router.toml's tables common to every router. */}}
{{- define "kvroute.routerCommon" -}}
[policy]
name = {{ .Values.router.policy | quote }}

[limits]
max_in_flight_per_engine = {{ .Values.router.maxInflightPerEngine | int }}
max_queue = {{ .Values.router.maxQueue | int }}
drain_timeout = {{ .Values.router.drainSeconds | int }}

[control]
max_engines = {{ .Values.router.maxEngines | int }}
{{- end -}}
