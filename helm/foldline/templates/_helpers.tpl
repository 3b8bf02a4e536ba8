{{/* Chart name, truncated to the 63 characters Kubernetes names allow. */}}
{{- define "foldline.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped base name of every object. */}}
{{- define "foldline.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "foldline.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "foldline.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: foldline
{{- end }}

{{/* Selector labels of one component: include "foldline.selectorLabels" (list $ "projector") */}}
{{- define "foldline.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "foldline.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "foldline.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "foldline.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "foldline.secretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else }}
{{- include "foldline.fullname" . }}
{{- end }}
{{- end }}

{{- define "foldline.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The worker's command-line arguments after `foldline` (the backend and stores come from the ConfigMap). */}}
{{- define "foldline.args" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $c := index $root.Values $name -}}
- {{ $name }}
- --metrics-port
- {{ $root.Values.metrics.port | quote }}
- --metrics-host
- "0.0.0.0"
{{- if eq $name "projector" }}
{{- with $c.group }}
- --group
- {{ . | quote }}
{{- end }}
- --max-batch
- {{ $c.maxBatch | quote }}
{{- end }}
{{- if eq $name "archiver" }}
{{- with $c.group }}
- --group
- {{ . | quote }}
{{- end }}
- --concurrency
- {{ $c.concurrency | quote }}
{{- end }}
{{- if eq $name "dispatcher" }}
- --concurrency
- {{ $c.concurrency | quote }}
- --fold-timeout
- {{ $c.foldTimeoutSeconds | quote }}
{{- with $c.anthropicUrl }}
- --anthropic-url
- {{ . | quote }}
{{- end }}
{{- with $c.openaiUrl }}
- --openai-url
- {{ . | quote }}
{{- end }}
{{- end }}
{{- range $c.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* Where the Kafka client-properties file is mounted (config.kafkaClientProperties). */}}
{{- define "foldline.kafkaPropertiesPath" -}}
/etc/foldline/kafka/client.properties
{{- end }}
