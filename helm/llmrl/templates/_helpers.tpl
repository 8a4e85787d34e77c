{{/*
Names, labels, security contexts, quantities and the topology guard shared by every template.
*/}}

{{- define "llmrl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "llmrl.fullname" -}}
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

{{- define "llmrl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels; call with (dict "ctx" $ "component" "mlflow"). */}}
{{- define "llmrl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llmrl.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Standard labels; call with (dict "ctx" $ "component" "mlflow"). */}}
{{- define "llmrl.labels" -}}
{{ include "llmrl.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: llmrl
helm.sh/chart: {{ include "llmrl.chart" .ctx }}
{{- end }}

{{- define "llmrl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "llmrl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "llmrl.claimName" -}}
{{- default (printf "%s-shared" (include "llmrl.fullname" .)) .Values.storage.existingClaim }}
{{- end }}

{{- define "llmrl.configMapName" -}}
{{- printf "%s-topology" (include "llmrl.fullname" .) }}
{{- end }}

{{/* repository:tag of an image spec; call with (dict "ctx" $ "image" .Values.image). */}}
{{- define "llmrl.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{- define "llmrl.prefectApiUrl" -}}
{{- if .Values.prefect.apiUrl }}
{{- .Values.prefect.apiUrl }}
{{- else if .Values.prefect.server.enabled }}
{{- printf "http://%s-prefect-server.%s.svc:%d/api" (include "llmrl.fullname" .) .Release.Namespace (int .Values.prefect.server.port) }}
{{- else }}
{{- fail "prefect.apiUrl: set the Prefect API URL, or enable the in-chart server with prefect.server.enabled=true" }}
{{- end }}
{{- end }}

{{- define "llmrl.mlflowUri" -}}
{{- if .Values.mlflow.enabled }}
{{- printf "http://%s-mlflow.%s.svc:%d" (include "llmrl.fullname" .) .Release.Namespace (int .Values.mlflow.port) }}
{{- else }}
{{- required "mlflow.externalUri: the tracking URI of an external MLflow server is required when mlflow.enabled is false" .Values.mlflow.externalUri }}
{{- end }}
{{- end }}

{{/* The pipeline's `params` for a Kubernetes run on this release, as one-line JSON (NOTES).
The stage pods' settings come from kubernetes.yaml in the topology ConfigMap. */}}
{{- define "llmrl.runParams" -}}
{{- $params := dict "launcher" "kubernetes" "work_dir" (printf "%s/runs/pipeline" .Values.storage.mountPath) "mlflow_tracking_uri" (include "llmrl.mlflowUri" .) }}
{{- toJson $params }}
{{- end }}

{{/* Pod template metadata of a chart pod: its labels, then podLabels/podAnnotations (the
chart's own labels win: Deployments select pods by them). Call with (dict "ctx" $ "component" c). */}}
{{- define "llmrl.podMetadata" -}}
{{- $labels := merge (fromYaml (include "llmrl.labels" .)) (.ctx.Values.podLabels | default dict) }}
labels:
  {{- toYaml $labels | nindent 2 }}
{{- with .ctx.Values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Pod spec fields every pod of the chart shares: pull secrets, priority and runtime class. */}}
{{- define "llmrl.podSpecExtras" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- end }}

{{/*
The stage pods' launcher settings (flows.launchers.settings.KubernetesSettings), rendered
into kubernetes.yaml of the topology ConfigMap: every stage Job and RayJob of this release is
built from them. Each stage brings its own Ray cluster (a RayJob); the chart holds none.
*/}}
{{- define "llmrl.stageSettings" -}}
{{- $p := .Values.stagePods }}
{{- $roles := dict }}
{{- range $key := list "job" "driver" "head" "inference" "trainer" "colocated" "reference" "envWorkers" "teacher" "judge" "rewardModel" }}
{{- $role := get ($p.roles | default dict) $key | default dict }}
{{- $name := get (dict "envWorkers" "env-workers" "rewardModel" "reward-model") $key | default $key }}
{{- $env := concat ($p.env | default list) ($role.env | default list) }}
{{- $envFrom := concat ($p.envFrom | default list) ($role.envFrom | default list) }}
{{- $r := dict }}
{{- if $env }}{{ $_ := set $r "env" $env }}{{ end }}
{{- if $envFrom }}{{ $_ := set $r "env_from" $envFrom }}{{ end }}
{{- with $role.podLabels }}{{ $_ := set $r "labels" . }}{{ end }}
{{- with $role.podAnnotations }}{{ $_ := set $r "annotations" . }}{{ end }}
{{- if $r }}{{ $_ := set $roles $name $r }}{{ end }}
{{- end }}
{{- $jobs := dict }}
{{- range $stage, $job := $p.jobs }}
{{- $_ := set $jobs $stage (dict "cpus" $job.cpus "memory_gb" $job.memoryGb "gpus" $job.gpus) }}
{{- end }}
{{- $secrets := list }}
{{- range .Values.imagePullSecrets }}
{{- $secrets = append $secrets .name }}
{{- end }}
{{- $security := dict "runAsNonRoot" true "runAsUser" (int .Values.podSecurity.runAsUser) "runAsGroup" (int .Values.podSecurity.runAsGroup) "fsGroup" (int .Values.podSecurity.fsGroup) "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- $s := dict "namespace" .Release.Namespace "image" (include "llmrl.image" (dict "ctx" . "image" .Values.image)) "image_pull_policy" .Values.image.pullPolicy "image_pull_secrets" $secrets "topology" "/etc/llmrl/topology/topology.yaml" "shared_claim" (include "llmrl.claimName" .) "shared_mount_path" .Values.storage.mountPath "ttl_seconds_after_finished" (int $p.ttlSecondsAfterFinished) "ray_version" $p.rayVersion "head" (dict "cpus" $p.head.cpus "memory_gb" $p.head.memoryGb) "jobs" $jobs "shm_fraction" $p.shmFraction "security_context" $security "pod_labels" (.Values.podLabels | default dict) "pod_annotations" (.Values.podAnnotations | default dict) "roles" $roles }}
{{- with .Values.priorityClassName }}{{ $_ := set $s "priority_class_name" . }}{{ end }}
{{- with .Values.runtimeClassName }}{{ $_ := set $s "runtime_class_name" . }}{{ end }}
{{- with .Values.kueue.queueName }}{{ $_ := set $s "kueue_queue" . }}{{ end }}
{{- with .Values.huggingFace.tokenSecret }}
{{- if .name }}
{{- $_ := set $s "hf_token_secret" (dict "name" .name "key" (required "huggingFace.tokenSecret.key: the key of the token inside the Secret is required" .key)) }}
{{- end }}
{{- end }}
{{- toYaml $s }}
{{- end }}

{{/* Pod-level security context of every pod. */}}
{{- define "llmrl.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ int .Values.podSecurity.runAsUser }}
runAsGroup: {{ int .Values.podSecurity.runAsGroup }}
fsGroup: {{ int .Values.podSecurity.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container security context of every container (read-only root; /tmp is an emptyDir). */}}
{{- define "llmrl.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ int .Values.podSecurity.runAsUser }}
runAsGroup: {{ int .Values.podSecurity.runAsGroup }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* CPU cores (float) as a millicore quantity, e.g. 0.5 -> 500m. */}}
{{- define "llmrl.cpu" -}}
{{- printf "%dm" (int (floor (mulf . 1000.0))) }}
{{- end }}

{{/* GiB (float) as a MiB quantity, e.g. 2.5 -> 2560Mi. */}}
{{- define "llmrl.memory" -}}
{{- printf "%dMi" (int (floor (mulf . 1024.0))) }}
{{- end }}

{{/*
The derived topology values (llmrl.engineGpus, llmrl.trainerWorldSize) and the topology's guard
(llmrl.validateTopology) are in _topology_guard.tpl, generated from llmrl/topology/rules.py by
make chart-schema.
*/}}
