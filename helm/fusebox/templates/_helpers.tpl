{{/*
Names and labels shared by every template, and the operator's RBAC rules in
one place so the cluster-wide and the per-namespace modes cannot drift.
*/}}

{{- define "fusebox.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
The fullname and a suffix: (suffix, root). The fullname is cut so that the whole
fits a DNS label (63), as fullname itself does: a Job's name goes into its pods'
job-name label, so a longer one is refused, and a longer release name (Helm
allows 53) or fullnameOverride (63) must not fail the hooks of upgrade and uninstall.
*/}}
{{- define "fusebox.suffixedName" -}}
{{- $suffix := index . 0 -}}
{{- $base := include "fusebox.fullname" (index . 1) | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}

{{/*
The name of the release's ClusterRole and ClusterRoleBinding, given (suffix, root):
the fullname, the release's namespace and the suffix (none: ""). Two releases of
one name in two namespaces (two teams, each watching its own namespaces) then
hold one each, where one name would make helm refuse the second install (the
object belongs to the first release). Past 63 characters (the chart keeps every
name a DNS label) it is cut to 54 and ends with 8 hex of the whole name's
sha256, so two long names cut alike still differ.
*/}}
{{- define "fusebox.clusterScopedName" -}}
{{- $suffix := index . 0 -}}
{{- $root := index . 1 -}}
{{- $parts := list (include "fusebox.fullname" $root) $root.Release.Namespace -}}
{{- if $suffix -}}{{- $parts = append $parts $suffix -}}{{- end -}}
{{- $whole := join "-" $parts -}}
{{- if le (len $whole) 63 -}}
{{- $whole -}}
{{- else -}}
{{- printf "%s-%s" ($whole | trunc 54 | trimSuffix "-") (sha256sum $whole | trunc 8) -}}
{{- end -}}
{{- end -}}

{{- define "fusebox.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fusebox.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The labels the operator's NetworkPolicies trust: keep in step with FUSEBOX_OPERATOR_POD_SELECTOR. */}}
{{- define "fusebox.selectorLabels" -}}
app.kubernetes.io/name: fusebox-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fusebox.labels" -}}
{{ include "fusebox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fusebox
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* repository@digest when a digest pins the image, else repository:tag. */}}
{{- define "fusebox.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}
{{- end -}}

{{/* An alert's labels: its severity, then alertLabels, which may replace the severity. */}}
{{- define "fusebox.alertLabels" -}}
{{- $severity := index . 0 -}}
{{- $root := index . 1 -}}
{{- toYaml (mergeOverwrite (dict "severity" $severity) $root.Values.monitoring.prometheusRule.alertLabels) -}}
{{- end -}}

{{- define "fusebox.podSelector" -}}
app.kubernetes.io/name=fusebox-operator,app.kubernetes.io/instance={{ .Release.Name }}
{{- end -}}

{{/*
"true" when watchNamespaces holds a kopf glob (`*` or `?`, e.g. "e2e-*"): the
namespaces are not known at install time, so no Role can be made in each and
the rules are granted cluster-wide (kopf still acts only in matching ones).
*/}}
{{- define "fusebox.watchesPatterns" -}}
{{- range .Values.watchNamespaces -}}
{{- if or (contains "*" .) (contains "?" .) -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* Namespaced RBAC: a Role in each watched namespace, named exactly. */}}
{{- define "fusebox.namespacedRbac" -}}
{{- if and .Values.watchNamespaces (not (include "fusebox.watchesPatterns" .)) -}}true{{- end -}}
{{- end -}}

{{/* The kopf peering name: per release by default, so two releases never pause each other. */}}
{{- define "fusebox.peeringName" -}}
{{- default (include "fusebox.fullname" .) .Values.peering.name -}}
{{- end -}}

{{/*
Fails when the peering name is one of FUSEBOX_PEERING's keywords (settings.py),
which the operator reads as a mode, not a name: "standalone" runs every pod
unpeered, and "auto" runs one replica unpeered and several through a peering
named "fusebox", which the chart never creates. An explicit peering.name is
refused even where it is unused (a namespace glob, standalone), so that a later
change of watchNamespaces is not what fails.
*/}}
{{- define "fusebox.checkPeeringName" -}}
{{- $name := include "fusebox.peeringName" . -}}
{{- $used := or .Values.peering.name (not (include "fusebox.standalone" .)) -}}
{{- if and $used (has $name (list "auto" "standalone")) -}}
{{- $source := ternary "peering.name %q" "fullnameOverride %q (the peering name while peering.name is empty)" (not (empty .Values.peering.name)) -}}
{{- $effect := ternary "runs every pod without peering, so two pods (replicas, or the old and the new one of a rollout) would act on every service at once" "runs one replica without peering (the old and the new pod of a rollout would act at once) and several through a peering named \"fusebox\", which the chart does not create, so no replica would ever act" (eq $name "standalone") -}}
{{- fail (printf "%s is a keyword of the operator's FUSEBOX_PEERING, not a peering name: the operator %s; set peering.name to another name, or leave it empty for the release's fullname" (printf $source $name) $effect) -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the operator runs without kopf peering: only with a namespace glob
in watchNamespaces, where no KopfPeering can be made in namespaces not known yet
(and replicaCount must stay 1). Every other release peers, one replica included:
every pod of the release, through any rollout or change of replicaCount, is then
a peer of the others, so a new pod pauses for the acting one or makes it pause,
and never two act at once (docs/decisions/operator-rollouts.md).
*/}}
{{- define "fusebox.standalone" -}}
{{- if include "fusebox.watchesPatterns" . -}}true{{- end -}}
{{- end -}}

{{/* "true" with more than one operator replica: a standby to keep through a drain, and to spread. */}}
{{- define "fusebox.severalReplicas" -}}
{{- if gt (int .Values.replicaCount) 1 -}}true{{- end -}}
{{- end -}}

{{/*
"true" when the operator Deployment must roll with Recreate (every old pod gone
before a new one starts), given (running, root): running is the Deployment as
the cluster holds it now (lookup; empty at install and under `helm template`).
The new pods may start beside the running ones only where both peer through one
kopf peering object, which makes one of them pause. They would not see each
other, and both act, where this release runs standalone (a namespace glob), or
the running pods do (FUSEBOX_PEERING=standalone: one replica of a chart before
peering at every replica count), or they peer under another name, or through
the other kind of peering object (ClusterKopfPeering when watching every
namespace, a KopfPeering in each named one).
*/}}
{{- define "fusebox.recreate" -}}
{{- $running := index . 0 -}}
{{- $root := index . 1 -}}
{{- $env := dict -}}
{{- range (dig "spec" "template" "spec" "containers" list $running) -}}
{{- if eq (dig "name" "" .) "operator" -}}
{{- range (dig "env" list .) -}}
{{- $_ := set $env (dig "name" "" .) (dig "value" "" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if include "fusebox.standalone" $root -}}
true
{{- else if hasKey $env "FUSEBOX_PEERING" -}}
{{- $samePeering := eq (get $env "FUSEBOX_PEERING") (include "fusebox.peeringName" $root) -}}
{{- $sameKind := eq (empty (get $env "FUSEBOX_WATCH_NAMESPACES")) (empty $root.Values.watchNamespaces) -}}
{{- if not (and $samePeering $sameKind) -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Rules on namespaced resources: a ClusterRole's in cluster-wide mode, a Role's
in each watched namespace otherwise. Together with fusebox.rules.cluster they
equal, at the defaults (every namespace, one replica, peering),
operator/rbac/clusterrole.yaml (a unit test compares them). Only the verbs the
code sends: children are created, merge-patched and, Deployments only,
replaced (kube.py); kopf patches the status and POSTs core/v1 Events.
*/}}
{{- define "fusebox.rules.namespaced" -}}
- apiGroups: [fusebox.dev]
  resources: [inferenceservices]
  verbs: [get, list, watch, patch]
- apiGroups: [fusebox.dev]
  resources: [inferenceservices/status]
  verbs: [get, patch]
{{- if and (not (include "fusebox.standalone" .)) .Values.watchNamespaces }}
# Watching named namespaces, the operator peers through a KopfPeering in each.
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, update, patch]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch]
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [pods/resize]
  verbs: [patch]
# Events: POSTed (kopf), and listed only when a successor finds an action its
# predecessor ran, to tell it unless an Event already does (Kube.actions_told).
- apiGroups: [""]
  resources: [events]
  verbs: [create, list]
{{- end -}}

{{/* Rules on cluster-scoped resources: always a ClusterRole (a Role cannot grant them). */}}
{{- define "fusebox.rules.cluster" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
{{- if and (not (include "fusebox.standalone" .)) (not .Values.watchNamespaces) }}
# Watching every namespace, the operator peers through a ClusterKopfPeering.
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- if .Values.watchNamespaces }}
# kopf lists and watches namespaces to find the watched ones (not when cluster-wide).
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
{{- end }}
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list]
{{- end -}}

{{/* An alert's runbook: runbookBaseUrl, then the section's anchor, the alert's name in
lower case (how GitHub spells the anchor of a "### FuseboxBreakerOpen" heading). */}}
{{- define "fusebox.runbookUrl" -}}
{{- printf "%s#%s" (index . 1).Values.monitoring.prometheusRule.runbookBaseUrl (lower (index . 0)) -}}
{{- end -}}

{{/* Per namespace and service (the PodMonitor's labels), the share of requests that
failed (5xx), were refused (429, 503) or timed out (504) over a window: (window, root). */}}
{{- define "fusebox.errorRatio" -}}
{{- $window := index . 0 -}}
sum by (namespace, service) (rate(fusebox_requests_total{outcome=~"failed|rejected|timed_out"}[{{ $window }}])) / sum by (namespace, service) (rate(fusebox_requests_total[{{ $window }}]))
{{- end -}}

{{/*
The latency histograms slo.latency.metric may name (as JSON): each one's series
name and its finite bucket bounds as the sidecar writes the `le` label (Python's
str of the float: "1.0", "0.25"). A copy of fusebox_contract.metrics'
LatencyHistogram buckets, which the chart cannot import; a unit test keeps
them equal.
*/}}
{{- define "fusebox.latencyHistograms" -}}
{{- toJson (dict
  "ttft" (dict "name" "fusebox_time_to_first_token_seconds" "bounds" (list "0.005" "0.01" "0.025" "0.05" "0.075" "0.1" "0.15" "0.2" "0.25" "0.3" "0.4" "0.5" "0.75" "1.0" "2.5" "5.0" "10.0" "20.0" "60.0"))
  "itl" (dict "name" "fusebox_inter_token_latency_seconds" "bounds" (list "0.001" "0.0025" "0.005" "0.01" "0.02" "0.03" "0.04" "0.05" "0.075" "0.1" "0.15" "0.2" "0.3" "0.5" "0.75" "1.0" "2.5"))
  "e2e" (dict "name" "fusebox_e2e_request_latency_seconds" "bounds" (list "0.1" "0.25" "0.5" "1.0" "2.0" "3.0" "5.0" "7.5" "10.0" "15.0" "20.0" "30.0" "45.0" "60.0" "120.0" "300.0"))
  "queue" (dict "name" "fusebox_request_queue_time_seconds" "bounds" (list "0.001" "0.005" "0.01" "0.025" "0.05" "0.1" "0.25" "0.5" "1.0" "2.5" "5.0" "10.0" "20.0" "30.0" "60.0"))
) -}}
{{- end -}}

{{/*
Fails unless slo.latency.thresholdSeconds is exactly one of the chosen
histogram's `le` labels: any other string ("1.5", "1.00", "1") selects no
series, and the latency alerts could never fire.
*/}}
{{- define "fusebox.checkLatencyThreshold" -}}
{{- $latency := .Values.monitoring.prometheusRule.slo.latency -}}
{{- $histogram := get (include "fusebox.latencyHistograms" . | fromJson) $latency.metric -}}
{{- $threshold := toString $latency.thresholdSeconds -}}
{{- if not (has $threshold $histogram.bounds) -}}
{{- fail (printf "monitoring.prometheusRule.slo.latency.thresholdSeconds %q is not a bucket bound of the %s histogram (%s), so the latency alerts could never fire; use one of: %s" $threshold $latency.metric $histogram.name (join ", " $histogram.bounds)) -}}
{{- end -}}
{{- end -}}

{{/* Per namespace and service, the share of requests slower than the latency SLO's
threshold (a bucket bound of the chosen histogram) over a window: (window, root). */}}
{{- define "fusebox.slowRatio" -}}
{{- $window := index . 0 -}}
{{- $root := index . 1 -}}
{{- $latency := $root.Values.monitoring.prometheusRule.slo.latency -}}
{{- $histogram := (get (include "fusebox.latencyHistograms" $root | fromJson) $latency.metric).name -}}
1 - sum by (namespace, service) (rate({{ $histogram }}_bucket{le="{{ $latency.thresholdSeconds }}"}[{{ $window }}])) / sum by (namespace, service) (rate({{ $histogram }}_count[{{ $window }}]))
{{- end -}}

{{/* A multi-window burn-rate condition (the SRE workbook's): (ratio template, root,
objective, [burn, long window, short window] ...). Fires while both windows of a
pair burn the error budget (1 - objective) at least `burn` times too fast. */}}
{{- define "fusebox.burn" -}}
{{- $ratio := index . 0 -}}
{{- $root := index . 1 -}}
{{- $objective := index . 2 -}}
{{- range $index, $pair := slice . 3 -}}
{{- if $index }}
or
{{ end -}}
(
  ({{ include $ratio (list (index $pair 1) $root) }}) > ({{ index $pair 0 }} * (1 - {{ $objective }}))
and
  ({{ include $ratio (list (index $pair 2) $root) }}) > ({{ index $pair 0 }} * (1 - {{ $objective }}))
)
{{- end -}}
{{- end -}}

{{/*
The chart's Helm hooks (templates/hooks-*.yaml): Jobs that run the operator's
image with `python -m fusebox_operator.chart_hooks`, each with its own
ServiceAccount, RBAC and NetworkPolicy, all hooks themselves so they exist only
while the Job runs. Labels: never the operator's selector labels, so the
operator's Service, PDB and NetworkPolicy never select a hook's pod.
*/}}
{{- define "fusebox.hookSelectorLabels" -}}
{{- $component := index . 0 -}}
{{- $root := index . 1 -}}
app.kubernetes.io/name: fusebox-chart-hook
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ $component }}
{{- end -}}

{{/*
A hook object's metadata lines after its name: (component, event, weight, root)
and, for a Job, "job": helm then prints the Job's pod logs when it fails, so
the reason (a refused CRD, the services left) is in helm's own output.
*/}}
{{- define "fusebox.hookMetadata" -}}
{{- $component := index . 0 -}}
{{- $root := index . 3 -}}
labels:
  {{- include "fusebox.labels" $root | nindent 2 }}
  app.kubernetes.io/component: {{ $component }}
annotations:
  helm.sh/hook: {{ index . 1 }}
  helm.sh/hook-weight: {{ index . 2 | quote }}
  helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
  {{- if and (gt (len .) 4) (eq (index . 4) "job") }}
  helm.sh/hook-output-log-policy: hook-failed
  {{- end }}
{{- end -}}

{{/*
The names of the CRDs in the chart's crds/ (as JSON): the upgrade hook's role may
get and patch these, and nothing else.
*/}}
{{- define "fusebox.chartCrdNames" -}}
{{- $names := list -}}
{{- range $path, $_ := .Files.Glob "crds/*.yaml" -}}
{{- range $document := regexSplit "(?m)^---[ \\t]*$" ($.Files.Get $path) -1 -}}
{{- $crd := fromYaml $document -}}
{{- if eq (toString (get $crd "kind")) "CustomResourceDefinition" -}}
{{- $names = append $names $crd.metadata.name -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/* A hook Job's NetworkPolicy: no ingress; egress to the API server and DNS only. (component, event, root) */}}
{{- define "fusebox.hookNetworkPolicy" -}}
{{- $component := index . 0 -}}
{{- $root := index . 2 -}}
{{- $np := $root.Values.networkPolicy -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "fusebox.suffixedName" (list $component $root) }}
  namespace: {{ $root.Release.Namespace }}
  {{- include "fusebox.hookMetadata" (list $component (index . 1) "-10" $root) | nindent 2 }}
spec:
  podSelector:
    matchLabels:
      {{- include "fusebox.hookSelectorLabels" (list $component $root) | nindent 6 }}
  policyTypes: [Ingress, Egress]
  egress:
    - ports:
        {{- range $np.apiServer.ports }}
        - port: {{ . }}
          protocol: TCP
        {{- end }}
      {{- with $np.apiServer.cidrs }}
      to:
        {{- range . }}
        - ipBlock:
            cidr: {{ . }}
        {{- end }}
      {{- end }}
    {{- with $np.dnsPorts }}
    - ports:
        {{- range . }}
        - port: {{ . }}
          protocol: UDP
        - port: {{ . }}
          protocol: TCP
        {{- end }}
    {{- end }}
{{- end -}}

{{/*
A hook Job's pod settings shared by every hook: its ServiceAccount, the
operator's pull secrets, restricted Pod Security (the operator's own contexts,
which the schema holds to the restricted standard) and the operator's node
placement: priorityClassName, nodeSelector, tolerations and affinity's
nodeAffinity, so a hook runs on the nodes the operator may run on. Not the pod
(anti-)affinity terms nor topologySpreadConstraints: they place the operator's
replicas relative to each other, and a required anti-affinity to the operator
pods could leave a one-node cluster no node for the hook. (component, root)
*/}}
{{- define "fusebox.hookPodSpec" -}}
{{- $component := index . 0 -}}
{{- $root := index . 1 -}}
serviceAccountName: {{ include "fusebox.suffixedName" (list $component $root) }}
automountServiceAccountToken: true
restartPolicy: Never
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
{{- with $root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- /* affinity may be absent (null, rendered with --skip-schema-validation) or hold only pod terms: get, not .affinity.nodeAffinity. */}}
{{- with get (default (dict) $root.Values.affinity) "nodeAffinity" }}
affinity:
  nodeAffinity:
    {{- toYaml . | nindent 4 }}
{{- end }}
{{- end -}}

{{/* A hook container's fixed parts: the operator's image, the hook module, small bounded resources. (root) */}}
{{- define "fusebox.hookContainer" -}}
image: {{ include "fusebox.image" . | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
command: [/opt/venv/bin/python, -m, fusebox_operator.chart_hooks]
env:
  - name: HOME
    value: /tmp
# The hook's last log lines become the pod's termination message
# (`kubectl describe pod`), so the reason survives the log.
terminationMessagePolicy: FallbackToLogsOnError
resources:
  requests:
    cpu: 50m
    memory: 128Mi
    ephemeral-storage: 32Mi
  limits:
    cpu: 500m
    memory: 256Mi
    ephemeral-storage: 32Mi
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
{{- end -}}
