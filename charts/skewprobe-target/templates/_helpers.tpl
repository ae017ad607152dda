{{- define "skewprobe-target.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "skewprobe-target.fullname" -}}
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

{{/* The probe chart's default discovery selector matches app.kubernetes.io/name. */}}
{{- define "skewprobe-target.selectorLabels" -}}
app.kubernetes.io/name: {{ include "skewprobe-target.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "skewprobe-target.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "skewprobe-target.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: reference-target
app.kubernetes.io/part-of: skewprobe
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "skewprobe-target.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The profile file, checked: the emulated version must be one of its versions. */}}
{{- define "skewprobe-target.profiles" -}}
{{- $versions := .Values.profiles.versions | default dict }}
{{- if not (hasKey $versions .Values.emulatedVersion) }}
{{- fail (printf "emulatedVersion %q is not in profiles.versions (%s)" .Values.emulatedVersion (keys $versions | sortAlpha | join ", ")) }}
{{- end }}
{{- toYaml .Values.profiles }}
{{- end }}

{{/* The relay's allowlist file: the chart's `relay` values under the file's `relay:` key. */}}
{{- define "skewprobe-target.relay" -}}
{{- if not .Values.relay.destinations }}
{{- fail "relay needs destinations (the allowlist); leave relay empty to turn the relay off" }}
{{- end }}
{{- toYaml (dict "relay" .Values.relay) }}
{{- end }}
