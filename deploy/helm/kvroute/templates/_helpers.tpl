{{- define "kvroute.fullname" -}}
{{- printf "%s-kvroute" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvroute.labels" -}}
app.kubernetes.io/name: kvroute
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvroute.selector" -}}
app.kubernetes.io/name: kvroute
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

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

{{- define "kvroute.modelVolume" -}}
{{- if .Values.model.volume }}
volumes:
  - name: models
    {{- toYaml .Values.model.volume | nindent 4 }}
{{- end }}
{{- end -}}

{{- define "kvroute.modelMount" -}}
{{- if .Values.model.volume }}
volumeMounts:
  - name: models
    mountPath: {{ dir .Values.model.path | default "/models" }}
    readOnly: true
{{- end }}
{{- end -}}
