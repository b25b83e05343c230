{{/* Names, labels and the pieces every workload shares. */}}

{{- define "tandem.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tandem.labels" -}}
{{ include "tandem.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: include with (dict "root" $ "component" "router"). */}}
{{- define "tandem.componentSelector" -}}
{{ include "tandem.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tandem.componentLabels" -}}
{{ include "tandem.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tandem.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tandem.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "tandem.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "tandem.tlsSecretName" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "tandem.fullname" .)) -}}
{{- end -}}

{{/* HOST:PORT of Redis, empty when the registry is off. */}}
{{- define "tandem.redisAddress" -}}
{{- if eq .Values.redis.mode "internal" -}}
{{ include "tandem.fullname" . }}-redis:6379
{{- else if eq .Values.redis.mode "external" -}}
{{ required "redis.externalAddress is required when redis.mode is external" .Values.redis.externalAddress }}
{{- end -}}
{{- end -}}

{{/* Server TLS flags (every service). */}}
{{- define "tandem.serverTlsArgs" -}}
{{- if .Values.tls.enabled }}
- --tls-cert=/etc/tandem/tls/tls.crt
- --tls-key=/etc/tandem/tls/tls.key
{{- if .Values.tls.mutual }}
- --tls-client-ca=/etc/tandem/tls/ca.crt
{{- end }}
{{- end }}
{{- end -}}

{{/* Client TLS flags (router and verifier dial other services). */}}
{{- define "tandem.clientTlsArgs" -}}
{{- if .Values.tls.enabled }}
- --client-tls-ca=/etc/tandem/tls/ca.crt
{{- if .Values.tls.mutual }}
- --client-tls-cert=/etc/tandem/tls/tls.crt
- --client-tls-key=/etc/tandem/tls/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{/* Whether the services authenticate to Redis (values.yaml, redis.auth). */}}
{{- define "tandem.redisAuth" -}}
{{- $a := .Values.redis.auth -}}
{{- if or (and (eq .Values.redis.mode "internal") $a.enabled) (and (eq .Values.redis.mode "external") $a.existingSecret) -}}
true
{{- end -}}
{{- end -}}

{{- define "tandem.redisAuthSecretName" -}}
{{- .Values.redis.auth.existingSecret | default (printf "%s-redis-auth" (include "tandem.fullname" .)) -}}
{{- end -}}

{{/* Redis AUTH flags (every service that talks to Redis). */}}
{{- define "tandem.redisAuthArgs" -}}
{{- if include "tandem.redisAuth" . }}
- --redis-password-file=/etc/tandem/redis-auth/{{ .Values.redis.auth.secretKey }}
{{- with .Values.redis.auth.user }}
- --redis-user={{ . }}
{{- end }}
{{- end }}
{{- include "tandem.redisTlsArgs" . }}
{{- end -}}

{{/* Redis TLS flags (values.yaml, redis.tls): the chart's TLS Secret, mounted at /etc/tandem/tls. */}}
{{- define "tandem.redisTlsArgs" -}}
{{- if .Values.redis.tls.enabled }}
{{- if not .Values.tls.enabled }}
{{- fail "redis.tls.enabled uses the chart's TLS Secret: set tls.enabled (and its certificate) too" }}
{{- end }}
- --redis-tls-ca=/etc/tandem/tls/ca.crt
{{- if .Values.tls.mutual }}
- --redis-tls-cert=/etc/tandem/tls/tls.crt
- --redis-tls-key=/etc/tandem/tls/tls.key
{{- end }}
{{- with .Values.redis.tls.serverName }}
- --redis-tls-server-name={{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "tandem.redisAuthVolume" -}}
{{- if include "tandem.redisAuth" . }}
- name: redis-auth
  secret:
    secretName: {{ include "tandem.redisAuthSecretName" . }}
{{- end }}
{{- end -}}

{{- define "tandem.redisAuthMount" -}}
{{- if include "tandem.redisAuth" . }}
- name: redis-auth
  mountPath: /etc/tandem/redis-auth
  readOnly: true
{{- end }}
{{- end -}}

