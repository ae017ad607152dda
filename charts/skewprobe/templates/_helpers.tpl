{{/* Names: the chart's name, and the release-qualified name every object carries. */}}
{{- define "skewprobe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "skewprobe.fullname" -}}
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

{{- define "skewprobe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "skewprobe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "skewprobe.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "skewprobe.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: probe
app.kubernetes.io/part-of: skewprobe
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "skewprobe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "skewprobe.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "skewprobe.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The API's scheme: https when it is served with TLS (api.tls). */}}
{{- define "skewprobe.apiScheme" -}}
{{- if .Values.api.tls.existingSecret }}https{{ else }}http{{ end }}
{{- end }}

{{/* The API's in-cluster base URL, for the gates (Argo Rollouts, Flagger). */}}
{{- define "skewprobe.apiURL" -}}
{{- printf "%s://%s.%s.svc:%d" (include "skewprobe.apiScheme" .) (include "skewprobe.fullname" .) .Release.Namespace (int .Values.api.port) }}
{{- end }}

{{/* Where the API's Secrets are mounted (read-only) in the probe's container. */}}
{{- define "skewprobe.tokenDir" -}}/var/run/skewprobe/api-token{{- end }}
{{- define "skewprobe.tlsDir" -}}/var/run/skewprobe/api-tls{{- end }}

{{/*
A liveness/readiness probe as the API is served: an httpGet over HTTPS when the API has
TLS (the kubelet does not verify the certificate), and a TCP check under mTLS, since the
kubelet cannot present a client certificate. /healthz needs no token.
Call with (dict "probe" .Values.livenessProbe "root" $).
*/}}
{{- define "skewprobe.healthProbe" -}}
{{- $probe := deepCopy .probe }}
{{- $tls := .root.Values.api.tls }}
{{- if and $probe.httpGet $tls.existingSecret }}
{{- if $tls.clientCA }}
{{- $_ := set $probe "tcpSocket" (dict "port" $probe.httpGet.port) }}
{{- $_ := unset $probe "httpGet" }}
{{- else if not $probe.httpGet.scheme }}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- end }}
{{- toYaml $probe }}
{{- end }}

{{/*
The probe's config as rendered into the ConfigMap: the user's `config` plus the two keys the
chart owns (listen address and store path). Giving those in `config` is an error rather than
being silently overridden.
*/}}
{{- define "skewprobe.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- if hasKey $cfg "listen" }}
{{- fail "config.listen is set by the chart (0.0.0.0:<api.port>): remove it and set api.port" }}
{{- end }}
{{- if hasKey $cfg "store" }}
{{- fail "config.store is set by the chart (<store.mountPath>/skewprobe.db): remove it and set store.mountPath / persistence" }}
{{- end }}
{{- $_ := set $cfg "listen" (printf "0.0.0.0:%d" (int .Values.api.port)) }}
{{- $_ := set $cfg "store" (dict "path" (printf "%s/skewprobe.db" (trimSuffix "/" .Values.store.mountPath))) }}
{{- if include "skewprobe.sharded" . }}
{{- /* Each shard's store holds only its endpoints: every shard judges the merged verdict
from all shards' series in Prometheus (README, "Many probes"), so /verdict, /gate and the
verdict gauge say the same on any shard. */}}
{{- if eq (toString (get $cfg "source" | default "prometheus")) "store" }}
{{- fail (printf "shards: %d: each shard's store holds only its own endpoints, so config.source must be prometheus (the chart sets it; remove source: store)" (int .Values.shards)) }}
{{- end }}
{{- $prom := deepCopy (get $cfg "prometheus" | default dict) }}
{{- if not $prom.selector }}
{{- if not .Values.serviceMonitor.enabled }}
{{- fail (printf "shards: %d: the shards judge from Prometheus: set serviceMonitor.enabled=true, or config.prometheus.selector naming the series your own scrape gives them" (int .Values.shards)) }}
{{- end }}
{{- /* The ServiceMonitor's job label is the Service's name; namespace is the release's. */}}
{{- $_ := set $prom "selector" (printf "job=%q, namespace=%q" (include "skewprobe.fullname" .) .Release.Namespace) }}
{{- end }}
{{- $_ := set $prom "url" ($prom.url | default .Values.sharding.prometheusUrl) }}
{{- /* A window is one query step: at least the scrape interval. */}}
{{- $_ := set $prom "step" ($prom.step | default .Values.serviceMonitor.interval) }}
{{- $_ := set $cfg "source" "prometheus" }}
{{- $_ := set $cfg "prometheus" $prom }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* "true" when the release runs more than one probe (`shards` > 1): a StatefulSet. */}}
{{- define "skewprobe.sharded" -}}
{{- if gt (int .Values.shards) 1 }}true{{ end }}
{{- end }}

{{/* The kubernetes discovery block of the config, or an empty dict. */}}
{{- define "skewprobe.kubernetes" -}}
{{- $targets := .Values.config.targets | default dict }}
{{- toYaml ($targets.kubernetes | default dict) }}
{{- end }}

{{/* Where the mesh's control plane runs (the probe's own default, probes/spec.py). */}}
{{- define "skewprobe.meshNamespace" -}}
{{- $k := include "skewprobe.kubernetes" . | fromYaml }}
{{- if $k.mesh_namespace }}
{{- $k.mesh_namespace }}
{{- else if eq ($k.mesh | default "") "linkerd" }}
{{- "linkerd" }}
{{- else }}
{{- "istio-system" }}
{{- end }}
{{- end }}

{{/* "true" when the probe reads the Kubernetes API with the pod's service account. */}}
{{- define "skewprobe.inCluster" -}}
{{- $k := include "skewprobe.kubernetes" . | fromYaml }}
{{- if and $k (not $k.kubeconfig) (ne (toString $k.in_cluster) "false") }}true{{ end }}
{{- end }}
