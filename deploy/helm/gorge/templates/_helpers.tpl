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

{{/*
A formula of a service's settings catalog (files/settings/<service>.json, whose `derived`
section is generated from the service's declaration of derived facts and checked against it
by the service's tests/docs.rs), evaluated on the environment a pod of the component gets:
each setting it names is that variable's value, or the catalog's `default` when the variable
is absent or empty — exactly what the binary prints as that fact with the same environment.
Arguments: (dict "formula" F "env" ENV "catalog" CATALOG).
*/}}
{{- define "gorge.formula" -}}
{{- $f := .formula -}}
{{- if hasKey $f "setting" -}}
{{- $text := get .env $f.setting | toString | trim -}}
{{- if eq $text "" -}}
{{- $text = index .catalog.settings $f.setting "default" | toString -}}
{{- end -}}
{{- $text | int64 -}}
{{- else if hasKey $f "constant" -}}
{{- $f.constant | int64 -}}
{{- else if hasKey $f "sum" -}}
{{- $total := 0 | int64 -}}
{{- range $term := $f.sum -}}
{{- $total = add $total (include "gorge.formula" (dict "formula" $term "env" $.env "catalog" $.catalog) | int64) -}}
{{- end -}}
{{- $total -}}
{{- else if hasKey $f "max" -}}
{{- $most := 0 | int64 -}}
{{- range $term := $f.max -}}
{{- $most = max $most (include "gorge.formula" (dict "formula" $term "env" $.env "catalog" $.catalog) | int64) -}}
{{- end -}}
{{- $most -}}
{{- else if hasKey $f "times" -}}
{{- mul ($f.times | int64) (include "gorge.formula" (dict "formula" $f.of "env" .env "catalog" .catalog) | int64) -}}
{{- else -}}
{{- fail (printf "cannot evaluate the formula %v (files/settings/ from a newer service?)" $f) -}}
{{- end -}}
{{- end -}}

{{/*
How long each service may take to stop after SIGTERM: its derived fact `stop_within_sec`
(docs/<service>.md, "Derived facts"), evaluated on the component's own ConfigMap, so a
setting in `env` that lengthens the stop (a longer claim lease, say) lengthens the grace
period with it.
*/}}
{{- define "gorge.notification.stopWithinSeconds" -}}
{{- $catalog := .Files.Get "files/settings/gorge-notification.json" | fromJson -}}
{{- $env := include "gorge.notification.configData" . | fromYaml -}}
{{- include "gorge.formula" (dict "formula" $catalog.derived.stop_within_sec "env" $env "catalog" $catalog) -}}
{{- end -}}
{{- define "gorge.webhook.stopWithinSeconds" -}}
{{- $catalog := .Files.Get "files/settings/gorge-webhook.json" | fromJson -}}
{{- $env := include "gorge.webhook.configData" . | fromYaml -}}
{{- include "gorge.formula" (dict "formula" $catalog.derived.stop_within_sec "env" $env "catalog" $catalog) -}}
{{- end -}}

{{/*
Grace periods. Kubernetes counts the preStop sleep inside terminationGracePeriodSeconds, so
each one is preStop + the service's stop bound (above) + a margin. The "minimum" helpers are
what an explicit value must exceed; the defaults add 10 s of margin for SIGKILL delivery and
a slow node.
Arguments: (list component context).
*/}}
{{- define "gorge.minimumGracePeriodSeconds" -}}
{{- $component := index . 0 -}}
{{- $ctx := index . 1 -}}
{{- $values := index $ctx.Values $component -}}
{{- add (int $values.preStopSleepSeconds) (include (printf "gorge.%s.stopWithinSeconds" $component) $ctx | int) -}}
{{- end -}}
{{- define "gorge.terminationGracePeriodSeconds" -}}
{{- $component := index . 0 -}}
{{- $ctx := index . 1 -}}
{{- $values := index $ctx.Values $component -}}
{{- $minimum := include "gorge.minimumGracePeriodSeconds" . | int -}}
{{- if $values.terminationGracePeriodSeconds -}}
{{- if le (int $values.terminationGracePeriodSeconds) $minimum -}}
{{- fail (printf "%s.terminationGracePeriodSeconds=%d must exceed preStopSleepSeconds + the service's stop_within_sec (docs/%s.md, Derived facts) = %d (leave it empty to derive it)" $component (int $values.terminationGracePeriodSeconds) $component $minimum) -}}
{{- end -}}
{{- $values.terminationGracePeriodSeconds -}}
{{- else -}}
{{- add $minimum 10 -}}
{{- end -}}
{{- end -}}