{{/* Registry flags of a worker: include with (dict "root" $ "port" N). */}}
{{- define "tandem.registryArgs" -}}
{{- $redis := include "tandem.redisAddress" .root -}}
{{- if $redis }}
- --redis={{ $redis }}
- --advertise=$(POD_IP):{{ .port }}
{{- include "tandem.redisAuthArgs" .root }}
{{- end }}
{{- end -}}

{{- define "tandem.podIpEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end -}}

{{/*
Probes on grpc.health.v1. The kubelet's gRPC probe speaks plaintext only, so with TLS the
probes fall back to a TCP connect. Include with (dict "port" N "startup" .startupProbe "tls" bool).
*/}}
{{- define "tandem.probes" -}}
{{- $check := ternary (dict "tcpSocket" (dict "port" .port)) (dict "grpc" (dict "port" .port)) .tls -}}
startupProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: {{ .startup.periodSeconds }}
  failureThreshold: {{ .startup.failureThreshold }}
readinessProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: 5
  failureThreshold: 2
livenessProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
{{- end -}}

{{- define "tandem.clusterTokenSecretName" -}}
{{- .Values.clusterToken.existingSecret | default (printf "%s-cluster-token" (include "tandem.fullname" .)) -}}
{{- end -}}

{{/* The cluster token flag (every service). */}}
{{- define "tandem.clusterTokenArgs" -}}
{{- if .Values.clusterToken.enabled }}
- --cluster-token-file=/etc/tandem/cluster-token/token
{{- end }}
{{- end -}}

{{- define "tandem.clusterTokenVolume" -}}
{{- if .Values.clusterToken.enabled }}
- name: cluster-token
  secret:
    secretName: {{ include "tandem.clusterTokenSecretName" . }}
{{- end }}
{{- end -}}

{{- define "tandem.clusterTokenMount" -}}
{{- if .Values.clusterToken.enabled }}
- name: cluster-token
  mountPath: /etc/tandem/cluster-token
  readOnly: true
{{- end }}
{{- end -}}

{{- define "tandem.tlsVolume" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "tandem.tlsSecretName" . }}
{{- end }}
{{- end -}}

{{/* The TLS Secret for the in-chart Redis (redis.tls), which the tls section alone does not mount. */}}
{{- define "tandem.redisTlsVolume" -}}
{{- if .Values.redis.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "tandem.tlsSecretName" . }}
{{- end }}
{{- end -}}

{{- define "tandem.redisTlsMount" -}}
{{- if .Values.redis.tls.enabled }}
- name: tls
  mountPath: /etc/tandem/tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "tandem.tlsMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/tandem/tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "tandem.modelVolume" -}}
{{- if eq .Values.model.source "pvc" }}
- name: models
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.existingClaim is required when model.source is pvc" .Values.model.pvc.existingClaim }}
    readOnly: true
{{- else if eq .Values.model.source "hostPath" }}
- name: models
  hostPath:
    path: {{ .Values.model.hostPath.path }}
    type: {{ .Values.model.hostPath.type }}
{{- end }}
{{- end -}}

{{- define "tandem.modelMount" -}}
{{- if ne .Values.model.source "image" }}
- name: models
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
  {{- if and (eq .Values.model.source "pvc") .Values.model.pvc.subPath }}
  subPath: {{ .Values.model.pvc.subPath }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* Resources with the accelerator request: include with (dict "root" $ "c" .Values.verifier). */}}
{{- define "tandem.gpuResources" -}}
{{- $res := deepCopy .c.resources -}}
{{- if gt (int .c.gpus) 0 -}}
{{- $limits := get $res "limits" | default dict -}}
{{- $_ := set $limits .root.Values.gpu.resourceName (int .c.gpus) -}}
{{- $_ := set $res "limits" $limits -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}

{{- define "tandem.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
serviceAccountName: {{ include "tandem.serviceAccountName" . }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
