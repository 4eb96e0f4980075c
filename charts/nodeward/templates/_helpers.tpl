{{/*
Labels of every object: the two the raw manifests (packaging/kubernetes/) have, which are also
the Deployments' selectors (immutable: kept as they are, so objects applied from the raw
manifests can be adopted), plus Helm's own.
Call: include "nodeward.labels" (dict "ctx" $ "component" "scaler")
*/}}
{{- define "nodeward.selectorLabels" -}}
app.kubernetes.io/name: nodeward
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "nodeward.labels" -}}
{{ include "nodeward.selectorLabels" . }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The image reference: repository@digest, else repository:tag (tag: appVersion). */}}
{{- define "nodeward.image" -}}
{{- $repo := required "image.repository: nodeward publishes no image; build one with scripts/image, push it, and set image.repository (and image.tag or image.digest)" .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{ $repo }}@{{ .Values.image.digest }}
{{- else -}}
{{ $repo }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The subjects of the agent's bindings: one Group per agent.groups entry. */}}
{{- define "nodeward.agentSubjects" -}}
{{- range .Values.agent.groups }}
- apiGroup: rbac.authorization.k8s.io
  kind: Group
  name: {{ . }}
{{- end }}
{{- end }}

{{/*
The pod-level knobs both workloads share. Call with (dict "ctx" $ "part" .Values.scaler
"tolerations" LIST "affinity" DICT "spread" LIST "component" NAME): the part's own tolerations are
appended to the ones it always keeps; its affinity and spread replace the defaults given.
*/}}
{{- define "nodeward.podSpec" -}}
{{- $part := .part -}}
serviceAccountName: {{ $part.serviceAccount.name }}
{{- with $part.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- with $part.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($part.affinity | default .affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($part.topologySpreadConstraints | default .spread) }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
tolerations:
  {{- toYaml (concat .tolerations $part.tolerations) | nindent 2 }}
securityContext:
  {{- toYaml .ctx.Values.podSecurityContext | nindent 2 }}
{{- end }}

{{/* A container's image, security context, resources and extra env. */}}
{{- define "nodeward.container" -}}
image: {{ include "nodeward.image" .ctx }}
imagePullPolicy: {{ .ctx.Values.image.pullPolicy }}
securityContext:
  {{- toYaml .ctx.Values.securityContext | nindent 2 }}
resources:
  {{- toYaml .part.resources | nindent 2 }}
{{- end }}

{{/* The probes of a metrics port: /healthz (the loop turns) and /readyz. */}}
{{- define "nodeward.probes" -}}
ports:
  - name: metrics
    containerPort: {{ . }}
    protocol: TCP
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 20
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 10
{{- end }}

{{/* The scaler ConfigMap's data: the user's config, the values and the worker template (the shipped one by default, through .Files.Get: never templated by Helm). */}}
{{- define "nodeward.scalerConfig" -}}
config.toml: |
  {{- .Values.scaler.config | nindent 2 }}
scaler-values.toml: |
  {{- .Values.scaler.values | nindent 2 }}
worker.yaml.tera: |
  {{- .Values.scaler.workerTemplate | default (.Files.Get "files/worker.yaml.tera") | nindent 2 }}
{{- end }}
