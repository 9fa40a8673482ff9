{{/*
Shared naming and labelling for both components. Every object carries
app.kubernetes.io/component so that each component's selectors, checksums and policies only
ever match its own pods.
*/}}

{{- define "gorge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gorge.fullname" -}}
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

{{/* Object names; the suffixes leave room within the 63-character DNS label limit. */}}
{{- define "gorge.notification.fullname" -}}
{{- printf "%s-notification" (include "gorge.fullname" . | trunc 50 | trimSuffix "-") -}}
{{- end -}}
{{- define "gorge.notification.clientServiceName" -}}
{{- printf "%s-client" (include "gorge.notification.fullname" .) -}}
{{- end -}}
{{- define "gorge.notification.adminServiceName" -}}
{{- printf "%s-admin" (include "gorge.notification.fullname" .) -}}
{{- end -}}
{{- define "gorge.notification.peersServiceName" -}}
{{- printf "%s-peers" (include "gorge.notification.fullname" .) -}}
{{- end -}}
{{- define "gorge.webhook.fullname" -}}
{{- printf "%s-webhook" (include "gorge.fullname" . | trunc 52 | trimSuffix "-") -}}
{{- end -}}

{{- define "gorge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels common to every object of the release (no component). */}}
{{- define "gorge.releaseLabels" -}}
app.kubernetes.io/name: {{ include "gorge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gorge.labels" -}}
helm.sh/chart: {{ include "gorge.chart" . }}
{{ include "gorge.releaseLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gorge
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gorge.notification.selectorLabels" -}}
{{ include "gorge.releaseLabels" . }}
app.kubernetes.io/component: notification
{{- end -}}

{{- define "gorge.notification.labels" -}}
{{ include "gorge.labels" . }}
app.kubernetes.io/component: notification
app.kubernetes.io/version: {{ include "gorge.notification.tag" . | trunc 63 | quote }}
{{- end -}}

{{- define "gorge.webhook.selectorLabels" -}}
{{ include "gorge.releaseLabels" . }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "gorge.webhook.labels" -}}
{{ include "gorge.labels" . }}
app.kubernetes.io/component: webhook
app.kubernetes.io/version: {{ include "gorge.webhook.tag" . | trunc 63 | quote }}
{{- end -}}

{{/* Image tags default to the chart's appVersion; each component may pin its own. */}}
{{- define "gorge.notification.tag" -}}
{{- .Values.notification.image.tag | default .Chart.AppVersion -}}
{{- end -}}
{{- define "gorge.webhook.tag" -}}
{{- .Values.webhook.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{- define "gorge.notification.image" -}}
{{- printf "%s:%s" .Values.notification.image.repository (include "gorge.notification.tag" .) -}}
{{- end -}}
{{- define "gorge.webhook.image" -}}
{{- printf "%s:%s" .Values.webhook.image.repository (include "gorge.webhook.tag" .) -}}
{{- end -}}

{{- define "gorge.notification.serviceAccountName" -}}
{{- if .Values.notification.serviceAccount.create -}}
{{- default (include "gorge.notification.fullname" .) .Values.notification.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.notification.serviceAccount.name -}}
{{- end -}}
{{- end -}}
{{- define "gorge.webhook.serviceAccountName" -}}
{{- if .Values.webhook.serviceAccount.create -}}
{{- default (include "gorge.webhook.fullname" .) .Values.webhook.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.webhook.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Peer discovery name: resolves to every notification pod, ready or not, so that a pod that is
starting up already receives relayed messages.
*/}}
{{- define "gorge.notification.peerDns" -}}
{{- printf "%s.%s.svc.%s:%d" (include "gorge.notification.peersServiceName" .) .Release.Namespace .Values.clusterDomain (int .Values.notification.adminPort) -}}
{{- end -}}

{{/* The drain window plus the service's 5 s hard-deadline margin plus slack for SIGKILL. */}}
{{- define "gorge.notification.terminationGracePeriodSeconds" -}}
{{- if .Values.notification.terminationGracePeriodSeconds -}}
{{- .Values.notification.terminationGracePeriodSeconds -}}
{{- else -}}
{{- add (int .Values.notification.drainSeconds) 15 -}}
{{- end -}}
{{- end -}}

{{- define "gorge.webhook.url" -}}
{{- printf "http://%s.%s.svc:%d" (include "gorge.webhook.fullname" .) .Release.Namespace (int .Values.webhook.port) -}}
{{- end -}}

{{/*
ConfigMap data of each component. The Deployments hash exactly this (not the whole
ConfigMap, whose labels carry the chart version), so a pod restarts only when its own
settings change.
*/}}
{{- define "gorge.notification.configData" -}}
{{- $n := .Values.notification -}}
GORGE_NOTIFICATION_CLIENT_PORT: {{ $n.clientPort | quote }}
GORGE_NOTIFICATION_ADMIN_PORT: {{ $n.adminPort | quote }}
GORGE_NOTIFICATION_PEER_DNS: {{ include "gorge.notification.peerDns" . | quote }}
GORGE_NOTIFICATION_DRAIN_SECONDS: {{ $n.drainSeconds | quote }}
{{- range $key, $value := $n.env }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{/* Empty values are left out so that the service uses its own default. */}}
{{- define "gorge.webhook.configData" -}}
{{- $w := .Values.webhook -}}
GORGE_LISTEN_ADDR: {{ printf "0.0.0.0:%d" (int $w.port) | quote }}
{{- with $w.mysql.host }}
GORGE_WEBHOOK_MYSQL_HOST: {{ . | quote }}
{{- end }}
GORGE_WEBHOOK_MYSQL_PORT: {{ $w.mysql.port | quote }}
GORGE_WEBHOOK_MYSQL_USER: {{ $w.mysql.user | quote }}
GORGE_WEBHOOK_NAMESPACE: {{ $w.namespace | quote }}
{{- with $w.outboundBlacklist }}
GORGE_WEBHOOK_OUTBOUND_BLACKLIST: {{ join "," . | quote }}
{{- end }}
{{- range $key, $value := $w.env }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end -}}