{{/* A preStop sleep keeps the pod serving while kube-proxy and Ingress controllers remove it. */}}
{{- define "gorge.preStop" -}}
{{- if gt (int .) 0 -}}
lifecycle:
  preStop:
    exec:
      command: ["/bin/sleep", {{ . | toString | quote }}]
{{- end }}
{{- end -}}

{{/*
A Kubernetes memory quantity ("512Mi", "1Gi", "600M", "0.5Gi", "1073741824") in bytes.
*/}}
{{- define "gorge.quantityBytes" -}}
{{- $q := toString . -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $suffix := trimPrefix $number $q -}}
{{- $factors := dict "" 1 "k" 1000 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- if or (not $number) (not (hasKey $factors $suffix)) -}}
{{- fail (printf "cannot read the memory quantity %q (expected e.g. 512Mi or 1Gi)" $q) -}}
{{- end -}}
{{- mulf (float64 $number) (index $factors $suffix) | floor | int64 -}}
{{- end -}}

{{/*
GORGE_NOTIFICATION_MAX_SOCKETS. Each open socket costs ~4.3 KiB of RSS when idle (measured,
docs/benchmarks.md); the chart budgets socketBudgetBytes (default 8 KiB: the idle cost plus
the frame being written and allocator slack) per socket on top of reserveBytes (default
64 MiB: history up to 16 MiB, peer queues, the runtime). Queued frames share one encoded copy
of each message, so they add little per socket. Derived when maxSockets is empty:
  (limits.memory - reserve) / budget, e.g. (512Mi - 64Mi) / 8Ki = 57344;
an explicit maxSockets must fit the same arithmetic. Empty output: no memory limit, the
service's own default applies.
*/}}
{{- define "gorge.notification.maxSockets" -}}
{{- $n := .Values.notification -}}
{{- $limit := dig "limits" "memory" "" ($n.resources | default dict) -}}
{{- if $limit -}}
{{- $bytes := include "gorge.quantityBytes" $limit | int64 -}}
{{- $reserve := int64 $n.memorySizing.reserveBytes -}}
{{- $budget := int64 $n.memorySizing.socketBudgetBytes -}}
{{- if le $bytes $reserve -}}
{{- fail (printf "notification.resources.limits.memory=%s leaves no room for sockets above notification.memorySizing.reserveBytes=%d" $limit $reserve) -}}
{{- end -}}
{{- $fits := div (sub $bytes $reserve) $budget -}}
{{- if $n.maxSockets -}}
{{- if gt (int64 $n.maxSockets) $fits -}}
{{- fail (printf "notification.maxSockets=%d does not fit notification.resources.limits.memory=%s: at most %d sockets fit ((limit - %d reserve) / %d bytes per socket); lower maxSockets or raise the limit" (int64 $n.maxSockets) $limit $fits $reserve $budget) -}}
{{- end -}}
{{- $n.maxSockets -}}
{{- else -}}
{{- $fits -}}
{{- end -}}
{{- else if $n.maxSockets -}}
{{- $n.maxSockets -}}
{{- end -}}
{{- end -}}

