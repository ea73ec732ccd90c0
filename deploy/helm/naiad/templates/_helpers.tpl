{{/* Names and labels shared by every object of the chart. */}}

{{- define "naiad.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "naiad.fullname" -}}
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

{{- define "naiad.selectorLabels" -}}
app.kubernetes.io/name: {{ include "naiad.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "naiad.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "naiad.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "naiad.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "naiad.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "naiad.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
PromQL label matchers selecting this release's pods: Prometheus-operator adds `namespace` and
`pod` to every target it scrapes, whether found by the ServiceMonitor or the PodMonitor.
*/}}
{{- define "naiad.podMatchers" -}}
namespace="{{ .Release.Namespace }}",pod=~"{{ include "naiad.fullname" . }}-.*"
{{- end }}

{{/*
Average time a request waited in the queue over the window, in microseconds, across the
release: Triton's queue-duration counter over its success counter. clamp_min keeps an idle
deployment at 0 instead of NaN (0/0), so an autoscaler can scale it in.
*/}}
{{- define "naiad.queueTimeQuery" -}}
{{- $m := include "naiad.podMatchers" . -}}
{{- $w := .Values.autoscaling.window -}}
sum(rate(nv_inference_queue_duration_us{ {{- $m -}} }[{{ $w }}])) / clamp_min(sum(rate(nv_inference_request_success{ {{- $m -}} }[{{ $w }}])), 1e-9)
{{- end }}

{{/* Drain time the server gets after SIGTERM (--exit-timeout-secs) plus the preStop pause and slack. */}}
{{- define "naiad.terminationGrace" -}}
{{- add (int .Values.server.exitTimeoutSecs) (int .Values.lifecycle.preStopSleepSeconds) 5 }}
{{- end }}
