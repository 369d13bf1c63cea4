{{/*
Names, labels and shared pieces of the dra-gateway chart. Helpers render text only: they create
no object, so that every object lives in its own template file.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "dra-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object name: fullnameOverride, else the release name, followed by the chart
name unless the release name already contains it. Kept to 40 characters so that the longest
suffix ("-node-plugin", "-webhook-tls") still fits the 63 characters of a label value.
*/}}
{{- define "dra-gateway.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart-version, as the helm.sh/chart label wants it. */}}
{{- define "dra-gateway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "dra-gateway.labels" -}}
helm.sh/chart: {{ include "dra-gateway.chart" . }}
app.kubernetes.io/name: {{ include "dra-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dra-gateway
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Labels of one component's objects. Call with (dict "root" $ "component" "webhook").
*/}}
{{- define "dra-gateway.componentLabels" -}}
{{ include "dra-gateway.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Selector labels of one component's pods; they never change after install, since a Deployment's
selector is immutable. Call with (dict "root" $ "component" "webhook").
*/}}
{{- define "dra-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-gateway.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Name of one component's objects (Deployment, ServiceAccount, RBAC). */}}
{{- define "dra-gateway.componentName" -}}
{{- printf "%s-%s" (include "dra-gateway.fullname" .root) .component }}
{{- end }}

{{/* The image reference; the tag defaults to the chart's appVersion. */}}
{{- define "dra-gateway.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Name of the webhook's Service. */}}
{{- define "dra-gateway.webhookServiceName" -}}
{{- include "dra-gateway.componentName" (dict "root" . "component" "webhook") }}
{{- end }}

{{/* The host name the API server calls the webhook at, and the certificate must name. */}}
{{- define "dra-gateway.webhookHost" -}}
{{- printf "%s.%s.svc" (include "dra-gateway.webhookServiceName" .) .Release.Namespace }}
{{- end }}

{{/*
Name of both webhook configurations: the name the webhook reconciles (its settings'
MUTATING_CONFIGURATION and VALIDATING_CONFIGURATION), whatever the release is called. Like the
DeviceClasses, they make the gateway one release per cluster.
*/}}
{{- define "dra-gateway.webhookConfigurationName" -}}
dra-gateway
{{- end }}

{{/* Name of the Secret holding the webhook's serving certificate, whatever the mode. */}}
{{- define "dra-gateway.tlsSecretName" -}}
{{- if eq .Values.certificates.mode "secret" }}
{{- .Values.certificates.secret.name }}
{{- else }}
{{- printf "%s-webhook-tls" (include "dra-gateway.fullname" .) }}
{{- end }}
{{- end }}

{{/* Name of the cert-manager Certificate of mode cert-manager. */}}
{{- define "dra-gateway.certificateName" -}}
{{- printf "%s-webhook" (include "dra-gateway.fullname" .) }}
{{- end }}

{{/* Name of the self-signed Issuer the chart creates in mode cert-manager. */}}
{{- define "dra-gateway.issuerName" -}}
{{- printf "%s-selfsigned" (include "dra-gateway.fullname" .) }}
{{- end }}

{{/*
Name of the CA the chart creates in mode cert-manager without an issuerRef: its Certificate, its
Secret and the CA Issuer that signs the serving certificate with it.
*/}}
{{- define "dra-gateway.caName" -}}
{{- printf "%s-ca" (include "dra-gateway.fullname" .) }}
{{- end }}

{{/* Name of the administrator's rules ConfigMap. */}}
{{- define "dra-gateway.rulesConfigMapName" -}}
{{- printf "%s-rules" (include "dra-gateway.fullname" .) }}
{{- end }}

{{/* Name of the node plugin's inventory ConfigMap. */}}
{{- define "dra-gateway.inventoryConfigMapName" -}}
{{- printf "%s-inventory" (include "dra-gateway.fullname" .) }}
{{- end }}

{{/*
The certificate of mode helm, as YAML (caCert, tlsCert, tlsKey: base64 PEM; notAfter: RFC 3339;
previousCaCert: base64 PEM of the CA being replaced, when one is). Computed once per render and
kept on the root context: the Secret and both webhook configurations must agree, and each genCA
call would draw a new CA. An existing Secret is reused as long as it was issued for this Service
and is not within renewBeforeDays of expiry, so that upgrades do not rotate the certificate (and
restart nothing) without need.
*/}}
{{- define "dra-gateway.helmCertificate" -}}
{{- if not (hasKey . "draGatewayHelmCertificate") }}
{{- $host := include "dra-gateway.webhookHost" . }}
{{- $settings := .Values.certificates.helm }}
{{- $reused := dict }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "dra-gateway.tlsSecretName" .) }}
{{- if $existing }}
{{- $data := default dict $existing.data }}
{{- $annotations := default dict $existing.metadata.annotations }}
{{- $notAfter := index $annotations "dra-gateway.io/not-after" | default "" }}
{{- $issuedFor := index $annotations "dra-gateway.io/issued-for" | default "" }}
{{- if and (index $data "ca.crt") (index $data "tls.crt") (index $data "tls.key") (eq $issuedFor $host) $notAfter }}
{{- $renewAt := sub (toDate "2006-01-02T15:04:05Z07:00" $notAfter | unixEpoch | atoi) (mul (int $settings.renewBeforeDays) 86400) }}
{{- if gt $renewAt (now | unixEpoch | atoi) }}
{{- $reused = dict "caCert" (index $data "ca.crt") "tlsCert" (index $data "tls.crt") "tlsKey" (index $data "tls.key") "notAfter" $notAfter }}
{{- end }}
{{- end }}
{{- end }}
{{- if not $reused }}
{{- $days := int $settings.validityDays }}
{{- $ca := genCA (printf "%s-ca" (include "dra-gateway.fullname" .)) (int $settings.caValidityDays) }}
{{- $service := include "dra-gateway.webhookServiceName" . }}
{{- $names := list $service (printf "%s.%s" $service .Release.Namespace) $host }}
{{- $cert := genSignedCert $host nil $names $days $ca }}
{{- $notAfter := dateInZone "2006-01-02T15:04:05Z07:00" (now | dateModify (printf "+%dh" (mul $days 24))) "UTC" }}
{{- $reused = dict "caCert" ($ca.Cert | b64enc) "tlsCert" ($cert.Cert | b64enc) "tlsKey" ($cert.Key | b64enc) "notAfter" $notAfter }}
{{- $previousCa := index (default dict $existing.data) "ca.crt" | default "" }}
{{- if and $previousCa (contains "-----BEGIN CERTIFICATE-----" (b64dec $previousCa)) }}
{{- $_ := set $reused "previousCaCert" $previousCa }}
{{- end }}
{{- end }}
{{- $_ := set . "draGatewayHelmCertificate" $reused }}
{{- end }}
{{- toYaml .draGatewayHelmCertificate }}
{{- end }}

{{/*
The caBundle of the webhook configurations (base64 PEM), or nothing in mode cert-manager, where
cert-manager's CA injector writes it. When mode helm replaces a CA, the bundle trusts the old CA
as well: the configurations change at once, while running webhook pods serve the old certificate
until the kubelet refreshes their Secret volume (a minute or more) and the rollout replaces them;
trusting only the new CA would fail every admission that reaches them meanwhile. The next
upgrade that keeps the certificate drops the old CA.
*/}}
{{- define "dra-gateway.caBundle" -}}
{{- if eq .Values.certificates.mode "helm" }}
{{- $certificate := include "dra-gateway.helmCertificate" . | fromYaml }}
{{- if $certificate.previousCaCert }}
{{- printf "%s\n%s" (b64dec $certificate.caCert | trimSuffix "\n") (b64dec $certificate.previousCaCert) | b64enc }}
{{- else }}
{{- $certificate.caCert }}
{{- end }}
{{- else if eq .Values.certificates.mode "secret" }}
{{- if .Values.certificates.secret.caBundle }}
{{- .Values.certificates.secret.caBundle }}
{{- else }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace .Values.certificates.secret.name }}
{{- if $existing }}
{{- index (default dict $existing.data) "ca.crt" | default "" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Annotations of the webhook configurations (cert-manager's CA injection). */}}
{{- define "dra-gateway.webhookConfigurationAnnotations" -}}
{{- if eq .Values.certificates.mode "cert-manager" }}
cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "dra-gateway.certificateName" .) }}
{{- end }}
{{- end }}

{{/*
The clientConfig, namespaceSelector, objectSelector and matchConditions both webhook
configurations share. Call with (dict "root" $ "path" "/mutate").
*/}}
{{- define "dra-gateway.webhookClientConfig" -}}
{{- $root := .root -}}
clientConfig:
  {{- if $root.Values.webhook.url }}
  {{- /* webhook.url: a webhook served outside the cluster, called at <url><path>. */}}
  url: {{ printf "%s%s" (trimSuffix "/" $root.Values.webhook.url) .path | quote }}
  {{- else }}
  service:
    name: {{ include "dra-gateway.webhookServiceName" $root }}
    namespace: {{ $root.Release.Namespace }}
    path: {{ .path }}
    port: 443
  {{- end }}
  {{- with include "dra-gateway.caBundle" $root }}
  caBundle: {{ . }}
  {{- end }}
{{- end }}

{{/*
The namespaces the pod and claim webhooks leave out: kube-system, the release's own and
webhook.excludeNamespaces. Call with the root context.
*/}}
{{- define "dra-gateway.excludedNamespaces" -}}
- key: kubernetes.io/metadata.name
  operator: NotIn
  values:
    {{- range (concat (list "kube-system" .Release.Namespace) .Values.webhook.excludeNamespaces | uniq) }}
    - {{ . | quote }}
    {{- end }}
{{- end }}

{{/*
The translation mode of namespaces without the label dra-gateway.io/translation.
*/}}
{{- define "dra-gateway.defaultTranslation" -}}
{{- $mode := "enabled" -}}
{{- with .Values.webhook.translation }}{{ with .default }}{{ $mode = . }}{{ end }}{{ end -}}
{{- if not (has $mode (list "enabled" "audit")) -}}
{{- fail (printf "webhook.translation.default is %q; set it to enabled or audit (disabled namespaces are labelled dra-gateway.io/translation=disabled one by one)" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end }}

{{/*
The pod webhooks of one configuration, one per translation mode of a namespace, with disjoint
namespaceSelectors (webhook/config.py writes the same): NAME for namespaces without the label
dra-gateway.io/translation (webhook.translation.default), enabled.NAME and audit.NAME for those
labelled so, unknown-mode.NAME for any other value; disabled namespaces
are sent nowhere. The path tells the webhook the mode. Call with (dict "root" $ "name" NAME
"endpoint" "/mutate" or "/validate" "reinvoke" true|false).
*/}}
{{- define "dra-gateway.podWebhooks" -}}
{{- $root := .root -}}
{{- $endpoint := .endpoint -}}
{{- $default := include "dra-gateway.defaultTranslation" $root -}}
{{- $audit := printf "%s/audit" $endpoint -}}
{{- $paths := dict "enabled" $endpoint "audit" $audit -}}
{{- $unknown := ternary (printf "%s/unknown-mode" $endpoint) $audit (eq $endpoint "/mutate") -}}
{{- $hooks := list
  (dict "prefix" "" "path" (get $paths $default) "expressions" (list (dict "key" "dra-gateway.io/translation" "operator" "DoesNotExist")))
  (dict "prefix" "enabled." "path" $endpoint "expressions" (list (dict "key" "dra-gateway.io/translation" "operator" "In" "values" (list "enabled"))))
  (dict "prefix" "audit." "path" $audit "expressions" (list (dict "key" "dra-gateway.io/translation" "operator" "In" "values" (list "audit"))))
  (dict "prefix" "unknown-mode." "path" $unknown "expressions" (list (dict "key" "dra-gateway.io/translation" "operator" "Exists") (dict "key" "dra-gateway.io/translation" "operator" "NotIn" "values" (list "enabled" "audit" "disabled"))))
-}}
{{- range $hooks }}
- name: {{ printf "%s%s" .prefix $.name }}
  {{- if $.reinvoke }}
  reinvocationPolicy: IfNeeded
  {{- end }}
  {{- include "dra-gateway.webhookCommon" (dict "root" $root "path" .path "expressions" .expressions) | nindent 2 }}
{{- end }}
{{- end }}

{{- define "dra-gateway.webhookCommon" -}}
{{- $root := .root -}}
{{ include "dra-gateway.webhookClientConfig" . }}
namespaceSelector:
  matchExpressions:
    {{- include "dra-gateway.excludedNamespaces" $root | nindent 4 }}
    {{- with .expressions }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- with $root.Values.webhook.objectSelector }}
objectSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.webhook.matchConditions }}
matchConditions:
  {{- toYaml . | nindent 2 }}
{{- end }}
rules:
  - apiGroups: [""]
    apiVersions: ["v1"]
    operations: ["CREATE"]
    resources: ["pods"]
    scope: Namespaced
admissionReviewVersions: ["v1"]
sideEffects: NoneOnDryRun
failurePolicy: {{ $root.Values.webhook.failurePolicy }}
matchPolicy: Equivalent
timeoutSeconds: {{ $root.Values.webhook.timeoutSeconds }}
{{- end }}

{{/*
A preferred anti-affinity spreading one component's replicas over nodes, used when the
component's affinity value is empty. Call with (dict "root" $ "component" "webhook").
*/}}
{{- define "dra-gateway.spreadAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "dra-gateway.selectorLabels" . | nindent 12 }}
{{- end }}

{{/* The security context of the webhook and allocator containers: unprivileged, read-only. */}}
{{- define "dra-gateway.restrictedSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The alert rule groups of the PrometheusRule (templates/prometheusrule.yaml), kept here so that
tests render them alone as a rules file for promtool.

Each expression aggregates before it compares, by what the alert is about (the cluster, a
reason, a quota, a node): the series arrive per scraped pod, and the webhook runs several
replicas, the allocator standbys (the gauges only a leader keeps are absent or 0 there, and two
leaders' overlap at a handover is possible), the node plugin a second pod on a node while it
rolls. A gauge each replica reports for the whole (a leader's counts, a node's devices) is
taken with `max`, never summed; the rates of counters, each replica counting its own, are summed.
*/}}
{{- define "dra-gateway.alertGroups" -}}
{{- $a := .Values.monitoring.alerts -}}
- name: dra-gateway
  rules:
    - alert: DraGatewayAllocatorNoLeader
      expr: max(dra_gateway_allocator_leader) < 1 or absent(dra_gateway_allocator_leader)
      for: 5m
      labels:
        severity: critical
      annotations:
        summary: No dra-gateway allocator replica holds the Lease.
        description: Gated GPU pods get no devices until an allocator leads again; check the allocator pods and their Lease dra-gateway-allocator.
    - alert: DraGatewayWebhookErrors
      expr: sum(rate(dra_gateway_webhook_internal_errors_total[5m])) > 0
      for: 5m
      labels:
        severity: warning
      annotations:
        summary: The dra-gateway webhook answers admission reviews with internal errors.
        description: "{{ "{{" }} $value | humanize {{ "}}" }} internal errors a second; the webhook's log names each review."
    - alert: DraGatewayWebhookSlow
      expr: histogram_quantile(0.99, sum by (le) (rate(dra_gateway_webhook_request_duration_seconds_bucket[5m]))) > {{ $a.webhookLatencySeconds }}
      for: 10m
      labels:
        severity: warning
      annotations:
        summary: The dra-gateway webhook's 99th percentile answer takes longer than {{ $a.webhookLatencySeconds }}s.
        description: Slow admission delays every pod creation; the API server times the webhook out at its timeoutSeconds.
    - alert: DraGatewayPodsGated
      expr: max by (reason) (dra_gateway_allocator_pending_pods) > 0
      for: {{ $a.gatedFor }}
      labels:
        severity: warning
      annotations:
        summary: GPU pods have waited for devices longer than {{ $a.gatedFor }} ({{ "{{" }} $labels.reason {{ "}}" }}).
        description: "{{ "{{" }} $value {{ "}}" }} pod(s) wait; `dra-gateway report` says why each one waits."
    - alert: DraGatewayQuotaExhausted
      expr: max by (quota_namespace, quota, resource) (dra_gateway_allocator_quota_used) >= max by (quota_namespace, quota, resource) (dra_gateway_allocator_quota_hard)
      for: 15m
      labels:
        severity: info
      annotations:
        summary: GPUQuota {{ "{{" }} $labels.quota_namespace {{ "}}" }}/{{ "{{" }} $labels.quota {{ "}}" }} has used all its {{ "{{" }} $labels.resource {{ "}}" }}.
        description: New GPU pods of namespace {{ "{{" }} $labels.quota_namespace {{ "}}" }} wait until some of its pods end or the quota grows.
    - alert: DraGatewayPreemptionBurst
      expr: sum(increase(dra_gateway_allocator_preemptions_total{result="evicted"}[10m])) > {{ $a.preemptionsPer10m }}
      labels:
        severity: warning
      annotations:
        summary: The allocator preempted more than {{ $a.preemptionsPer10m }} pods in 10 minutes.
        description: High-priority GPU pods are displacing others at a high rate; check the PriorityClasses and quotas.
    - alert: DraGatewayUnhealthyDevices
      expr: max by (node) (dra_gateway_node_plugin_unhealthy_devices) > 0
      for: 1m
      labels:
        severity: warning
      annotations:
        summary: "{{ "{{" }} $value {{ "}}" }} GPU device(s) of node {{ "{{" }} $labels.node {{ "}}" }} are out of service."
        description: Their taints (or the Node condition GpuDevicesUnhealthy) say why; `dra-gateway report` lists them.
    - alert: DraGatewayNodePluginNotRegistered
      expr: max by (node) (dra_gateway_node_plugin_registered) < 1
      for: 5m
      labels:
        severity: critical
      annotations:
        summary: The kubelet of node {{ "{{" }} $labels.node {{ "}}" }} has not registered the dra-gateway node plugin.
        description: No GPU claim can be prepared there; the node plugin's log and the kubelet's say why.
    - alert: DraGatewayInvalidClaims
      expr: max(dra_gateway_allocator_invalid_claims) > 0
      labels:
        severity: critical
      annotations:
        summary: "{{ "{{" }} $value {{ "}}" }} ResourceClaim(s) hold an allocation Kubernetes 1.38 refuses."
        description: kube-scheduler 1.38 stops every DRA pod while one holds a negative amount; their Events InvalidAllocation and `dra-gateway report` name them.
{{- end }}

{{/*
A component's PodMonitor (monitoring.coreos.com/v1): its pods' plain-HTTP /metrics on the port
named `port`, each series labelled with the pod's node as `node`. Call with (dict "root" $
"component" "allocator" "port" "metrics").
*/}}
{{- define "dra-gateway.podMonitor" -}}
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: {{ include "dra-gateway.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "dra-gateway.componentLabels" . | nindent 4 }}
    {{- with .root.Values.monitoring.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "dra-gateway.selectorLabels" . | nindent 6 }}
  podMetricsEndpoints:
    - port: {{ .port }}
      path: /metrics
      interval: {{ .root.Values.monitoring.interval }}
      relabelings:
        - sourceLabels: [__meta_kubernetes_pod_node_name]
          targetLabel: node
{{- end }}