{{/*
Settings the chart itself sets, with the value to use instead; `env` may not set them (a
second copy in the ConfigMap would bypass the chart's guards, e.g. probes on an old admin
port or a grace period shorter than the drain).
*/}}
{{- define "gorge.notification.managedEnv" -}}
GORGE_NOTIFICATION_CLIENT_PORT: notification.clientPort
GORGE_NOTIFICATION_ADMIN_PORT: notification.adminPort
GORGE_NOTIFICATION_LISTEN_ADDR: nothing (the probes and Services need every pod address)
GORGE_NOTIFICATION_CLIENT_LISTEN_ADDR: nothing (the probes and Services need every pod address)
GORGE_NOTIFICATION_ADMIN_LISTEN_ADDR: nothing (the probes and Services need every pod address; the NetworkPolicy guards it)
GORGE_NOTIFICATION_PEER_DNS: nothing (the chart points it at its headless Service)
GORGE_NOTIFICATION_PEERS: nothing (peers are found through GORGE_NOTIFICATION_PEER_DNS)
GORGE_NOTIFICATION_DRAIN_SECONDS: notification.drainSeconds
GORGE_NOTIFICATION_MAX_SOCKETS: notification.maxSockets
GORGE_NOTIFICATION_CONFIG_FILE: nothing (the chart configures through the environment)
GORGE_NOTIFICATION_BROKER_URL: notification.broker.url
GORGE_NOTIFICATION_BROKER_PASSWORD_FILE: notification.broker.existingSecret
GORGE_NOTIFICATION_BROKER_PREFIX: notification.broker.prefix
GORGE_NOTIFICATION_BROKER_CA_FILE: notification.broker.caConfigMap
GORGE_NOTIFICATION_CLIENT_TLS_CERT_FILE: notification.tls.secretName
GORGE_NOTIFICATION_CLIENT_TLS_KEY_FILE: notification.tls.secretName
GORGE_NOTIFICATION_CLIENT_TLS_CHAIN_FILE: nothing (tls.crt holds the chain after the leaf)
GORGE_NOTIFICATION_ADMIN_TLS_CERT_FILE: notification.tls.admin
GORGE_NOTIFICATION_ADMIN_TLS_KEY_FILE: notification.tls.admin
GORGE_NOTIFICATION_ADMIN_TLS_CHAIN_FILE: nothing (tls.crt holds the chain after the leaf)
{{- end -}}
{{- define "gorge.webhook.managedEnv" -}}
GORGE_LISTEN_ADDR: webhook.port
GORGE_WEBHOOK_MYSQL_HOST: webhook.mysql.host
GORGE_WEBHOOK_MYSQL_PORT: webhook.mysql.port
GORGE_WEBHOOK_MYSQL_USER: webhook.mysql.user
GORGE_WEBHOOK_MYSQL_PASS: webhook.mysql.existingSecret
GORGE_WEBHOOK_NAMESPACE: webhook.namespace
GORGE_WEBHOOK_OUTBOUND_BLACKLIST: webhook.outboundBlacklist
GORGE_WEBHOOK_DELIVERY_TIMEOUT: webhook.deliveryTimeoutSeconds
GORGE_SERVICE_TOKEN: webhook.serviceToken.existingSecret
{{- end -}}
{{- define "gorge.refuseManagedEnv" -}}
{{- $component := index . 0 -}}
{{- $env := index . 1 -}}
{{- $managed := index . 2 | fromYaml -}}
{{- range $key := keys $env | sortAlpha -}}
{{- if hasKey $managed $key -}}
{{- fail (printf "%s.env.%s is set by the chart; use %s instead" $component $key (index $managed $key)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
`env` values the service would refuse at start (or ignore), refused here with the same words:
files/settings/<service>.json is generated from the service's settings declaration (and
checked against it by the service's tests/docs.rs). A variable with the service's prefix or
GORGE_LOG_ that is not a setting is refused too: the service would only warn and ignore it.
Arguments: (list component service envMap catalogJson).
*/}}
{{- define "gorge.checkEnv" -}}
{{- $component := index . 0 -}}
{{- $service := index . 1 -}}
{{- $env := index . 2 -}}
{{- $catalog := index . 3 | fromJson -}}
{{- range $key := keys $env | sortAlpha -}}
{{- $text := index $env $key | toString -}}
{{- $setting := get $catalog.settings $key -}}
{{- if $setting -}}
{{- $where := printf "%s.env.%s=%q" $component $key $text -}}
{{- if eq $text "" -}}
{{- /* Empty is the service's default. */ -}}
{{- else if hasKey $setting "min" -}}
{{- $number := trim $text -}}
{{- if or (not (regexMatch "^[0-9]{1,15}$" $number)) (lt (float64 $number) (float64 $setting.min)) (gt (float64 $number) (float64 $setting.max)) -}}
{{- fail (printf "%s: expected %s (%s would refuse to start)" $where $setting.valid $service) -}}
{{- end -}}
{{- else if hasKey $setting "oneOf" -}}
{{- if not (has (lower (trim $text)) $setting.oneOf) -}}
{{- fail (printf "%s: expected %s (%s would refuse to start)" $where $setting.valid $service) -}}
{{- end -}}
{{- else if hasKey $setting "levels" -}}
{{- /* LEVEL[,COMPONENT=LEVEL...], as the service reads it: every part's syntax and level
first (only the first part may be a bare level), then the components. */ -}}
{{- $parts := splitList "," $text -}}
{{- range $i, $part := $parts -}}
{{- $pair := splitn "=" 2 (trim $part) -}}
{{- $level := ternary $pair._0 (default "" $pair._1) (eq (len $pair) 1) -}}
{{- if or (and (eq (len $pair) 1) (gt $i 0)) (and (eq (len $pair) 2) (eq (trim $pair._0) "")) (not (has (lower (trim $level)) $setting.levels)) -}}
{{- fail (printf "%s: expected %s (%s would refuse to start)" $where $setting.valid $service) -}}
{{- end -}}
{{- end -}}
{{- range $part := $parts -}}
{{- $pair := splitn "=" 2 (trim $part) -}}
{{- if and (eq (len $pair) 2) (not (has (trim $pair._0) $setting.components)) -}}
{{- fail (printf "%s: unknown component %q; %s's components: %s (%s would refuse to start)" $where (trim $pair._0) $service (join ", " $setting.components) $service) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- else if or (hasPrefix $catalog.prefix $key) (hasPrefix "GORGE_LOG_" $key) -}}
{{- fail (printf "%s.env.%s is not a setting of %s, which would ignore it (settings: docs/%s.md)" $component $key $service (trimPrefix "gorge-" $service)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Values a working install cannot do without, refused at template time with the value to set.
*/}}
{{- define "gorge.notification.validate" -}}
{{- $n := .Values.notification -}}
{{- include "gorge.refuseManagedEnv" (list "notification" $n.env (include "gorge.notification.managedEnv" .)) -}}
{{- include "gorge.checkEnv" (list "notification" "gorge-notification" $n.env (.Files.Get "files/settings/gorge-notification.json")) -}}
{{- if and $n.networkPolicy.enabled (not $n.adminAllowedFrom) -}}
{{- fail "notification.adminAllowedFrom is empty, so the NetworkPolicy would admit nothing but this release to the admin port and Phorge could not post notifications: list Phorge's PHP pods (e.g. --set 'notification.adminAllowedFrom[0].podSelector.matchLabels.app=phorge'), or set notification.networkPolicy.enabled=false" -}}
{{- end -}}
{{- if and $n.autoscaling.enabled (le (int $n.autoscaling.maxReplicas) (int $n.autoscaling.minReplicas)) -}}
{{- fail "notification.autoscaling.maxReplicas must be above notification.autoscaling.minReplicas" -}}
{{- end -}}
{{- if and $n.tls.admin (not $n.tls.secretName) -}}
{{- fail "notification.tls.admin needs notification.tls.secretName (the kubernetes.io/tls Secret to serve)" -}}
{{- end -}}
{{- if and $n.tls.admin (not $n.broker.url) -}}
{{- fail "notification.tls.admin needs broker mode (notification.broker.url): in mesh mode the pods relay to each other's admin port by pod IP, which the certificate does not name" -}}
{{- end -}}
{{- $max := include "gorge.notification.maxSockets" . -}}
{{- if and $n.autoscaling.enabled $max (ge (int64 $n.autoscaling.targetSocketsPerPod) (int64 $max)) -}}
{{- fail (printf "notification.autoscaling.targetSocketsPerPod=%d must stay below the %s sockets a pod accepts (notification.maxSockets / resources.limits.memory)" (int64 $n.autoscaling.targetSocketsPerPod) $max) -}}
{{- end -}}
{{- end -}}
{{- define "gorge.webhook.validate" -}}
{{- $w := .Values.webhook -}}
{{- include "gorge.refuseManagedEnv" (list "webhook" $w.env (include "gorge.webhook.managedEnv" .)) -}}
{{- include "gorge.checkEnv" (list "webhook" "gorge-webhook" $w.env (.Files.Get "files/settings/gorge-webhook.json")) -}}
{{- if not $w.mysql.host -}}
{{- fail "webhook.mysql.host is empty: set it to Phorge's database server (e.g. --set webhook.mysql.host=mariadb.phorge.svc; 127.0.0.1 only with a sidecar proxy), or set webhook.enabled=false" -}}
{{- end -}}
{{- end -}}

{{/* Replica count a PodDisruptionBudget is judged by: with one pod, a PDB only blocks drains. */}}
{{- define "gorge.notification.minReplicas" -}}
{{- if .Values.notification.autoscaling.enabled -}}
{{- .Values.notification.autoscaling.minReplicas -}}
{{- else -}}
{{- .Values.notification.replicaCount -}}
{{- end -}}
{{- end -}}

{{/*
Topology spread: the user's constraints, else (defaultTopologySpread) a soft spread over
nodes and zones, so one node or zone going away does not take every pod of the component.
Arguments: (list $componentValues $selectorLabelsYaml).
*/}}
{{- define "gorge.topologySpread" -}}
{{- $c := index . 0 -}}
{{- $selector := index . 1 -}}
{{- if $c.topologySpreadConstraints -}}
topologySpreadConstraints:
  {{- toYaml $c.topologySpreadConstraints | nindent 2 }}
{{- else if $c.defaultTopologySpread -}}
topologySpreadConstraints:
  {{- range $key := list "kubernetes.io/hostname" "topology.kubernetes.io/zone" }}
  - maxSkew: 1
    topologyKey: {{ $key }}
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- $selector | nindent 8 }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "gorge.webhook.url" -}}
{{- printf "http://%s.%s.svc:%d" (include "gorge.webhook.fullname" .) .Release.Namespace (int .Values.webhook.port) -}}
{{- end -}}

