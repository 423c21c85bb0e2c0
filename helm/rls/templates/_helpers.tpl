{{/* Chart name, overridable. */}}
{{- define "rls.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified name: <release>-<chart> unless the release already contains it. */}}
{{- define "rls.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rls.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rls.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rls.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rls.labels" -}}
helm.sh/chart: {{ include "rls.chart" . }}
{{ include "rls.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "rls.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Secret holding the Redis URL: the user's, or the chart's when redis.url is set. */}}
{{- define "rls.redisSecret" -}}
{{- default (include "rls.fullname" .) .Values.redis.existingSecret -}}
{{- end -}}

{{- define "rls.adminTokenSecret" -}}
{{- default (include "rls.fullname" .) .Values.adminToken.existingSecret -}}
{{- end -}}

{{/* More than one pod at a time: a PodDisruptionBudget makes sense. */}}
{{- define "rls.multiPod" -}}
{{- if or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) -}}true{{- end -}}
{{- end -}}
