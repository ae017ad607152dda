{{/*
The probe's pod, the same under a Deployment (shards: 1) and a StatefulSet (shards > 1).
Sharded, each pod passes `--shard $(POD_NAME)/N`: `skewprobe run` takes a StatefulSet pod's
ordinal (the number after its name's last `-`) as its shard, and its store comes from the
StatefulSet's volumeClaimTemplates (one store per shard) instead of the release's PVC.
*/}}
{{- define "skewprobe.podTemplate" -}}
{{- $inCluster := include "skewprobe.inCluster" . }}
{{- $sharded := include "skewprobe.sharded" . -}}
metadata:
  labels:
    {{- include "skewprobe.labels" . | nindent 4 }}
    {{- if .Values.outsideMesh }}
    sidecar.istio.io/inject: "false"
    istio.io/dataplane-mode: none
    {{- end }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include "skewprobe.config" . | sha256sum }}
    {{- if .Values.outsideMesh }}
    sidecar.istio.io/inject: "false"
    linkerd.io/inject: disabled
    {{- end }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "skewprobe.serviceAccountName" . }}
  automountServiceAccountToken: {{ eq $inCluster "true" }}
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  containers:
    - name: probe
      image: {{ include "skewprobe.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - run
        - --config
        - /etc/skewprobe/probe.yaml
        {{- with .Values.api.token.existingSecret }}
        - --token-file
        - {{ printf "%s/%s" (include "skewprobe.tokenDir" $) $.Values.api.token.key | quote }}
        {{- end }}
        {{- if .Values.api.tls.existingSecret }}
        - --api-cert
        - {{ include "skewprobe.tlsDir" . }}/tls.crt
        - --api-key
        - {{ include "skewprobe.tlsDir" . }}/tls.key
        {{- if .Values.api.tls.clientCA }}
        - --api-client-ca
        - {{ include "skewprobe.tlsDir" . }}/ca.crt
        {{- end }}
        {{- end }}
        {{- if $sharded }}
        - --shard
        - {{ printf "$(POD_NAME)/%d" (int .Values.shards) | quote }}
        {{- end }}
        {{- range .Values.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      ports:
        - name: http
          containerPort: {{ .Values.api.port }}
          protocol: TCP
      env:
        - name: HOME
          value: /tmp
        {{- if $sharded }}
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      livenessProbe:
        {{- include "skewprobe.healthProbe" (dict "probe" .Values.livenessProbe "root" $) | nindent 8 }}
      readinessProbe:
        {{- include "skewprobe.healthProbe" (dict "probe" .Values.readinessProbe "root" $) | nindent 8 }}
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: config
          mountPath: /etc/skewprobe
          readOnly: true
        # The root filesystem is read-only: the store (SQLite + WAL) and /tmp are the
        # only writable places.
        - name: store
          mountPath: {{ .Values.store.mountPath }}
        - name: tmp
          mountPath: /tmp
        {{- if .Values.api.token.existingSecret }}
        - name: api-token
          mountPath: {{ include "skewprobe.tokenDir" . }}
          readOnly: true
        {{- end }}
        {{- if .Values.api.tls.existingSecret }}
        - name: api-tls
          mountPath: {{ include "skewprobe.tlsDir" . }}
          readOnly: true
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "skewprobe.fullname" . }}
    {{- if not (and $sharded .Values.persistence.enabled) }}
    - name: store
      {{- if .Values.persistence.enabled }}
      persistentVolumeClaim:
        claimName: {{ .Values.persistence.existingClaim | default (include "skewprobe.fullname" .) }}
      {{- else }}
      emptyDir:
        {{- toYaml .Values.store.emptyDir | nindent 8 }}
      {{- end }}
    {{- end }}
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
    {{- /* Secret files readable by the pod's fsGroup only (0440), else by all (0444). */}}
    {{- $mode := ternary 288 292 (not (empty .Values.podSecurityContext.fsGroup)) }}
    {{- with .Values.api.token.existingSecret }}
    - name: api-token
      secret:
        secretName: {{ . }}
        defaultMode: {{ $mode }}
        items:
          - key: {{ $.Values.api.token.key }}
            path: {{ $.Values.api.token.key }}
    {{- end }}
    {{- with .Values.api.tls.existingSecret }}
    - name: api-tls
      secret:
        secretName: {{ . }}
        defaultMode: {{ $mode }}
        items:
          - {key: tls.crt, path: tls.crt}
          - {key: tls.key, path: tls.key}
          {{- if $.Values.api.tls.clientCA }}
          - {key: ca.crt, path: ca.crt}
          {{- end }}
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