{{/*
ConfigMap data of each component. The Deployments hash exactly this (not the whole
ConfigMap, whose labels carry the chart version), so a pod restarts only when its own
settings change.
*/}}
{{/* Where the broker password Secret is mounted (broker mode). */}}
{{- define "gorge.notification.brokerPasswordFile" -}}
/var/run/secrets/gorge/broker/{{ .Values.notification.broker.passwordKey }}
{{- end -}}

{{/* Where the broker's CA ConfigMap is mounted (rediss:// with a private CA). */}}
{{- define "gorge.notification.brokerCaFile" -}}
/etc/gorge/broker-ca/{{ .Values.notification.broker.caKey }}
{{- end -}}

{{/* Where the TLS Secret is mounted (the whole directory, so that its ..data swap on renewal
is seen: a subPath mount would never change). */}}
{{- define "gorge.notification.tlsDir" -}}
/etc/gorge/tls
{{- end -}}

{{/* The scheme of the admin port: https when notification.tls.admin. */}}
{{- define "gorge.notification.adminScheme" -}}
{{- if and .Values.notification.tls.secretName .Values.notification.tls.admin -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}

{{- define "gorge.notification.configData" -}}
{{- $n := .Values.notification -}}
GORGE_NOTIFICATION_CLIENT_PORT: {{ $n.clientPort | quote }}
GORGE_NOTIFICATION_ADMIN_PORT: {{ $n.adminPort | quote }}
{{- /* The service's default admin address is loopback (it has no authentication); in a pod
the kubelet's probes, the admin Service and the peers reach it on the pod address, and the
NetworkPolicy (notification-networkpolicy.yaml) admits only Phorge's pods and this release. */}}
GORGE_NOTIFICATION_ADMIN_LISTEN_ADDR: "0.0.0.0"
{{- if $n.broker.url }}
GORGE_NOTIFICATION_BROKER_URL: {{ $n.broker.url | quote }}
GORGE_NOTIFICATION_BROKER_PREFIX: {{ $n.broker.prefix | quote }}
{{- with $n.broker.existingSecret }}
GORGE_NOTIFICATION_BROKER_PASSWORD_FILE: {{ include "gorge.notification.brokerPasswordFile" $ | quote }}
{{- end }}
{{- with $n.broker.caConfigMap }}
GORGE_NOTIFICATION_BROKER_CA_FILE: {{ include "gorge.notification.brokerCaFile" $ | quote }}
{{- end }}
{{- else }}
GORGE_NOTIFICATION_PEER_DNS: {{ include "gorge.notification.peerDns" . | quote }}
{{- end }}
{{- with $n.tls.secretName }}
{{- $dir := include "gorge.notification.tlsDir" $ }}
GORGE_NOTIFICATION_CLIENT_TLS_CERT_FILE: {{ printf "%s/tls.crt" $dir | quote }}
GORGE_NOTIFICATION_CLIENT_TLS_KEY_FILE: {{ printf "%s/tls.key" $dir | quote }}
{{- if $n.tls.admin }}
GORGE_NOTIFICATION_ADMIN_TLS_CERT_FILE: {{ printf "%s/tls.crt" $dir | quote }}
GORGE_NOTIFICATION_ADMIN_TLS_KEY_FILE: {{ printf "%s/tls.key" $dir | quote }}
{{- end }}
{{- end }}
GORGE_NOTIFICATION_DRAIN_SECONDS: {{ $n.drainSeconds | quote }}
{{- with include "gorge.notification.maxSockets" . }}
GORGE_NOTIFICATION_MAX_SOCKETS: {{ . | quote }}
{{- end }}
{{- range $key, $value := $n.env }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{/* Empty values are left out so that the service uses its own default. */}}
{{- define "gorge.webhook.configData" -}}
{{- $w := .Values.webhook -}}
GORGE_LISTEN_ADDR: {{ printf "0.0.0.0:%d" (int $w.port) | quote }}
GORGE_WEBHOOK_MYSQL_HOST: {{ $w.mysql.host | quote }}
GORGE_WEBHOOK_MYSQL_PORT: {{ $w.mysql.port | quote }}
GORGE_WEBHOOK_MYSQL_USER: {{ $w.mysql.user | quote }}
GORGE_WEBHOOK_NAMESPACE: {{ $w.namespace | quote }}
GORGE_WEBHOOK_DELIVERY_TIMEOUT: {{ $w.deliveryTimeoutSeconds | quote }}
{{- with $w.outboundBlacklist }}
GORGE_WEBHOOK_OUTBOUND_BLACKLIST: {{ join "," . | quote }}
{{- end }}
{{- range $key, $value := $w.env }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end -}}
