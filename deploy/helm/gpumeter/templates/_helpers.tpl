{{/* Names: "<release>" when it already says gpumeter, else "<release>-gpumeter"; components append "-<component>". */}}
{{- define "gpumeter.fullname" -}}
{{- if contains "gpumeter" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-gpumeter" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpumeter.name" -}}
{{- printf "%s-%s" (include "gpumeter.fullname" .root) .component -}}
{{- end -}}

{{- define "gpumeter.selectorLabels" -}}
app.kubernetes.io/name: gpumeter
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpumeter.labels" -}}
{{ include "gpumeter.selectorLabels" . }}
app.kubernetes.io/part-of: gpumeter
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gpumeter.image" -}}
{{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end -}}

{{/* The settings file every component reads (GPUMETER_CONFIG): contract 9's keys. */}}
{{- define "gpumeter.settings" -}}
{{- $k := .Values.kafka -}}
{{- $ch := .Values.clickhouse -}}
{{- $kafka := dict "bootstrap" $k.bootstrap "topic_prefix" $k.topicPrefix "partitions" $k.partitions "replication_factor" $k.replicationFactor "min_insync_replicas" $k.minInsyncReplicas "compression" $k.compression "security_protocol" $k.securityProtocol "create_topics" $k.createTopics -}}
{{- if hasPrefix "SASL_" $k.securityProtocol -}}
{{- $_ := set $kafka "sasl_mechanism" $k.saslMechanism -}}
{{- $_ := set $kafka "sasl_password_file" "/var/run/secrets/gpumeter/kafka/password" -}}
{{- end -}}
{{- if $k.tls.caSecret -}}
{{- $_ := set $kafka "ssl_cafile" (printf "/etc/gpumeter/kafka-ca/%s" $k.tls.caKey) -}}
{{- end -}}
{{- if $k.tls.clientCertSecret -}}
{{- $_ := set $kafka "ssl_certfile" "/etc/gpumeter/kafka-client/tls.crt" -}}
{{- $_ := set $kafka "ssl_keyfile" "/etc/gpumeter/kafka-client/tls.key" -}}
{{- end -}}
{{- $clickhouse := dict "dsn" $ch.dsn -}}
{{- if $ch.passwordSecret.name -}}
{{- $_ := set $clickhouse "password_file" "/var/run/secrets/gpumeter/clickhouse/password" -}}
{{- end -}}
{{- if $ch.cluster -}}
{{- $_ := set $clickhouse "cluster" $ch.cluster -}}
{{- $_ := set $clickhouse "replicated" $ch.replicated -}}
{{- $_ := set $clickhouse "sharded" $ch.sharded -}}
{{- end -}}
{{- $hooks := merge (dict "dry_run" .Values.actuator.dryRun) (deepCopy .Values.settings.hooks) -}}
{{- $api := deepCopy .Values.settings.api -}}
{{- $_ := set $api "listen" (printf "0.0.0.0:%d" (int .Values.api.port)) -}}
{{- if .Values.api.tokensSecret.name -}}
{{- $_ := set $api "tokens" (printf "/etc/gpumeter/api-tokens/%s" .Values.api.tokensSecret.key) -}}
{{- end -}}
{{- if .Values.api.tlsSecret -}}
{{- $_ := set $api "tls_cert" "/etc/gpumeter/api-tls/tls.crt" -}}
{{- $_ := set $api "tls_key" "/etc/gpumeter/api-tls/tls.key" -}}
{{- end -}}
{{- $worker := merge (dict "metrics_port" .Values.worker.metricsPort) (deepCopy .Values.settings.worker) -}}
{{- $settings := dict "data_dir" "/tmp/gpumeter" "kafka" $kafka "clickhouse" $clickhouse "rate_cards" "/etc/gpumeter/config/ratecards" "tenants" "/etc/gpumeter/config/tenants.yaml" "worker" $worker "quota" .Values.settings.quota "hooks" $hooks "api" $api "invoices" .Values.settings.invoices -}}
{{- toYaml $settings -}}
{{- end -}}

{{/* Pod metadata annotations: settings changes roll the pods (tenants and rate cards are re-read live). */}}
{{- define "gpumeter.podAnnotations" -}}
checksum/settings: {{ include "gpumeter.settings" . | sha256sum }}
{{- end -}}

{{- define "gpumeter.podSecurityContext" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end -}}

{{- define "gpumeter.containerSecurityContext" -}}
{{ toYaml .Values.containerSecurityContext }}
{{- end -}}

{{/*
Environment of a component. .kafkaRole: a key of kafka.credentials, or "" for a process that
never talks to Kafka (it gets no principal, and a bootstrap that cannot resolve).
*/}}
{{- define "gpumeter.env" -}}
- name: GPUMETER_CONFIG
  value: /etc/gpumeter/config/settings.yaml
- name: GPUMETER_CLUSTER
  value: {{ .root.Values.cluster | quote }}
- name: HOME
  value: /tmp
- name: XDG_CACHE_HOME
  value: /tmp/cache
- name: PYTHONUNBUFFERED
  value: "1"
{{- if .kafkaRole }}
{{- if hasPrefix "SASL_" .root.Values.kafka.securityProtocol }}
- name: GPUMETER_KAFKA_SASL_USERNAME
  value: {{ (index .root.Values.kafka.credentials .kafkaRole).username | quote }}
{{- end }}
{{- else }}
# No Kafka principal: this process reads ClickHouse only.
- name: GPUMETER_KAFKA_BOOTSTRAP
  value: "no-kafka.invalid:9092"
- name: GPUMETER_KAFKA_SECURITY_PROTOCOL
  value: PLAINTEXT
{{- end }}
{{- end -}}

{{/* Mounts of a component: settings, /tmp, its Kafka secrets (.kafkaRole), ClickHouse's (.clickhouse). */}}
{{- define "gpumeter.volumeMounts" -}}
- name: config
  mountPath: /etc/gpumeter/config
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .kafkaRole }}
{{- if hasPrefix "SASL_" .root.Values.kafka.securityProtocol }}
- name: kafka-password
  mountPath: /var/run/secrets/gpumeter/kafka
  readOnly: true
{{- end }}
{{- if .root.Values.kafka.tls.caSecret }}
- name: kafka-ca
  mountPath: /etc/gpumeter/kafka-ca
  readOnly: true
{{- end }}
{{- if .root.Values.kafka.tls.clientCertSecret }}
- name: kafka-client
  mountPath: /etc/gpumeter/kafka-client
  readOnly: true
{{- end }}
{{- end }}
{{- if and .clickhouse .root.Values.clickhouse.passwordSecret.name }}
- name: clickhouse-password
  mountPath: /var/run/secrets/gpumeter/clickhouse
  readOnly: true
{{- end }}
{{- end -}}

{{- define "gpumeter.volumes" -}}
- name: config
  configMap:
    name: {{ include "gpumeter.fullname" .root }}-config
    items:
      - {key: settings.yaml, path: settings.yaml}
      - {key: tenants.yaml, path: tenants.yaml}
      {{- range $name, $_ := .root.Values.rateCards }}
      - {key: {{ printf "ratecard-%s" $name | quote }}, path: {{ printf "ratecards/%s" $name | quote }}}
      {{- end }}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- if .kafkaRole }}
{{- if hasPrefix "SASL_" .root.Values.kafka.securityProtocol }}
{{- $cred := index .root.Values.kafka.credentials .kafkaRole }}
- name: kafka-password
  secret:
    secretName: {{ required (printf "kafka.credentials.%s.secretName is required with %s" .kafkaRole .root.Values.kafka.securityProtocol) $cred.secretName }}
    items:
      - {key: {{ $cred.passwordKey | quote }}, path: password}
{{- end }}
{{- if .root.Values.kafka.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ .root.Values.kafka.tls.caSecret }}
{{- end }}
{{- if .root.Values.kafka.tls.clientCertSecret }}
- name: kafka-client
  secret:
    secretName: {{ .root.Values.kafka.tls.clientCertSecret }}
{{- end }}
{{- end }}
{{- if and .clickhouse .root.Values.clickhouse.passwordSecret.name }}
- name: clickhouse-password
  secret:
    secretName: {{ .root.Values.clickhouse.passwordSecret.name }}
    items:
      - {key: {{ .root.Values.clickhouse.passwordSecret.key | quote }}, path: password}
{{- end }}
{{- end -}}

{{- define "gpumeter.podCommon" -}}
securityContext:
  {{- include "gpumeter.podSecurityContext" . | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
